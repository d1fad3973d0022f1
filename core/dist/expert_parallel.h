// Gradient reduction for expert parallelism (dist.expert_parallel, issue 9). World = DP × EP:
// consecutive groups of EP ranks split each MoE layer's routed experts (rank p of a group owns
// experts p·E/EP … (p+1)·E/EP − 1, core/model/moe.h), and the ranks owning the same experts
// (one per group: rank % EP equal) form a DP group.
//
// Every rank keeps the full parameter arena (and the full optimizer state) for now: after the
// backward a rank holds the gradient of its owned experts (from the tokens of its whole EP group)
// and zeros for the others. ReduceExpertParallelGradients sums
//   * non-expert tensors over all ranks,
//   * each owned expert block over its DP group only (expert gradients stay with their owners),
// averages over the world, then all-gathers the expert blocks inside the EP group so every rank
// applies the same update to the full arena (replicated parameters never drift; checkpoints need
// no gather). Per step a rank sends 2·(W−1)/W of the non-expert gradient, 2·(D−1)/D of its owned
// expert block and (EP−1)/EP of the expert tensors, instead of 2·(W−1)/W of everything.
#pragma once

#include <cstddef>
#include <vector>

#include "core/dist/communicator.h"
#include "core/model/model.h"

namespace moelab {

// world: all ranks; ep: this rank's EP group (size EP, rank = position in the group); dp: the
// ranks owning the same experts (size W / EP). g: the gradient arena of n elements described by
// params (which must tile it).
void ReduceExpertParallelGradients(Communicator& world, Communicator& ep, Communicator& dp,
                                   const std::vector<ParamInfo>& params, float* g, size_t n,
                                   double bucket_mb);

}  // namespace moelab
