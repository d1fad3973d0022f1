#include "core/dist/grad_overlap.h"

#include <algorithm>
#include <stdexcept>

namespace moelab {

OverlappedGradReduce::OverlappedGradReduce(Communicator& comm, float* grads, size_t n,
                                           double bucket_mb)
    : comm_(comm),
      g_(grads),
      n_(n),
      bucket_(std::max<size_t>(1024, static_cast<size_t>(bucket_mb * (1 << 20) / sizeof(float)))),
      ready_(n),
      started_(n) {}

void OverlappedGradReduce::Ready(size_t begin, size_t end) {
  if (end != ready_ || begin > end) {
    throw std::logic_error("OverlappedGradReduce: gradient ranges out of backward order");
  }
  ready_ = begin;
  while (started_ - ready_ >= bucket_) {
    started_ -= bucket_;
    comm_.StartAllReduceSum(g_ + started_, bucket_);
  }
  comm_.Progress();
}

void OverlappedGradReduce::Finish() {
  if (ready_ != 0) {
    throw std::logic_error("OverlappedGradReduce: the backward did not report every gradient");
  }
  while (started_ > 0) {
    const size_t len = std::min(bucket_, started_);
    started_ -= len;
    comm_.StartAllReduceSum(g_ + started_, len);
  }
  comm_.WaitAll();
  const float s = 1.0f / static_cast<float>(comm_.world_size());
#pragma omp parallel for simd schedule(static)
  for (size_t i = 0; i < n_; ++i) g_[i] *= s;
  ready_ = started_ = n_;
}

}  // namespace moelab
