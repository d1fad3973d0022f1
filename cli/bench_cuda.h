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
};

// Returns the process exit code (2 when no GPU is usable).
int RunCudaBench(const CudaBenchOptions& options);

}  // namespace moelab::cli
