// `moelab sweep plan`: the table of an expanded sweep with sizes, FLOPs and an estimated CPU
// time from this machine's measured training throughput. The rate is calibrated in process CPU
// time, not wall time: on a shared machine other processes stretch the wall clock of the timed
// steps but not their CPU seconds, so a loaded machine does not inflate the plan. CPU-hours and
// the wall time at `--parallel N` are printed separately.
#pragma once

#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "sweeps/spec.h"

namespace moelab::sweeps {

struct Throughput {
  double flops_per_s = 0;  // training FLOPs per wall second of one run at `threads` threads
  // Training FLOPs per CPU second (process CPU time, all threads) at `threads` threads: what the
  // plan's CPU-hours divide by. 0 when unknown (then flops_per_s / threads stands in).
  double flops_per_cpu_s = 0;
  double wall_s = 0, cpu_s = 0;  // the timed steps' step time and process CPU time
  int threads = 0;
  std::string how;  // what was measured
  // The rate per CPU second the plan uses.
  double CpuRate() const;
};

// Trains `config` (on synthetic data, in a temporary folder) with the real engine until at
// least min_steps steps and min_seconds of process CPU time after the first step, and returns the
// training FLOP rate of those steps, per wall second and per CPU second of the process (every
// CPU second the process spends between the first and the last timed step: the engine's
// threads, and in the GUI its UI thread too). A time budget, not a step count: a few fast steps
// of a small model are too noisy on a shared machine.
Throughput MeasureThroughput(const RunConfig& config, int threads, int min_steps = 3,
                             double min_seconds = 2.0);

// The run the time estimate is calibrated on: the sweep's largest unique run (training FLOPs
// per token); nullptr for an empty sweep.
const SweepRun* CalibrationRun(const Sweep& sweep);

// Threads per run when `parallel` runs share this machine's cores (PlanOptions' default).
int ThreadsPerRun(int parallel);

// Wall seconds of `cpu_seconds` of runs at `threads` threads each, `parallel` at a time, on
// `cores` cores: cpu_seconds / min(parallel × threads, cores). A lower bound: it assumes an
// otherwise idle machine, runs whose threads stay busy and a queue that divides evenly.
double WallSeconds(double cpu_seconds, int parallel, int threads, int cores);

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
