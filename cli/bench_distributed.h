// `moelab bench --distributed`: tokens/s of one run at 1 rank × T threads against T ranks × 1
// thread (mpirun) on the reference shapes, with the bytes each rank communicates per step from
// the analytic model (analysis/comm_model.h) beside the communicator's measured counters. Data
// parallelism runs twice: the gradient reduction after the backward ("dp-seq",
// dist.overlap=false) and overlapped with it ("dp", the default), for the comm share of each.
#pragma once

#include <string>

namespace moelab::cli {

struct DistributedBenchOptions {
  int steps = 12;   // timed steps per run
  int warmup = 3;   // untimed steps first
  int threads = 2;  // cores shared by the two layouts: 1 rank × threads vs threads ranks × 1
  std::string only;
  bool json = false;
  bool model_only = false;  // print the analytic K2-like table and stop
};

// Returns the process exit code.
int RunDistributedBench(const DistributedBenchOptions& options);

}  // namespace moelab::cli
