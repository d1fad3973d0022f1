// The model of core/model/model.h over device arenas (train.device "cuda", docs/cuda.md): the
// same parameter layout (ParamInfo offsets) and initial values as Model<float>, so checkpoints
// and QK-Clip plans are shared with the CPU; fp32 master parameters and gradients on the GPU; a
// bf16 copy of the parameters for compute when the precision is bf16 (fp32 accumulation, losses
// and S_max in fp32); activations in one device arena.
//
// The forward/backward is model.cc's walk over the kernels/cuda twins. Unverified: it has never
// run on a GPU (tests/cuda_model/cuda_model_test.cc are its twin tests).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/config.h"
#include "core/cuda_profiler.h"
#include "core/model/model.h"

namespace moelab {

// Device memory of a CUDA run on one rank, from the config alone (no GPU needed): what CudaModel,
// the micro-batch gradient accumulator and the CUDA optimizer allocate, in bytes.
struct DeviceMemoryPlan {
  int micro_batch = 0;     // sequences per forward/backward
  double params = 0;       // fp32 masters + the bf16 compute copy
  double grads = 0;        // fp32 gradients + the accumulator when the batch is split
  double optimizer = 0;    // state (AdamW m, v; Muon momentum) + Newton–Schulz workspace
  double activations = 0;  // activation arena, MoE layers and scratch, casts, token buffers
  double runtime = 0;      // allowance for the CUDA context and cuBLAS workspaces
  double total() const { return params + grads + optimizer + activations + runtime; }
  std::string Describe() const;  // "params 1.2 GiB, grads ..., total 9.9 GiB"
};

// micro_batch: sequences per forward/backward; local_batch: the rank's sequences per step.
// Throws std::runtime_error in a build without CUDA.
DeviceMemoryPlan PlanCudaMemory(const RunConfig& config, int micro_batch, int local_batch);
// The largest micro-batch (<= local_batch) whose plan fits in budget_bytes; 0 when none does.
int LargestFittingMicroBatch(const RunConfig& config, int local_batch, double budget_bytes);

// Checks the plan at train.micro_batch against device 0's free memory before a run starts;
// prints it to stderr when print is set. Throws DeviceError naming the numbers and the largest
// micro-batch that fits when it does not.
void RequireCudaMemory(const RunConfig& config, int local_batch, bool print);

// The device twin of HostGradAccumulator (core/train/micro_batch.h): sum_i w_i·g_i in a device
// buffer of n floats, allocated on first use.
class DeviceGradAccumulator {
 public:
  explicit DeviceGradAccumulator(size_t n) : n_(n) {}
  ~DeviceGradAccumulator();
  DeviceGradAccumulator(const DeviceGradAccumulator&) = delete;
  DeviceGradAccumulator& operator=(const DeviceGradAccumulator&) = delete;
  void Add(const float* device_grads, double w, bool first);
  void Finish(float* device_grads, double w);

 private:
  size_t n_;
  float* buf_ = nullptr;
};

class CudaModel {
 public:
  // Allocates the device arenas; precision from config.train.effective_precision(). Throws
  // std::runtime_error without a usable GPU or in a build without CUDA.
  explicit CudaModel(const RunConfig& config);
  ~CudaModel();
  CudaModel(const CudaModel&) = delete;
  CudaModel& operator=(const CudaModel&) = delete;

  // Whether this build has the device forward/backward (true in every CUDA build); `why` gets
  // the reason when not.
  static bool ForwardBackwardAvailable(std::string* why);

  // The values of Model<float>::Init(seed), computed on the host and uploaded.
  void Init(uint64_t seed);
  const std::vector<ParamInfo>& param_infos() const;
  size_t num_params() const;
  bool bf16() const;
  float* params();  // device fp32 masters
  float* grads();   // device fp32 gradients
  void DownloadParams(float* host) const;
  void UploadParams(const float* host);
  // Host copy of the aux-loss-free selection biases [moe_layers * experts] (checkpointed);
  // UploadRouterBias() after changing it.
  std::vector<float>& router_bias();
  void UploadRouterBias();
  int moe_layers() const;

  // tokens on the host: [B, seq_len + 1]. As Model<float>: returns the objective and overwrites
  // grads(); stats (host) filled with fp32 loss, S_max per (layer, head), expert counts.
  double ForwardBackward(const int32_t* tokens, int batch, StepStats* stats);
  double Forward(const int32_t* tokens, int batch, StepStats* stats);
  void UpdateRouterBias(const std::vector<int64_t>& counts, double rate);
  // After the optimizer or QK-Clip changed the masters: refresh the bf16 compute copy.
  void ParamsChanged();
  // Per-op-class CUDA-event brackets (null: off).
  void set_profiler(CudaOpProfiler* profiler);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace moelab
