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
  // Every rank takes its own rows of the global batch (EP ranks are data-parallel for everything
  // but the experts); dp counts the replicas of each expert block.
  l.dp = world_size / l.ep;
  if (c.train.batch_size % world_size != 0) {
    throw ConfigError("train.batch_size",
                      fmt::format("the global batch of {} sequences does not split evenly over "
                                  "{} ranks",
                                  c.train.batch_size, world_size));
  }
  l.local_batch = c.train.batch_size / world_size;
  return l;
}

}  // namespace moelab
