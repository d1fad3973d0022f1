// `moelab bench --device cuda` (issue 11): cuBLAS's bf16 GEMM rate in this process, then
// tokens/s and utilisation of the training step for the gpu-dense and gpu-moe shapes, fwd+bwd
// and optimizer timed separately with CUDA events, and a per-op-class breakdown.
#pragma once

#include <string>

namespace moelab::cli {

struct CudaBenchOptions {
  bool json = false;
  int steps = 10;
  int warmup = 2;
  int gemm_n = 8192;
  std::string only;
  // Sequences per forward/backward; 0 = the largest divisor of the batch whose memory plan fits
  // in memory_budget_gib (the reference shapes do not fit unsplit in 80 GB).
  int micro_batch = 0;
  double memory_budget_gib = 75;
  // Print each case's device memory plan (and the largest micro-batch that fits) and exit:
  // arithmetic only, no GPU needed.
  bool plan = false;
};

// Returns the process exit code (2 when no GPU is usable).
int RunCudaBench(const CudaBenchOptions& options);
// `--plan`: the memory plans of the reference shapes; 0, or 2 when one does not fit the budget.
int PrintCudaBenchPlan(const CudaBenchOptions& options);

}  // namespace moelab::cli
