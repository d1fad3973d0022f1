// `moelab bench --device cuda` (issue 11): cuBLAS's bf16 GEMM rate in this process, then
// tokens/s and utilisation of the training step for the gpu-dense and gpu-moe shapes, fwd+bwd
// and optimizer timed separately with CUDA events (no per-op events in the timed steps), and a
// per-op-class breakdown from a separate profiled pass.
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
  // the memory budget (gpu-moe does not fit unsplit in 80 GB, it does in 141 GB).
  int micro_batch = 0;
  // The budget the micro-batch is chosen against; 0 = read from the device: kDeviceMemoryShare of
  // cudaMemGetInfo's total (with --plan on a machine without a GPU: each reference card's).
  double memory_budget_gib = 0;
  // Steps run after the timed ones with the per-op-class CUDA events on, for the breakdown (the
  // events cost time of their own, so the headline timings are taken without them); 0 = none.
  int profile_steps = 2;
  // Print each case's device memory plan (and the largest micro-batch that fits) and exit:
  // arithmetic only, no GPU needed.
  bool plan = false;
  // train.kernels for every case, "key=value[,key=value...]" (core/kernel_choices.h); "" = the
  // defaults.
  std::string kernels;
};

// The names of the GPU cases, in the order the bench runs them.
std::vector<std::string> GpuCaseNames();

// The share of the device's memory (cudaMemGetInfo's total) the bench plans against: the rest
// covers what the plan's 1 GiB runtime allowance may miss (allocator rounding, cuBLAS and cuDNN
// workspaces grown later).
inline constexpr double kDeviceMemoryShare = 0.97;

// The bench's budget in bytes: override_gib when positive, else kDeviceMemoryShare × total.
double BenchMemoryBudgetBytes(double override_gib, double device_total_bytes);

// The micro-batch the bench runs case `name` at for a budget (no GPU needed): the largest divisor
// of the batch whose PlanCudaMemory fits, 1 when none does. Throws std::invalid_argument for an
// unknown name, std::runtime_error in a build without CUDA (the plan is the CUDA backend's).
int GpuCaseMicroBatch(const std::string& name, double budget_bytes);

// Cards the plan is printed for on a machine without a GPU (--plan, no --memory-budget-gib):
// their cudaMemGetInfo totals, approximately.
struct ReferenceCard {
  const char* name;
  double total_gib;
};
std::vector<ReferenceCard> ReferenceCards();

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
