#include "core/dist/expert_parallel.h"

#include <algorithm>
#include <stdexcept>

namespace moelab {

namespace {

void AllReduceBuckets(Communicator& comm, float* g, size_t n, size_t bucket) {
  if (comm.world_size() == 1) return;
  for (size_t off = 0; off < n; off += bucket)
    comm.AllReduceSum(g + off, std::min(bucket, n - off));
}

}  // namespace

void ReduceExpertParallelGradients(Communicator& world, Communicator& ep, Communicator& dp,
                                   const std::vector<ParamInfo>& params, float* g, size_t n,
                                   double bucket_mb) {
  const size_t bucket =
      std::max<size_t>(1024, static_cast<size_t>(bucket_mb * (1 << 20) / sizeof(float)));
  const int P = ep.world_size(), me = ep.rank();
  // Non-expert tensors: the gaps between the expert tensors, in arena order.
  std::vector<const ParamInfo*> experts;
  for (const ParamInfo& p : params) {
    if (p.kind == ParamKind::kExpert) experts.push_back(&p);
  }
  std::sort(experts.begin(), experts.end(),
            [](const ParamInfo* a, const ParamInfo* b) { return a->offset < b->offset; });
  size_t at = 0;
  for (const ParamInfo* p : experts) {
    if (p->offset < at || p->offset + p->size() > n) {
      throw std::invalid_argument("ReduceExpertParallelGradients: expert tensors overlap");
    }
    AllReduceBuckets(world, g + at, p->offset - at, bucket);
    at = p->offset + p->size();
  }
  AllReduceBuckets(world, g + at, n - at, bucket);
  // Expert tensors [E, rows, cols]: the owned block over the DP group, then every block from its
  // owner to the whole EP group.
  std::vector<size_t> counts(P);
  for (const ParamInfo* p : experts) {
    if (p->batch % P != 0) {
      throw std::invalid_argument("ReduceExpertParallelGradients: " + p->name +
                                  " does not split over the expert-parallel ranks");
    }
    const size_t block = static_cast<size_t>(p->batch / P) * p->rows * p->cols;
    AllReduceBuckets(dp, g + p->offset + me * block, block, bucket);
    std::fill(counts.begin(), counts.end(), block);
    ep.AllGatherV(g + p->offset, counts.data());
  }
  const float scale = 1.0f / static_cast<float>(world.world_size());
#pragma omp parallel for simd schedule(static)
  for (size_t i = 0; i < n; ++i) g[i] *= scale;
}

}  // namespace moelab
