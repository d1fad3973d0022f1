// The checks a run must pass before anything is recorded or trained: the data (the corpus is
// there and its vocabulary fits model.vocab_size), the device, what the CUDA backend supports
// for the layout, and the device memory plan. `moelab train` and `moelab config check` both call
// PreflightRun, so a config that `config check` calls ok is one `train` starts.
#pragma once

#include <functional>

#include "core/config.h"
#include "core/dist/layout.h"

namespace moelab {

struct PreflightOptions {
  // Print the device memory estimate (stderr) on a CUDA run.
  bool print_memory_plan = false;
  // Called on a CUDA run after the device checks, before the memory plan: a rank of several
  // picks its own GPU here (the plan's cudaMemGetInfo makes a context on the current device).
  std::function<void()> before_memory_check;
};

// Throws ConfigError naming the field at fault: data.path, train.device, train.micro_batch (the
// memory plan: it names the largest micro-batch that fits), or what RequireCudaSupports names.
void PreflightRun(const RunConfig& config, const DistLayout& layout,
                  const PreflightOptions& options = {});

}  // namespace moelab
