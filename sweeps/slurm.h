// `moelab sweep slurm`: a Slurm array script that trains a sweep's runs on a cluster, one array
// task per run, into a database whose results `moelab db merge` imports back.
#pragma once

#include <string>

#include "sweeps/spec.h"

namespace moelab::sweeps {

struct SlurmOptions {
  std::string db_path;  // may contain {task}: one database file per array task
  std::string out_dir;  // where the script and the run configs go
  std::string moelab_bin = "moelab";
  int threads_per_run = 2;  // --cpus-per-task and train.threads
  int max_parallel = 0;     // %N array throttle; 0 = none
  std::string partition;
  std::string time_limit;  // e.g. 04:00:00
  std::string extra;       // more #SBATCH lines, verbatim
};

// Writes <out_dir>/<sweep>.sbatch and <out_dir>/configs/<hash16>.json; returns the script path.
std::string WriteSlurmScript(const Sweep& sweep, const SlurmOptions& options);

}  // namespace moelab::sweeps
