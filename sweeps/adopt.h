// Adoption: runs that reach the database without the local scheduler (`moelab db merge` of a
// Slurm job's database, another machine's file, a hand-started `moelab train`) join every
// sweep whose expanded spec has their config hash, so `sweep status` and the GUI show them and
// `sweep resume` does not train them again.
#pragma once

#include <string>
#include <vector>

#include "core/run_status.h"

namespace moelab::sweeps {

struct Adopted {
  std::string sweep;
  int64_t run_id = 0;
  int idx = 0;  // the run's index in the sweep's expansion
  RunStatus status = RunStatus::kQueued;
};

// For each sweep of the database (or only `sweep_name`), re-expands its stored spec and links
// to it, by config hash, a run for each of its configs that has no member yet: a done run first,
// else the newest run of the hash. Sets runs.sweep_id where it is empty. A sweep whose stored
// spec no longer expands is skipped. Returns what was linked.
std::vector<Adopted> AdoptRuns(const std::string& db_path, const std::string& sweep_name = "");

}  // namespace moelab::sweeps
