// The CUDA backend's MoE ops (core/model/moe_experts.h) over kernels/cuda, which the one MoE layer
// (core/model/moe_layer.h) runs: route, dispatch, experts, combine and back over device buffers.
// fp32 mode runs every op in fp32 (the twin of the CPU ops); bf16 mode runs the routed and shared
// experts as bf16 GEMMs with fp32 accumulation on the model's bf16 weight copy, with bf16 expert
// activations, and writes the weight gradients straight into the fp32 master gradients (router,
// routing, gates and the layer's output stay fp32). Only included by CUDA builds.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "core/config.h"
#include "core/cuda_profiler.h"
#include "core/model/backend_memory.h"
#include "core/model/moe.h"
#include "core/model/moe_experts.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/moe_experts.h"
#include "kernels/cuda/moe_experts_cudnn.h"

namespace moelab::cudamodel {

// What the MoE ops need of the CUDA backend (core/model/cuda_backend.cc): the bf16 compute copy
// of a weight (bf16 mode) and the op profiler (null: off).
class CudaMoeHost {
 public:
  virtual const cuda::bf16* Bf16Of(const float* w) const = 0;
  virtual CudaOpProfiler* profiler() const = 0;

 protected:
  ~CudaMoeHost() = default;
};

// One MoE layer's weights (device pointers into the model's arenas). The *b pointers are the same
// offsets in the bf16 compute copy (bf16 mode only, else null); s* are null without shared
// experts.
struct MoeLayerParams {
  const float *router = nullptr, *w1 = nullptr, *w3 = nullptr, *w2 = nullptr;
  const float *s1 = nullptr, *s3 = nullptr, *s2 = nullptr;
  const cuda::bf16 *w1b = nullptr, *w3b = nullptr, *w2b = nullptr;
  const cuda::bf16 *s1b = nullptr, *s3b = nullptr, *s2b = nullptr;
};
// Their fp32 gradients (overwritten by Backward).
struct MoeLayerGrads {
  float *router = nullptr, *w1 = nullptr, *w3 = nullptr, *w2 = nullptr;
  float *s1 = nullptr, *s3 = nullptr, *s2 = nullptr;
};

// Buffers every MoE layer uses only inside its own forward or backward (router logits, then
// their gradient; gate gradients; expert input gradients; the extra shared experts' sums (fp32
// mode); the bf16 casts of the layer input and output gradient (bf16 mode); the SwiGLU backward
// scratch): one set per model, sized for the largest micro-batch.
struct MoeScratch {
  cuda::DeviceBuffer<float> logits, dgates, dxe, sy, scratch;
  // yp16: the chunked experts' output, then output gradient, then input gradient (bf16 mode).
  // xe16: the chunked layout's gathered inputs, for every layer in turn (SharedExpertInputs).
  cuda::DeviceBuffer<cuda::bf16> dxe16, scratch16, xb16, dyb16, yp16, xe16;
  int cap = 0;
  bool chunked = false;        // sized for the chunked expert layout (MoePaddedRows) when reserved
  bool shared_inputs = false;  // xe16 reserved
  // Bytes for `rows` tokens; Reserve and the memory plan (PlanCudaMemory) share this arithmetic.
  static size_t Bytes(const MoEConfig& e, int d, size_t rows, bool bf16, bool shared_xe);
  void Reserve(const MoEConfig& e, int d, int rows, bool bf16, bool shared_xe);
};

// Whether the layers share one buffer of gathered expert inputs and gather them again in their
// backward instead of keeping them (nk·d bf16 a layer, plus the chunks' padding): with the chunked
// layout or the cuDNN experts (train.kernels.experts "chunked" or "cudnn"), bf16, without expert
// parallelism (whose owners keep the rows they receive). The memory plan and the layers decide it
// with this one function.
bool SharedExpertInputs(bool bf16, bool expert_parallel);

// The activations a layer keeps for its backward, in the expert precision T (float or bf16).
// Under expert parallelism the routed experts' h1, h3, act belong to the owned rows instead
// (MoeOwnedRows), so routed_acts is false and they stay empty.
// padded: rows for the chunked expert layout (MoePaddedRows; 0: none), which xe, h1, h3, act then
// hold instead of the nk compact rows. paired_shared: the shared experts run on
// cuda::GatedFfn*Bf16 (train.kernels.ffn "fused"): sh1 holds h13 [n, 2H] per shared expert, sh3
// nothing (the same bytes).
template <typename T>
struct MoeExpertActs {
  cuda::DeviceBuffer<T> xe, ye, h1, h3, act, sh1, sh3, sact;
  void Resize(size_t nk, size_t n, int d, int hidden, int shared, bool routed_acts,
              size_t padded = 0, bool paired_shared = false, bool keep_xe = true);
};

// train.kernels.experts (cuda::SelectedKernels, installed by the CUDA backend): "grouped" (the
// default: cuBLAS's grouped GEMMs on the compact rows, the
// path that ran on a GPU), "chunked" (batched GEMMs over the chunked layout in bf16 mode without
// EP) or "cudnn" (cuDNN's MoE grouped matmul for the forward's products on the compact rows in
// bf16 mode without EP, with no host sync in the layer's forward; the backward is the grouped
// GEMMs': kernels/cuda/moe_experts_cudnn.h). The last two have not yet
// run on a GPU.
bool ChunkedExpertsWanted();
bool CudnnExpertsWanted();
// The rows xe, h1, h3, act hold for nk dispatched rows over E experts: with chunks, at most nk plus
// one chunk of padding per expert (≤ nk/4 + 8E, kernels/cuda/moe_experts.h); else nk.
size_t MoePaddedRows(size_t nk, int experts);

// Expert parallelism: the rows this rank receives for the experts it owns (inputs, outputs then
// output gradients, input gradients), their routed activations and backward scratch. Their
// number changes every step with the routing: the buffers grow (with slack) and never shrink.
template <typename T>
struct MoeOwnedRows {
  cuda::DeviceBuffer<T> x, y, dx, h1, h3, act, scratch;
  size_t capacity = 0;  // rows
  void Reserve(size_t rows, int d, int hidden);
};

// The cuDNN experts of one shape, shared by every layer of that shape on this thread (the layers'
// products are the same shapes, and the cuDNN handle is the thread's): each builds its execution
// plans at its first run, compiling their kernels with NVRTC (≈ 0.3–0.5 s a plan), so a 15-layer
// model builds 2 plans instead of 30. Runs are stream-ordered, so the layers can share the plans'
// workspace. Held weakly here: the last layer that holds it frees it, before the process ends.
std::shared_ptr<cuda::MoeExpertsCudnn> SharedCudnnExperts(int experts, int64_t rows, int d,
                                                          int hidden);

// The MoE ops of one layer on the device (core/model/moe_experts.h): its routing, dispatch plan,
// expert activations and the experts-path choice (train.kernels.experts: grouped, chunked or
// cuDNN).
class DeviceMoe final : public MoeExperts<float> {
 public:
  ~DeviceMoe() override;
  // host: the CUDA backend (bf16 weights, profiler). memory: its memory (the exchange's
  // buffers). expert_first / expert_count: the routed experts whose weights this rank holds
  // (all: 0, E); fewer only under expert parallelism, as this rank's block of the EP group.
  DeviceMoe(const ModelConfig& m, const MoEConfig& e, bool bf16, MoeScratch* scratch,
            const CudaMoeHost* host, int expert_first, int expert_count);

  // Bytes one layer keeps for `rows` tokens (Reserve and the memory plan agree); shared_xe:
  // SharedExpertInputs.
  static size_t Bytes(const MoEConfig& e, int d, size_t rows, bool bf16, bool shared_xe);
  // What expert parallelism adds to Bytes for `owned` received rows: the owned rows
  // (MoeOwnedRows, with their slack) and the exchange buffer, less the local routed activations
  // the layer then does not keep. The plan takes owned = n·k (balanced routing).
  static double OwnedBytes(const MoEConfig& e, int d, double owned, bool bf16);

  void Reserve(int rows, bool expert_parallel) override;
  void Route(const float* router, const float* bias, const float* x, int n,
             int64_t* counts_out) override;
  // Two small device-to-host copies (counts, score sums).
  void AuxStatistics(int64_t* counts, double* score_sums) override;
  double LocalAuxLoss(const MoeShape& shape, int n) override;
  void SetAuxCounts(const int64_t* batch_counts) override;
  const int64_t* Dispatch(const float* x) override;
  MoeRowBuffers LocalRows() override;
  MoeRowBuffers OwnedRows(int64_t rows) override;
  void ExpertsForward(const MoeWeights<float>& w, const float* x, const MoeRoutedRows& rows,
                      float* y) override;
  void Combine(float* y) override;
  void CombineBackward(const float* dy) override;
  void RouteBackward(double aux_coef) override;
  void ExpertsBackward(const MoeWeights<float>& w, const MoeWeights<float>& g, const float* x,
                       const float* dy, const MoeRoutedRows& rows, float* dx) override;
  void DispatchBackward(const float* router, float* dx) override;
  size_t workspace_bytes() const override { return 0; }  // in the memory plan (Bytes)

 private:
  template <typename F>
  auto InMode(F&& f);
  // The weights' device pointers, with their bf16 copies in bf16 mode.
  MoeLayerParams Params(const MoeWeights<float>& w) const;
  MoeLayerGrads Grads(const MoeWeights<float>& g) const;
  void SharedForwardBf16(const MoeLayerParams& p, const cuda::bf16* xb, float* y);
  // The routed experts on this rank's dispatched rows, or under expert parallelism on the rows
  // received for its experts (rows.owned).
  template <typename T>
  void RoutedForward(MoeExpertActs<T>& a, MoeOwnedRows<T>& o, const MoeRoutedRows& rows,
                     const T* xe, const T* w1, const T* w3, const T* w2);
  // dye (in a.ye, or the owned rows' y) → dxe; the held experts' weight gradients (fp32)
  // overwritten.
  template <typename T>
  void RoutedBackward(MoeExpertActs<T>& a, MoeOwnedRows<T>& o, const MoeRoutedRows& rows,
                      const T* xe, const T* w1, const T* w3, const T* w2, const MoeLayerGrads& g,
                      T* dxe, T* scratch);
  void ExpertsBackwardBf16(const MoeLayerParams& p, const MoeLayerGrads& g, const float* x,
                           const float* dy, const MoeRoutedRows& rows, float* dx);
  // Whether this forward's routed experts run over the chunked layout (bf16 mode, no EP,
  // train.kernels.experts "chunked"), or on cuDNN (bf16 mode, no EP, "cudnn"); else
  // the grouped GEMMs.
  bool UseChunks() const;
  bool UseCudnn() const;
  // Whether this forward's routed experts run on the device-shaped grouped GEMM (bf16 mode, no
  // EP, train.kernels.experts "device"): it reads the dispatch plan's offsets on the device, so
  // the layer copies nothing to the host (the counts for the caller go through Staging).
  bool UseDeviceExperts() const;
  void* DeviceWorkspace();  // device_workspace_, grown to the layer's need
  // The cuDNN path's forward: the counts for the caller and the offsets for the backward (on the
  // grouped GEMMs, which need them on the host) go to pinned memory behind the dispatch plan,
  // without a host sync (Staging).
  void StageCounts(int64_t* counts_out);
  void StageOffsets();
  void CudnnForward(const MoeLayerParams& p);
  // The staged offsets into host_offsets_, for the backward's grouped GEMMs.
  void ReadStagedOffsets();
  // The routed experts over the chunked layout (bf16): a.xe holds it (gathered there), outputs
  // unchunked into a.ye; the backward chunks dye and unchunks dxe into dxe16.
  void ChunkedForward(const MoeLayerParams& p);
  void ChunkedBackward(const MoeLayerParams& p, const MoeLayerGrads& g);
  void SharedBackwardBf16(const MoeLayerParams& p, const MoeLayerGrads& g, const cuda::bf16* xb,
                          const cuda::bf16* dyb, float* dx);

  MoeShape shape_;
  bool bf16_;
  const CudaMoeHost* host_;
  bool ep_ = false;              // the routed experts run on owned rows (Reserve's expert_parallel)
  bool chunked_ = false;         // the last Forward ran the chunked layout
  bool chunk_room_ = false;      // the buffers were reserved for it (train.kernels.experts then)
  bool cudnn_ = false;           // the last Forward ran the experts on cuDNN
  bool device_experts_ = false;  // the last Forward ran them on the device-shaped grouped GEMM
  cuda::DeviceBuffer<unsigned char> device_workspace_;  // its problems and tile prefix
  struct Staging;  // the cuDNN path's pinned copies, events and products
  std::unique_ptr<Staging> staging_;
  Staging& Staged();   // staging_, made at its first use
  bool gated_shared_;  // bf16 shared experts on cuda::GatedFfn*Bf16 (train.kernels.ffn "fused")
  bool shared_xe_ = false;  // SharedExpertInputs, decided at the first Reserve
  // The bf16 gathered expert inputs: this layer's (b16_.xe), or the shared scratch's.
  cuda::bf16* XeBf16();
  cuda::MoeChunks chunks_;  // its plan (host), and its table on the device
  cuda::DeviceBuffer<int64_t> chunk_table_;
  bool batch_counts_ = false;                     // the route backward reads batch_counts_dev_
  cuda::DeviceBuffer<int64_t> batch_counts_dev_;  // [E] the batch's counts (SetAuxCounts)
  int n_ = 0, cap_ = 0;
  MoEConfig cfg_;
  MoeScratch* tmp_;
  cuda::DeviceBuffer<float> scores_, gates_;
  cuda::DeviceBuffer<int> topk_, row_token_, slot_row_;
  cuda::DeviceBuffer<int64_t> counts_, offsets_;
  MoeExpertActs<float> f32_;       // fp32 mode
  MoeExpertActs<cuda::bf16> b16_;  // bf16 mode
  MoeOwnedRows<float> f32_owned_;
  MoeOwnedRows<cuda::bf16> b16_owned_;
  std::vector<int64_t> host_offsets_;
};

}  // namespace moelab::cudamodel
