// P ranks of an expert-parallel group as threads of one process (tests of the MoE layer and its
// exchange): AllToAllV through pointers published between two barriers; the other collectives
// are not used there and fail the test.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <barrier>
#include <functional>
#include <vector>

#include "core/comm/communicator.h"

namespace moelab {

// P ranks as threads: AllToAllV through pointers published between two barriers.
struct ThreadWorld {
  explicit ThreadWorld(int p) : size(p), sync(p), sends(p), send_counts(p) {}
  int size;
  std::barrier<> sync;
  std::vector<const float*> sends;
  std::vector<const size_t*> send_counts;
};

class ThreadCommunicator : public Communicator {
 public:
  ThreadCommunicator(ThreadWorld& world, int rank) : world_(world), rank_(rank) {}
  int rank() const override { return rank_; }
  int world_size() const override { return world_.size; }
  void AllReduceSum(float*, size_t) override { Unused(); }
  void AllReduceSum(double*, size_t) override { Unused(); }
  void AllReduceSum(int64_t*, size_t) override { Unused(); }
  void AllReduceMax(float*, size_t) override { Unused(); }
  void Barrier() override { world_.sync.arrive_and_wait(); }
  void AllToAllV(const float* send, const size_t* send_counts, float* recv,
                 const size_t* recv_counts) override {
    ++stats_.calls;
    if (check_pointer) {
      check_pointer(send);
      check_pointer(recv);
    }
    world_.sends[rank_] = send;
    world_.send_counts[rank_] = send_counts;
    world_.sync.arrive_and_wait();
    size_t at = 0;
    for (int q = 0; q < world_.size; ++q) {
      size_t from = 0;
      for (int r = 0; r < rank_; ++r) from += world_.send_counts[q][r];
      EXPECT_EQ(world_.send_counts[q][rank_], recv_counts[q]) << "rank " << rank_ << " from " << q;
      std::copy_n(world_.sends[q] + from, recv_counts[q], recv + at);
      at += recv_counts[q];
    }
    world_.sync.arrive_and_wait();  // nobody reuses its send buffer before all have read it
  }

  // Called with every buffer an AllToAllV is given (a test's memory check); may be empty.
  std::function<void(const void*)> check_pointer;

 private:
  static void Unused() { FAIL() << "not used by MoeLayer"; }
  ThreadWorld& world_;
  int rank_;
};

}  // namespace moelab
