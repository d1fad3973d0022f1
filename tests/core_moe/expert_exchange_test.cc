// The expert-parallel row exchange (core/model/expert_exchange.h) on P ranks as threads: owned
// rows arrive expert-contiguous and in source-rank order, the reverse exchange brings every row
// back to its place, and every buffer the communicator and the copies see lies inside the
// exchange's own memory (on a GPU: NCCL and the copies only ever get device memory).
#include "core/model/expert_exchange.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <vector>

#include "tests/core_moe/thread_communicator.h"

namespace moelab {
namespace {

// Host memory that records its allocations and fails the test when a copy touches anything else.
class TrackedMemory final : public BackendMemory {
 public:
  std::string name() const override { return "tracked"; }
  bool is_host() const override { return false; }  // as a device: only ToHost reads it
  void* Allocate(size_t bytes) override {
    void* p = Host().Allocate(bytes);
    std::lock_guard<std::mutex> lock(mu_);
    if (p) blocks_[static_cast<const char*>(p)] = bytes;
    return p;
  }
  void Release(void* p) noexcept override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      blocks_.erase(static_cast<const char*>(p));
    }
    Host().Release(p);
  }
  void ToBackend(void* dst, const void* host, size_t bytes) override {
    Check(dst, bytes);
    Host().ToBackend(dst, host, bytes);
  }
  void ToHost(void* host, const void* src, size_t bytes) const override {
    Check(src, bytes);
    Host().ToHost(host, src, bytes);
  }
  void Copy(void* dst, const void* src, size_t bytes) override {
    Check(dst, bytes);
    Check(src, bytes);
    Host().Copy(dst, src, bytes);
  }
  void Zero(void* p, size_t bytes) override {
    Check(p, bytes);
    Host().Zero(p, bytes);
  }
  // [p, p + bytes) inside one allocation.
  bool Contains(const void* p, size_t bytes = 1) const {
    std::lock_guard<std::mutex> lock(mu_);
    const char* c = static_cast<const char*>(p);
    auto it = blocks_.upper_bound(c);
    if (it == blocks_.begin()) return false;
    --it;
    return c + bytes <= it->first + it->second;
  }

 private:
  void Check(const void* p, size_t bytes) const {
    if (bytes > 0 && !Contains(p, bytes)) ADD_FAILURE() << "a copy outside the tracked memory";
  }
  mutable std::mutex mu_;
  std::map<const char*, size_t> blocks_;
};

constexpr int kE = 4, kWidth = 6;  // 6 uint16 per row: 12-byte rows, like bf16 rows of d = 6

// Rows rank r dispatches to expert e (some zero).
int64_t RowsOf(int r, int e) { return (r + 2 * e) % 3; }
// A row's first value names it: rank, expert, index within the expert's block.
uint16_t Tag(int r, int e, int64_t i) { return static_cast<uint16_t>(r * 1000 + e * 100 + i); }

TEST(ExpertExchange, OwnedRowsAreExpertContiguousAndTheReverseRestoresThem) {
  for (int P : {2, 4}) {
    TrackedMemory memory;
    ThreadWorld world(P);
    std::vector<std::thread> ranks;
    for (int r = 0; r < P; ++r) {
      ranks.emplace_back([&, r] {
        ThreadCommunicator comm(world, r);
        comm.check_pointer = [&](const void* p) {
          EXPECT_TRUE(p == nullptr || memory.Contains(p)) << "rank " << r << ": a host buffer";
        };
        std::vector<int64_t> offsets(kE + 1, 0);
        for (int e = 0; e < kE; ++e) offsets[e + 1] = offsets[e] + RowsOf(r, e);
        const int64_t n = offsets[kE];
        std::vector<uint16_t> rows(static_cast<size_t>(n) * kWidth);
        for (int e = 0; e < kE; ++e) {
          for (int64_t i = 0; i < RowsOf(r, e); ++i) {
            uint16_t* row = rows.data() + (offsets[e] + i) * kWidth;
            for (int c = 0; c < kWidth; ++c) row[c] = static_cast<uint16_t>(Tag(r, e, i) + c);
          }
        }
        BackendArray<uint16_t> local(&memory), owned(&memory), back(&memory);
        local.Resize(rows.size() + 1);
        local.Upload(rows.data(), rows.size());

        ExpertExchange exchange(&memory, kE);
        for (int step = 0; step < 2; ++step) {  // a second step reuses the buffers
          exchange.Plan(comm, offsets.data());
          const std::vector<int64_t>& own = exchange.owned_offsets();
          const int J = kE / P;
          EXPECT_EQ(exchange.first_owned(), r * J);
          owned.Resize(static_cast<size_t>(exchange.owned_rows()) * kWidth + 1);
          exchange.ToOwners(comm, local.data(), owned.data(), kWidth * sizeof(uint16_t));
          std::vector<uint16_t> got(static_cast<size_t>(exchange.owned_rows()) * kWidth);
          owned.Download(got.data(), got.size());
          for (int e = 0; e < kE; ++e) {
            if (e / J != r) {
              EXPECT_EQ(own[e + 1], own[e]) << "expert " << e << " is not rank " << r << "'s";
              continue;
            }
            int64_t at = own[e];
            for (int q = 0; q < P; ++q) {
              for (int64_t i = 0; i < RowsOf(q, e); ++i, ++at) {
                for (int c = 0; c < kWidth; ++c) {
                  ASSERT_EQ(got[at * kWidth + c], Tag(q, e, i) + c)
                      << "P " << P << " rank " << r << " expert " << e << " source " << q;
                }
              }
            }
            EXPECT_EQ(at, own[e + 1]);
          }
          // Outputs: each owned row + 1, sent back to the rows' own ranks and places.
          for (uint16_t& v : got) ++v;
          owned.Upload(got.data(), got.size());
          back.Resize(rows.size() + 1);
          exchange.FromOwners(comm, owned.data(), back.data(), kWidth * sizeof(uint16_t));
          std::vector<uint16_t> returned(rows.size());
          back.Download(returned.data(), returned.size());
          for (size_t i = 0; i < rows.size(); ++i) {
            ASSERT_EQ(returned[i], static_cast<uint16_t>(rows[i] + 1)) << "rank " << r;
          }
        }
      });
    }
    for (std::thread& t : ranks) t.join();
  }
}

// Records, per AllToAllV, whether a null buffer came with a nonzero count (what NCCL's
// communicator refuses: it needs device memory for every buffer that moves data).
class NullCheckingCommunicator : public ThreadCommunicator {
 public:
  using ThreadCommunicator::ThreadCommunicator;
  void AllToAllV(const float* send, const size_t* send_counts, float* recv,
                 const size_t* recv_counts) override {
    size_t sent = 0, received = 0;
    for (int q = 0; q < world_size(); ++q) {
      sent += send_counts[q];
      received += recv_counts[q];
    }
    EXPECT_FALSE(send == nullptr && sent > 0) << "rank " << rank();
    EXPECT_FALSE(recv == nullptr && received > 0) << "rank " << rank();
    null_recv_ += recv == nullptr;
    ThreadCommunicator::AllToAllV(send, send_counts, recv, recv_counts);
  }
  int null_recv() const { return null_recv_; }

 private:
  int null_recv_ = 0;
};

// Every row goes to rank 0's experts: rank 1 owns none, so its first exchange hands the
// communicator a receive buffer that was never allocated (nullptr) with zero counts, and the
// NCCL communicator must accept that (it refused it on that rank alone: the others hung).
TEST(ExpertExchange, ARankThatOwnsNoRowsGivesNullBuffersOnlyWithZeroCounts) {
  constexpr int P = 2;
  ThreadWorld world(P);
  std::vector<std::thread> ranks;
  for (int r = 0; r < P; ++r) {
    ranks.emplace_back([&, r] {
      NullCheckingCommunicator comm(world, r);
      const std::vector<int64_t> offsets = {0, 2, 3, 3, 3};  // experts 0 and 1: rank 0's
      std::vector<float> local(3 * 2), owned(6 * 2, 0.0f), back(3 * 2, 0.0f);
      for (size_t i = 0; i < local.size(); ++i) local[i] = static_cast<float>(10 * r + i);
      ExpertExchange exchange(&Host(), kE);
      exchange.Plan(comm, offsets.data());
      EXPECT_EQ(exchange.owned_rows(), r == 0 ? 6 : 0);
      exchange.ToOwners(comm, local.data(), owned.data(), 2 * sizeof(float));
      exchange.FromOwners(comm, owned.data(), back.data(), 2 * sizeof(float));
      EXPECT_EQ(back, local) << "rank " << r;
      if (r == 1) {
        EXPECT_GT(comm.null_recv(), 0) << "the case under test did not occur";
      }
    });
  }
  for (std::thread& t : ranks) t.join();
}

TEST(ExpertExchange, RefusesRowsThatAreNotWholeWordsAndUnevenExpertSplits) {
  ThreadWorld world(1);
  ThreadCommunicator comm(world, 0);
  std::vector<int64_t> offsets = {0, 1, 2, 3, 4};
  ExpertExchange exchange(&Host(), kE);
  exchange.Plan(comm, offsets.data());
  std::vector<uint16_t> a(4 * 3), b(4 * 3);
  EXPECT_THROW(exchange.ToOwners(comm, a.data(), b.data(), 3 * sizeof(uint16_t)),
               std::invalid_argument);
  ThreadWorld pair(2);
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.emplace_back([&, r] {
      ThreadCommunicator c(pair, r);
      ExpertExchange e(&Host(), 3);
      std::vector<int64_t> o = {0, 0, 0, 0};
      EXPECT_THROW(e.Plan(c, o.data()), std::invalid_argument);
    });
  }
  for (std::thread& t : ranks) t.join();
}

}  // namespace
}  // namespace moelab
