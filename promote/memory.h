// Memory per device of a planned run, from the config alone (a promoted model may not fit on
// the machine that plans it): parameters, gradients, optimizer state and activations, each as
// the engine sizes it. docs/promote.md, "The plan".
#pragma once

#include <cstddef>
#include <string>

#include "core/config.h"
#include "core/flops.h"

namespace moelab::promote {

struct PromoteLayout {
  int ranks = 1;               // processes (data parallel unless ep > 1)
  int ep = 1;                  // expert-parallel group size (divides ranks and experts_total)
  std::string device = "cpu";  // "cpu" | "cuda"
  int threads = 2;             // CPU threads per rank (train.threads)
};

// Bytes per device of the engine's arenas: the fp32 CPU ones, or for a "cuda" layout in a build
// with CUDA the device memory plan (PlanCudaMemory: fp32 masters, the bf16 copy and activations
// when bf16, the runtime allowance).
struct MemoryEstimate {
  double params = 0;
  double grads = 0;
  double optimizer = 0;
  double activations = 0;     // model activation arena + MoE dispatch buffers at the local batch
  double runtime = 0;         // cuda: the CUDA context and cuBLAS workspaces; 0 on the CPU
  std::string basis = "cpu";  // "cpu" | "cuda" (the plan used)
  double total() const { return params + grads + optimizer + activations + runtime; }
};

// Element counts (not bytes) of the activation arena, as Model<float> sizes it for `batch`
// sequences and `threads` OpenMP threads: the same carve-up as Model::Impl::Reserve plus the
// MoE layers' buffers. Padding to 64-byte lines is included.
size_t ActivationElements(const RunConfig& config, int batch, int threads);
// Optimizer state and workspace element counts live in core/flops.h (the trainers' memory plan
// uses them too).
using ::moelab::OptimizerStateElements;
using ::moelab::OptimizerWorkspaceElements;
MemoryEstimate EstimateMemory(const RunConfig& config, const PromoteLayout& layout);

}  // namespace moelab::promote
