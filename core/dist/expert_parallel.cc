#include "core/dist/expert_parallel.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace moelab {

namespace {

size_t BucketElements(double bucket_mb) {
  return std::max<size_t>(1024, static_cast<size_t>(bucket_mb * (1 << 20) / sizeof(float)));
}

void AllReduceBuckets(Communicator& comm, float* g, ArenaRange r, size_t bucket) {
  if (comm.world_size() == 1) return;
  for (size_t off = r.begin; off < r.end; off += bucket)
    comm.AllReduceSum(g + off, std::min(bucket, r.end - off));
}

// Σ g² over the parts of ranges inside mine, range by range in order.
double SquaresWithin(Backend<float>& be, const float* g, const std::vector<ArenaRange>& ranges,
                     ArenaRange mine) {
  double sq = 0;
  for (const ArenaRange& r : ranges) {
    const ArenaRange cut{std::max(r.begin, mine.begin), std::min(r.end, mine.end)};
    if (cut.begin < cut.end) sq += be.SumSquares(g + cut.begin, cut.size());
  }
  return sq;
}

// The pair summed over comm: each rank's partials in its slot (zeros elsewhere, so the
// all-reduce is exact), then added in rank (= ZeRO-1 range) order, identically on every rank.
std::vector<double> SumPairsInRankOrder(Communicator& comm, const std::vector<double>& pair) {
  const int w = comm.world_size();
  std::vector<double> slots(2 * static_cast<size_t>(w), 0.0);
  slots[2 * comm.rank()] = pair[0];
  slots[2 * comm.rank() + 1] = pair[1];
  comm.AllReduceSum(slots.data(), slots.size());
  std::vector<double> total = {0.0, 0.0};
  for (int r = 0; r < w; ++r) {
    total[0] += slots[2 * r];
    total[1] += slots[2 * r + 1];
  }
  return total;
}

}  // namespace

std::vector<ArenaRange> ExpertRanges(const std::vector<ParamInfo>& params, size_t n) {
  std::vector<ArenaRange> out;
  for (const ParamInfo& p : params) {
    if (p.kind == ParamKind::kExpert) out.push_back({p.offset, p.offset + p.size()});
  }
  std::sort(out.begin(), out.end(),
            [](const ArenaRange& a, const ArenaRange& b) { return a.begin < b.begin; });
  size_t at = 0;
  for (const ArenaRange& r : out) {
    if (r.begin < at || r.end > n) throw std::invalid_argument("expert tensors overlap");
    at = r.end;
  }
  return out;
}

std::vector<ArenaRange> NonExpertRanges(const std::vector<ParamInfo>& params, size_t n) {
  std::vector<ArenaRange> out;
  size_t at = 0;
  for (const ArenaRange& e : ExpertRanges(params, n)) {
    if (e.begin > at) out.push_back({at, e.begin});
    at = e.end;
  }
  if (n > at) out.push_back({at, n});
  return out;
}

void ReduceExpertParallelGradients(Communicator& world, Communicator& dp, Backend<float>& be,
                                   const std::vector<ParamInfo>& params, float* g, size_t n,
                                   double bucket_mb) {
  const size_t bucket = BucketElements(bucket_mb);
  for (const ArenaRange& r : NonExpertRanges(params, n)) AllReduceBuckets(world, g, r, bucket);
  for (const ArenaRange& r : ExpertRanges(params, n)) AllReduceBuckets(dp, g, r, bucket);
  be.Scale(g, n, 1.0f / static_cast<float>(world.world_size()));
}

void SumNonExpertOverExpertGroup(Communicator& ep, const std::vector<ParamInfo>& params, float* g,
                                 size_t n, double bucket_mb) {
  const size_t bucket = BucketElements(bucket_mb);
  for (const ArenaRange& r : NonExpertRanges(params, n)) AllReduceBuckets(ep, g, r, bucket);
}

double ExpertParallelGradNorm(Communicator& ep, Communicator* dp, Backend<float>& be,
                              const std::vector<ParamInfo>& params, const float* g, size_t n,
                              ArenaRange mine) {
  // [replicated, expert] squares of this rank's part.
  std::vector<double> sq = {SquaresWithin(be, g, NonExpertRanges(params, n), mine),
                            SquaresWithin(be, g, ExpertRanges(params, n), mine)};
  if (dp != nullptr) sq = SumPairsInRankOrder(*dp, sq);
  ep.AllReduceSum(&sq[1], 1);  // the other experts' squares
  return std::sqrt(sq[0] + sq[1]);
}

}  // namespace moelab
