// `moelab sweep plan`: the table of an expanded sweep with sizes, FLOPs and an estimated CPU
// time from this machine's measured training throughput.
#pragma once

#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "sweeps/spec.h"

namespace moelab::sweeps {

struct Throughput {
  double flops_per_s = 0;  // training FLOPs per second of one run at `threads` threads
  int threads = 0;
  std::string how;  // what was measured
};

// Trains `config` (on synthetic data, in a temporary folder) with the real engine until at
// least min_steps steps and min_seconds of step time after the first step, and returns the
// training FLOP rate of those steps. A time budget, not a step count: a few fast steps of a
// small model are too noisy on a shared machine.
Throughput MeasureThroughput(const RunConfig& config, int threads, int min_steps = 3,
                             double min_seconds = 2.0);

// The run the time estimate is calibrated on: the sweep's largest unique run (training FLOPs
// per token); nullptr for an empty sweep.
const SweepRun* CalibrationRun(const Sweep& sweep);

// Threads per run when `parallel` runs share this machine's cores (PlanOptions' default).
int ThreadsPerRun(int parallel);

struct PlanOptions {
  int parallel = 1;
  int threads_per_run = 0;  // 0: ThreadsPerRun(parallel)
  bool calibrate = true;    // false: no time estimates
  // A rate measured before (MeasureThroughput of CalibrationRun, e.g. by the GUI in the
  // background): used for the time estimates instead of calibrating now.
  std::optional<Throughput> throughput;
  // What the plan says instead of a rate when it has none (the GUI: measuring in the background).
  std::string uncalibrated = "not calibrated (--no-calibrate)";
  std::string db_path;  // when set and present: show which runs are already done there
  // GPU time at a stated throughput: peak dense TFLOP/s of one GPU (e.g. 989 for an H100 SXM
  // in BF16) times the model-FLOPs utilisation. 0: no GPU line. Until measured on the GPU, the
  // utilisation is an assumption and the line says so.
  double gpu_peak_tflops = 0;
  double gpu_mfu = 0;
  std::string gpu_name = "GPU";
};

// The table, totals and time estimates, then what `moelab fit` and `moelab promote` can do per
// family (sweeps/fit_plan.h), and a warning when this machine cannot run the sweep's device
// (the plan is still printed in full: it is arithmetic for the machine that will).
void PrintPlan(const Sweep& sweep, const PlanOptions& options, std::FILE* out);

}  // namespace moelab::sweeps
