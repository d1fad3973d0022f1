// How a run's ranks are arranged: world = DP × EP (issue 9). Checked before anything trains so
// misuse is a config error (exit 2), not a hang.
#pragma once

#include <string>

#include "core/config.h"

namespace moelab {

struct DistLayout {
  int world = 1;  // ranks in the job
  int dp = 1;     // data-parallel size: ranks that split the global batch
  int ep = 1;     // expert-parallel size (dist.expert_parallel)
  int rank = 0;
  int local_batch = 0;           // train.batch_size / dp sequences per rank and step
  std::string describe() const;  // "4 ranks = DP 2 × EP 2"
};

// Throws ConfigError (naming the field) when the world size does not fit the config: not
// divisible by dist.expert_parallel, a global batch not divisible by the DP size, expert
// parallelism in a build that lacks it.
DistLayout MakeDistLayout(const RunConfig& config, int world_size, int rank);

}  // namespace moelab
