#include "core/dist/layout.h"

#include <fmt/format.h>

namespace moelab {

std::string DistLayout::describe() const {
  return fmt::format("{} rank{} = DP {} × EP {}, {} sequences per rank", world,
                     world == 1 ? "" : "s", dp, ep, local_batch);
}

DistLayout MakeDistLayout(const RunConfig& c, int world_size, int rank) {
  DistLayout l;
  l.world = world_size;
  l.rank = rank;
  l.ep = c.dist.expert_parallel;
  if (world_size < 1) throw ConfigError("dist", "world size must be positive");
  if (l.ep > 1 && c.moe.experts_total > 0 && l.ep > c.moe.experts_total) {
    throw ConfigError(
        "dist.expert_parallel",
        fmt::format("{} expert-parallel ranks exceed the {} experts", l.ep, c.moe.experts_total));
  }
  if (world_size % l.ep != 0) {
    throw ConfigError("dist.expert_parallel",
                      fmt::format("the world size {} is not divisible by the expert-parallel "
                                  "size {}; start a multiple of {} ranks",
                                  world_size, l.ep, l.ep));
  }
  if (l.ep > 1) {
    throw ConfigError("dist.expert_parallel",
                      "expert parallelism (tokens by all-to-all between dispatch and combine) is "
                      "not implemented yet; use dist.expert_parallel = 1 (pure data parallel)");
  }
  // EP ranks also split the batch (they are data-parallel for everything but the experts).
  l.dp = world_size;
  if (c.train.batch_size % l.dp != 0) {
    throw ConfigError("train.batch_size",
                      fmt::format("the global batch of {} sequences does not split evenly over "
                                  "{} data-parallel ranks",
                                  c.train.batch_size, l.dp));
  }
  l.local_batch = c.train.batch_size / l.dp;
  return l;
}

}  // namespace moelab
