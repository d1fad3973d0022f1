// `moelab bench --device cuda` (issue 11): cuBLAS's bf16 GEMM rate in this process, then
// tokens/s and utilisation of the training step for the gpu-dense and gpu-moe shapes, fwd+bwd
// and optimizer timed separately with CUDA events, and a per-op-class breakdown.
#pragma once

#include <stdexcept>
#include <string>
#include <vector>

namespace moelab::cli {

struct CudaBenchOptions {
  bool json = false;
  int steps = 10;
  int warmup = 2;
  int gemm_n = 8192;
  std::string only;  // "" = every case; else exact names, comma-separated (SelectCases)
  // Sequences per forward/backward; 0 = the largest divisor of the batch whose memory plan fits
  // in memory_budget_gib (the reference shapes do not fit unsplit in 80 GB).
  int micro_batch = 0;
  double memory_budget_gib = 75;
  // Print each case's device memory plan (and the largest micro-batch that fits) and exit:
  // arithmetic only, no GPU needed.
  bool plan = false;
  // train.kernels for every case, "key=value[,key=value...]" (core/kernel_choices.h); "" = the
  // defaults.
  std::string kernels;
};

// The names of the GPU cases, in the order the bench runs them.
std::vector<std::string> GpuCaseNames();

// The entries of `all` that `only` names, in the order of `all`: `only` is "" (all of them) or a
// comma-separated list of exact names ("gpu-dense" does not select "gpu-dense-muonclip").
// Throws std::invalid_argument naming an unknown entry and the valid ones.
std::vector<std::string> SelectCases(const std::vector<std::string>& all, const std::string& only);

// Returns the process exit code (2 when no GPU is usable or an option is wrong). Each case's row
// holds its first and last step's loss (the same synthetic batches whatever the kernels, so rows
// of different --kernels compare: a wrong kernel shows as a different loss, not only a speed).
int RunCudaBench(const CudaBenchOptions& options);
// `--plan`: the memory plans of the reference shapes; 0, or 2 when one does not fit the budget.
int PrintCudaBenchPlan(const CudaBenchOptions& options);

}  // namespace moelab::cli
