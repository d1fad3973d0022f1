// Gradient reduction overlapped with the backward pass (dist.overlap, issue 23). The model
// reports each contiguous arena range whose gradients are final (Model::SetGradReadyHook: from
// the arena's end toward its start, in backward order); every complete bucket of about
// dist.bucket_mb MiB below the last one started is started at once as a non-blocking sum
// (Communicator::StartAllReduceSum), the rest when the backward ends; Finish waits and averages.
// Every element is still summed over the ranks in rank order, so the result has the bits of the
// reduction after the backward (AllReduceGradients), whatever the buckets.
#pragma once

#include <cstddef>

#include "core/comm/communicator.h"

namespace moelab {

class OverlappedGradReduce {
 public:
  OverlappedGradReduce(Communicator& comm, float* grads, size_t n, double bucket_mb);
  // [begin, end) is final; end must be where the previous range began (n at first).
  void Ready(size_t begin, size_t end);
  // Starts what is left, waits for every bucket and divides by the world size; then ready for
  // the next step. Throws if the backward did not report the whole arena.
  void Finish();

 private:
  Communicator& comm_;
  float* g_;
  size_t n_, bucket_;
  size_t ready_;    // [ready_, n) is final
  size_t started_;  // [started_, n) has been started
};

}  // namespace moelab
