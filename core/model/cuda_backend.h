// The CUDA backend of core/model/backend.h (train.device "cuda", docs/cuda.md): device memory,
// kernels/cuda ops, the device MoE ops (core/model/cuda_moe.h); fp32 master parameters and
// gradients, a bf16 copy of the weights for compute when train.precision is bf16 (fp32
// accumulation, losses and S_max in fp32); the fused attention (LSE kept, S_max from its running
// row max) wherever it covers the shape. Built in every build; without CUDA, MakeCudaBackend and
// the memory plan throw.
//
// This header: the device memory plan, which needs no GPU.
#pragma once

#include <string>

#include "core/config.h"

namespace moelab {

// Device memory of a CUDA run on one rank, from the config alone (no GPU needed): what the model,
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

// What the CUDA backend cannot run, as a ConfigError naming the JSON path (checked before a run
// starts): several ranks in a build without NCCL, and expert parallelism in bf16 with an odd
// d_model. world: ranks. No-op off "cuda".
void RequireCudaSupports(const RunConfig& config, int world, int expert_parallel);

// Checks the plan at train.micro_batch against device 0's free memory before a run starts;
// prints it to stderr when print is set. Throws DeviceError naming the numbers and the largest
// micro-batch that fits when it does not.
void RequireCudaMemory(const RunConfig& config, int local_batch, bool print);

}  // namespace moelab
