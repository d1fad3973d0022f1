// The MoE dispatch plan's kernels' own source (kernels/cuda/moe_dispatch_kernels.cuh), both plans
// (scan: a block per expert; sort: the chunked counting sort), run on the CPU under
// tests/cuda_kernels/emulation/cuda_emulation.h with the launches of kernels/cuda/moe.cu, against
// cpu::MoeDispatchPlan bit for bit. Runs on every machine; the hardware's scheduling of blocks and
// warps (blocks run one after another here) only the GPU twin in moe_test.cc can check.
// clang-format off
// The emulation first: it replaces the CUDA primitives the kernel header uses.
#include "tests/cuda_kernels/emulation/cuda_emulation.h"
#include "kernels/cuda/moe_dispatch_kernels.cuh"
// clang-format on

#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cpu/moe_routing.h"

namespace moelab::cuda::dispatch {
namespace {

struct Plan {
  std::vector<int64_t> offsets;
  std::vector<int> row_token, slot_row;
};

enum class Kind { kScan, kSort };

// cuda::MoeDispatchPlan's launches (moe.cu) under the emulation. The outputs start as garbage
// (-7), as device memory would, so a row or offset the kernels leave unwritten shows.
Plan RunPlan(Kind kind, const std::vector<int>& topk, int n, int E, int k) {
  const int chunks = PlanChunks(n, E, k);
  const long nk = static_cast<long>(n) * k;
  Plan p{std::vector<int64_t>(E + 1, -7), std::vector<int>(nk, -7), std::vector<int>(nk, -7)};
  const int* ids = topk.data();
  if (kind == Kind::kScan) {
    emu::Launch(dim3(E), kScanPlanThreads, 0,
                [&] { CountExpertKernel(ids, nk, p.offsets.data()); });
    emu::Launch(dim3(1), 32, 0, [&] { ScanOffsetsKernel(p.offsets.data(), E); });
    emu::Launch(dim3(E), kScanPlanThreads, 0, [&] {
      ScatterExpertKernel(ids, nk, k, p.offsets.data(), p.row_token.data(), p.slot_row.data());
    });
    return p;
  }
  CheckSortExperts(E);
  const long total = static_cast<long>(E) * chunks;
  std::vector<int> counts(total, -7);
  const size_t per_expert = sizeof(int) * E;
  emu::Launch(dim3(chunks), kCountThreads, per_expert,
              [&] { ChunkCountKernel(ids, nk, E, chunks, counts.data()); });
  emu::Launch(dim3(1), kScanThreads, 0, [&] {
    ScanChunkCountsKernel(counts.data(), total, E, chunks, nk, p.offsets.data());
  });
  emu::Launch(dim3(chunks), kScatterThreads, per_expert, [&] {
    ChunkScatterKernel(ids, nk, k, E, chunks, counts.data(), p.row_token.data(), p.slot_row.data());
  });
  return p;
}

struct Case {
  const char* what;
  int n, E, k;
  int used;    // the experts drawn are in [0, used): the others get no rows
  int single;  // >= 0: every assignment goes to this expert
  bool scan;   // the scan plan too (emulated, it costs a 256-thread block per expert)
};

// k distinct experts per token, skewed toward low ids (uneven loads), or all on one expert (then
// a token's k slots repeat it: the plan does not care).
std::vector<int> Routing(const Case& c) {
  std::mt19937 rng(c.n * 131 + c.E);
  std::vector<int> topk(static_cast<size_t>(c.n) * c.k);
  for (int t = 0; t < c.n; ++t) {
    std::vector<int> ids;
    while (static_cast<int>(ids.size()) < c.k) {
      const int e =
          c.single >= 0 ? c.single : static_cast<int>(std::min(rng() % c.used, rng() % c.used));
      if (c.single >= 0 || std::find(ids.begin(), ids.end(), e) == ids.end()) ids.push_back(e);
    }
    std::copy(ids.begin(), ids.end(), topk.begin() + static_cast<long>(t) * c.k);
  }
  return topk;
}

// Every case against the CPU's plan, the sort plan always, the scan plan on the small ones (its
// emulation costs a 256-thread block per expert, about 0.1 s each here; the scan plan has run on
// a GPU). n·k against the sort's chunks of 1024: 2 (one partial chunk), 300, 1100 (a full and a
// partial chunk), 2048 (two full), 10400 over 70 experts (ten full chunks and a partial; E not a
// multiple of 32), 4000 over 300 experts (more experts than a block has threads, so the tallies'
// loops wrap). Against the scan's blocks of 256: one partial block up to eight full ones.
TEST(DispatchEmulation, BothPlansAreTheCpuStableOrder) {
  const Case cases[] = {
      {"one token", 1, 4, 2, 4, -1, true},
      {"no tokens", 0, 5, 2, 5, -1, true},
      {"one expert", 300, 1, 1, 1, -1, true},
      {"every assignment to expert 2", 300, 4, 1, 4, 2, true},
      {"two full chunks, expert 7 empty", 1024, 8, 2, 7, -1, true},
      {"every assignment to expert 5, two chunks", 550, 16, 2, 16, 5, false},
      {"70 experts, 10 empty, 11 chunks", 2600, 70, 4, 60, -1, false},
      {"300 experts", 500, 300, 8, 300, -1, false},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    const auto topk = Routing(c);
    Plan want{std::vector<int64_t>(c.E + 1), std::vector<int>(topk.size()),
              std::vector<int>(topk.size())};
    cpu::MoeDispatchPlan(topk.data(), c.n, c.E, c.k, want.offsets.data(), want.row_token.data(),
                         want.slot_row.data());
    for (Kind kind : {Kind::kScan, Kind::kSort}) {
      if (kind == Kind::kScan && !c.scan) continue;
      SCOPED_TRACE(kind == Kind::kScan ? "scan" : "sort");
      const Plan got = RunPlan(kind, topk, c.n, c.E, c.k);
      EXPECT_EQ(got.offsets, want.offsets);
      EXPECT_EQ(got.row_token, want.row_token);
      EXPECT_EQ(got.slot_row, want.slot_row);
    }
  }
}

// The bounds both plans check before any launch: rows are ints, so n·k < 2^31; the sort plan's
// per-expert tallies fit 48 KiB of shared memory.
TEST(DispatchEmulation, PlanBoundsAreCheckedBeforeAnyLaunch) {
  EXPECT_EQ(PlanChunks(0, 4, 2), 1);
  EXPECT_EQ(PlanChunks(1024, 4, 1), 1);
  EXPECT_EQ(PlanChunks(1025, 4, 1), 2);
  EXPECT_EQ(PlanChunks(32768, 64, 8), 256);  // gpu-moe's shape
  EXPECT_EQ(PlanChunks(INT_MAX, 4, 1), (INT_MAX / 1024) + 1);
  auto message = [](auto f) {
    try {
      f();
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("no exception");
  };
  EXPECT_NE(message([] { PlanChunks(1 << 28, 64, 8); }).find("2^31"), std::string::npos);
  EXPECT_NE(message([] { PlanChunks(10, 0, 2); }).find("experts >= 1"), std::string::npos);
  EXPECT_NE(message([] { PlanChunks(-1, 4, 2); }).find("n >= 0"), std::string::npos);
  EXPECT_NO_THROW(CheckSortExperts(kMaxSortExperts));
  EXPECT_NE(message([] {
              CheckSortExperts(kMaxSortExperts + 1);
            }).find("train.kernels.dispatch \"sort\""),
            std::string::npos);
}

// The emulated warp primitives the plans use, against their CUDA definitions on known values:
// one block of two warps, each lane recording its answers.
TEST(DispatchEmulation, WarpVotesMatchesAndScansFollowCuda) {
  constexpr int kThreads = 64;
  std::vector<unsigned> ballot(kThreads), match(kThreads);
  std::vector<int> scan(kThreads), ffs(kThreads), popc(kThreads);
  emu::Launch(dim3(1), kThreads, 0, [&] {
    const int t = threadIdx.x, lane = t & 31;
    ballot[t] = __ballot_sync(0xffffffffu, lane % 3 == 0 || t == 40);
    match[t] = __match_any_sync(0xffffffffu, lane % 5 + (t >= 32 && lane == 7 ? 100 : 0));
    scan[t] = WarpInclusiveScan(lane + 1 + t / 32);
    ffs[t] = __ffs(static_cast<int>(match[t]));
    popc[t] = __popc(match[t]);
  });
  for (int t = 0; t < kThreads; ++t) {
    SCOPED_TRACE(t);
    const int lane = t % 32, warp = t / 32;
    unsigned want_ballot = 0, want_match = 0;
    for (int l = 0; l < 32; ++l) {
      const int u = warp * 32 + l;
      if (l % 3 == 0 || u == 40) want_ballot |= 1u << l;
      const bool odd_self = warp == 1 && lane == 7, odd_other = warp == 1 && l == 7;
      if (l % 5 == lane % 5 && odd_self == odd_other) want_match |= 1u << l;
    }
    EXPECT_EQ(ballot[t], want_ballot);
    EXPECT_EQ(match[t], want_match);
    EXPECT_EQ(scan[t], (lane + 1) * (lane + 2) / 2 + (lane + 1) * warp);
    EXPECT_EQ(ffs[t], (warp == 1 && lane == 7) ? 8 : lane % 5 + 1);
    EXPECT_EQ(popc[t], __builtin_popcount(want_match));
  }
  EXPECT_EQ(__ffs(0), 0);
}

}  // namespace
}  // namespace moelab::cuda::dispatch
