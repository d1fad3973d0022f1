// ZeRO-1 with distributed Muon (issue 9). The flat parameter arena is cut into one contiguous
// range per data-parallel rank, size-balanced, never inside a Muon matrix (a stacked expert
// tensor may be cut between its matrices). Each rank keeps optimizer state (AdamW moments, Muon
// momentum) only for its range and updates only its range: Newton–Schulz of a matrix runs on
// the one rank that owns it, as in Megatron's distributed optimizer (contiguous buffer shards)
// and the reference Muon's per-matrix owners. Step: gradients reduce-scattered (each rank gets
// the sum of its range), the local optimizer steps, the updated parameters all-gathered.
//
// Because the ranges are contiguous and in rank order, every unsharded optimizer buffer
// ("muon.momentum", "adamw.m", "adamw.v": parameter order) is the concatenation of the ranks'
// local buffers of the same name, so checkpoints stay in the unsharded format and resume at any
// rank count and with ZeRO-1 on or off.
//
// The arenas live in the model's backend (core/model/backend.h): with train.device "cuda" the
// communicator is NCCL and the local optimizer the device one; the state is mirrored on the
// host only for checkpoints.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "core/config.h"
#include "core/comm/communicator.h"
#include "core/model/backend.h"
#include "core/model/model.h"
#include "core/optim/optimizer.h"

namespace moelab {

struct ArenaRange {
  size_t begin = 0, end = 0;
  size_t size() const { return end - begin; }
};

// The contiguous size-balanced partition of an arena of n elements described by params into
// parts ranges. With muon (optimizer muon/muonclip) a cut never falls inside a hidden matrix.
// Throws std::invalid_argument when params do not tile [0, n).
std::vector<ArenaRange> PartitionArena(const std::vector<ParamInfo>& params, size_t n, int parts,
                                       bool muon);

// The parameters of params restricted to [range.begin, range.end): whole Muon matrices, and
// AdamW tensors cut to 1×len slices where the range cuts them.
std::vector<ParamInfo> RestrictParams(const std::vector<ParamInfo>& params, ArenaRange range,
                                      bool muon);

// Per-rank sizes of the intersection of [a, b) with each range (chunks of a v-collective).
std::vector<size_t> ChunkCounts(const std::vector<ArenaRange>& ranges, size_t a, size_t b);

// Sum of squares of g over each range, in double, in fixed chunks (as the trainer's grad norm),
// then added in range order: the same bits whether one rank computes all ranges or each rank its
// own and the partials are exchanged.
double RangeSquares(const float* g, ArenaRange r);

class ShardedOptimizer {
 public:
  // The local optimizer is MakeOptimizer(run.optimizer, ..., backend.optimizer_ops()) for this
  // rank's range; grads and params of the calls below are backend memory.
  ShardedOptimizer(const RunConfig& run, const std::vector<ParamInfo>& params, size_t num_params,
                   Communicator& comm, Backend<float>& backend);

  const std::vector<ArenaRange>& ranges() const { return ranges_; }
  ArenaRange mine() const { return ranges_[comm_.rank()]; }

  // Sums every rank's gradients of this rank's range into grads[mine] and divides by
  // average_over (0: the ranks of comm; expert parallelism: the world, whose other ranks' sums
  // are already in); in buckets of bucket_mb MiB. The rest of grads is left unspecified.
  void ReduceScatterGradients(float* grads, double bucket_mb, int average_over = 0);
  // Global gradient norm from the reduce-scattered shards.
  double GradNorm(const float* grads);
  // The local optimizer steps this rank's range, then every rank's range is all-gathered.
  void Step(float* params, const float* grads, double lr, int64_t step, double bucket_mb);

  // The unsharded optimizer buffers' names and sizes (the checkpoint layout).
  const std::vector<std::pair<std::string, size_t>>& full_layout() const { return layout_; }
  // Collective: the unsharded buffers on the host, gathered on every rank (transient:
  // checkpoints only).
  std::vector<std::vector<float>> GatherFullState();
  // Takes this rank's part of unsharded buffers (as read from a checkpoint).
  void LoadFullState(const std::vector<std::vector<float>>& full);

  size_t local_state_bytes() const;
  size_t full_state_bytes() const;

 private:
  Communicator& comm_;
  Backend<float>& be_;
  std::vector<ArenaRange> ranges_;
  std::unique_ptr<Optimizer> local_;
  std::vector<std::pair<std::string, size_t>> layout_;
  // counts_[i][r]: elements of layout_[i] held by rank r.
  std::vector<std::vector<size_t>> counts_;
};

}  // namespace moelab
