// Gradient reduction and norm for sharded expert parallelism (dist.expert_parallel, issues 9
// and 23). World = DP × EP: consecutive groups of EP ranks split each MoE layer's routed experts
// (rank p of a group holds experts p·E/EP … (p+1)·E/EP − 1: their parameters, gradients and
// optimizer state only, core/model/model.h ExpertShard), and the ranks holding the same experts
// (one per group: rank % EP equal) form a DP group.
//
// After the backward a rank holds the gradient of its experts from the tokens of its whole EP
// group, and the gradient of every replicated (non-expert) tensor from its own tokens. So
//   * non-expert tensors are summed over all ranks,
//   * the held expert tensors over the DP group only (the other groups' copies of these experts),
// and everything is averaged over the world. Per step a rank sends 2·(W−1)/W of the non-expert
// gradient and 2·(D−1)/D of its expert block; nothing crosses the EP group but the tokens.
#pragma once

#include <cstddef>
#include <vector>

#include "core/comm/communicator.h"
#include "core/dist/zero.h"
#include "core/model/backend.h"
#include "core/model/model.h"

namespace moelab {

// The arena ranges of the routed-expert tensors (sorted) and of everything else (the gaps), of
// an arena of n elements described by params.
std::vector<ArenaRange> ExpertRanges(const std::vector<ParamInfo>& params, size_t n);
std::vector<ArenaRange> NonExpertRanges(const std::vector<ParamInfo>& params, size_t n);

// world: all ranks; dp: the ranks holding the same experts (size W / EP). g: the gradient arena
// of n elements described by params (this rank's shard), in be's memory (the communicators must
// take that memory: MPI for the CPU backend, NCCL for CUDA).
void ReduceExpertParallelGradients(Communicator& world, Communicator& dp, Backend<float>& be,
                                   const std::vector<ParamInfo>& params, float* g, size_t n,
                                   double bucket_mb);

// With ZeRO-1 over the DP group: sums the non-expert tensors over the EP group first, so that
// the DP reduce-scatter (which must then average over the world) completes the world sum.
void SumNonExpertOverExpertGroup(Communicator& ep, const std::vector<ParamInfo>& params, float* g,
                                 size_t n, double bucket_mb);

// The global gradient norm of the whole model: the squares of the replicated tensors (the same
// on every rank) over `mine` (this rank's part of the arena: all of it, or its ZeRO-1 range,
// whose partials are then added over dp in range order), plus the expert squares added over the
// EP group. Identical on every rank. dp may be null (no ZeRO-1).
double ExpertParallelGradNorm(Communicator& ep, Communicator* dp, Backend<float>& be,
                              const std::vector<ParamInfo>& params, const float* g, size_t n,
                              ArenaRange mine);

}  // namespace moelab
