// MoE routing, dispatch/combine and expert twins against kernels/cpu, fp32 (and the bf16 expert
// path and bf16 expert rows in dispatch/combine against fp32).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/cpu/moe_experts.h"
#include "kernels/cpu/moe_routing.h"
#include "kernels/cuda/moe_experts.h"
#include "kernels/cuda/moe_experts_cudnn.h"
#include "kernels/cuda/moe_routing.h"
#include "tests/common/test_util.h"
#include "tests/cuda_kernels/cuda_test_util.h"

namespace moelab::cuda {
namespace {

using testing::ExpectNear;
using testing::Random;
using testing::TimeMs;
using testing::ToBf16;
using testing::ToDevice;
using testing::ToFloat;

struct Routed {
  std::vector<float> scores, gates;
  std::vector<int> topk;
  std::vector<int64_t> counts;
};

class CudaMoeRoute : public ::testing::TestWithParam<bool> {};  // param: sigmoid

TEST_P(CudaMoeRoute, RouteAuxAndBackwardMatchCpu) {
  MOELAB_REQUIRE_GPU();
  const bool sigmoid = GetParam();
  const int n = 150, E = 16, k = 4;
  const double route_scale = 2.5, aux = 0.01;
  const auto logits = Random(size_t(n) * E, 1, -3.0f, 3.0f);
  const auto bias = Random(E, 2, -0.05f, 0.05f);
  const auto dgates = Random(size_t(n) * k, 3);
  Routed c{std::vector<float>(n * E), std::vector<float>(n * k), std::vector<int>(n * k),
           std::vector<int64_t>(E)};
  cpu::MoeRoute(logits.data(), n, E, k, sigmoid, bias.data(), route_scale, c.scores.data(),
                c.topk.data(), c.gates.data(), c.counts.data());
  const double aux_loss = cpu::MoeAuxLoss(c.scores.data(), c.counts.data(), n, E, k, sigmoid, aux);
  std::vector<float> dlogits(size_t(n) * E);
  cpu::MoeRouteBackward(c.scores.data(), c.topk.data(), dgates.data(), c.counts.data(), n, E, k,
                        sigmoid, route_scale, aux, dlogits.data());

  auto glogits = ToDevice(logits), gbias = ToDevice(bias), gdgates = ToDevice(dgates);
  DeviceBuffer<float> gscores(n * E), ggates(n * k), gdlogits(n * E);
  DeviceBuffer<int> gtopk(n * k);
  DeviceBuffer<int64_t> gcounts(E);
  MoeRoute(glogits.data(), n, E, k, sigmoid, gbias.data(), route_scale, gscores.data(),
           gtopk.data(), ggates.data(), gcounts.data());
  // expf on both sides (≤ 1 ulp apart): with random logits no near-ties, so the choice is equal.
  EXPECT_EQ(gtopk.Download(), c.topk);
  EXPECT_EQ(gcounts.Download(), c.counts);
  ExpectNear(gscores.Download(), c.scores, 1e-7, 1e-6, "scores");
  ExpectNear(ggates.Download(), c.gates, 1e-7, 1e-6, "gates");
  const double gaux = MoeAuxLoss(gscores.data(), gcounts.data(), n, E, k, sigmoid, aux);
  EXPECT_NEAR(gaux, aux_loss, 1e-6 * std::abs(aux_loss));
  // The score sums a global-batch hook receives: Σ_t of the normalised scores, per expert.
  std::vector<double> sums(E, 0.0), gsums(E, -1.0);
  for (int t = 0; t < n; ++t) {
    const float* s = c.scores.data() + size_t(t) * E;
    double total = 1.0;
    if (sigmoid) {
      total = 0;
      for (int e = 0; e < E; ++e) total += s[e];
    }
    for (int e = 0; e < E; ++e) sums[e] += static_cast<double>(s[e]) / total;
  }
  MoeScoreSums(gscores.data(), n, E, sigmoid, gsums.data());
  for (int e = 0; e < E; ++e) EXPECT_NEAR(gsums[e], sums[e], 1e-6 * sums[e] + 1e-9) << e;
  MoeRouteBackward(gscores.data(), gtopk.data(), gdgates.data(), gcounts.data(), n, E, k, sigmoid,
                   route_scale, aux, gdlogits.data());
  ExpectNear(gdlogits.Download(), dlogits, 1e-6, 1e-5, "dlogits");
}

INSTANTIATE_TEST_SUITE_P(SoftmaxAndSigmoid, CudaMoeRoute, ::testing::Values(false, true));

TEST(CudaMoeDispatch, PlanGatherCombineMatchCpu) {
  MOELAB_REQUIRE_GPU();
  const int n = 700, E = 8, k = 3, d = 24;  // 2100 assignments: several scan chunks per expert
  std::mt19937 rng(4);
  std::vector<int> topk(size_t(n) * k);
  for (int t = 0; t < n; ++t) {
    // k distinct experts per token, skewed toward low ids (uneven loads, one expert unused).
    std::vector<int> ids;
    while (static_cast<int>(ids.size()) < k) {
      const int e = std::min<int>(rng() % E, rng() % E) % (E - 1);
      if (std::find(ids.begin(), ids.end(), e) == ids.end()) ids.push_back(e);
    }
    for (int s = 0; s < k; ++s) topk[size_t(t) * k + s] = ids[s];
  }
  std::vector<int64_t> offsets(E + 1);
  std::vector<int> row_token(size_t(n) * k), slot_row(size_t(n) * k);
  cpu::MoeDispatchPlan(topk.data(), n, E, k, offsets.data(), row_token.data(), slot_row.data());
  auto gtopk = ToDevice(topk);
  DeviceBuffer<int64_t> goffsets(E + 1);
  DeviceBuffer<int> grow_token(row_token.size()), gslot_row(slot_row.size());
  MoeDispatchPlan(gtopk.data(), n, E, k, goffsets.data(), grow_token.data(), gslot_row.data());
  EXPECT_EQ(goffsets.Download(), offsets);
  EXPECT_EQ(grow_token.Download(), row_token);  // stable order: exactly the CPU's
  EXPECT_EQ(gslot_row.Download(), slot_row);
  std::vector<int64_t> host_offsets(E + 1);
  DownloadOffsets(goffsets.data(), E, host_offsets.data());
  EXPECT_EQ(host_offsets, offsets);

  const int64_t rows = int64_t(n) * k;
  const auto x = Random(size_t(n) * d, 5), ye = Random(size_t(rows) * d, 6),
             gates = Random(size_t(n) * k, 7), dy = Random(size_t(n) * d, 8);
  std::vector<float> xe(size_t(rows) * d), y = Random(size_t(n) * d, 9), dx = Random(x.size(), 10),
                                           dye(ye.size()), dgates(gates.size());
  auto gx = ToDevice(x), gye = ToDevice(ye), ggates = ToDevice(gates), gdy = ToDevice(dy),
       gy = ToDevice(y), gdx = ToDevice(dx);
  cpu::MoeGather(x.data(), d, row_token.data(), rows, xe.data());
  cpu::MoeCombine(ye.data(), slot_row.data(), gates.data(), n, k, d, y.data(), true);
  cpu::MoeGatherBackward(ye.data(), slot_row.data(), n, k, d, dx.data(), true);
  cpu::MoeCombineBackward(dy.data(), ye.data(), slot_row.data(), gates.data(), n, k, d, dye.data(),
                          dgates.data());
  DeviceBuffer<float> gxe(xe.size()), gdye(dye.size()), gdgates(dgates.size());
  MoeGather(gx.data(), d, grow_token.data(), rows, gxe.data());
  MoeCombine(gye.data(), gslot_row.data(), ggates.data(), n, k, d, gy.data(), true);
  MoeGatherBackward(gye.data(), gslot_row.data(), n, k, d, gdx.data(), true);
  MoeCombineBackward(gdy.data(), gye.data(), gslot_row.data(), ggates.data(), n, k, d, gdye.data(),
                     gdgates.data());
  EXPECT_EQ(gxe.Download(), xe);  // copies
  // Same additions in slot order (no FMA on the GPU side): equal to the last bit or 1 ulp.
  ExpectNear(gy.Download(), y, 1e-6, 1e-6, "combine");
  ExpectNear(gdx.Download(), dx, 1e-6, 1e-6, "gather backward");
  EXPECT_EQ(gdye.Download(), dye);  // one product per element
  ExpectNear(gdgates.Download(), dgates, 1e-6, 1e-6, "dgates");
}

// Both plans (train.kernels.dispatch's scan and sort, chosen here by argument) against the CPU's
// stable order over more experts than a warp has lanes, experts with no rows, many sort chunks
// (1024 assignments each) with a partial last one, exactly full chunks, and the degenerate layouts:
// one token, one expert, every assignment on one expert. The sort plan's kernels are checked under
// the CPU emulation too (dispatch_emulation_test.cc); this is where the hardware runs them.
TEST(CudaMoeDispatch, BothPlansAreTheCpuStableOrderAcrossChunks) {
  MOELAB_REQUIRE_GPU();
  struct Case {
    int n, E, k, used;
    bool one_expert;
  };
  for (const Case& c :
       {Case{1, 4, 2, 4, false}, Case{2600, 70, 4, 60, false}, Case{3000, 16, 1, 16, true},
        Case{1024, 8, 2, 8, false}, Case{300, 1, 1, 1, false}, Case{32768, 64, 8, 64, false}}) {
    SCOPED_TRACE(::testing::Message() << "n " << c.n << " E " << c.E << " k " << c.k);
    std::mt19937 rng(c.n);
    std::vector<int> topk(size_t(c.n) * c.k);
    for (int t = 0; t < c.n; ++t) {
      std::vector<int> ids;
      while (static_cast<int>(ids.size()) < c.k) {
        const int e = c.one_expert ? 5 : static_cast<int>(std::min(rng() % c.used, rng() % c.used));
        if (std::find(ids.begin(), ids.end(), e) == ids.end()) ids.push_back(e);
      }
      for (int s = 0; s < c.k; ++s) topk[size_t(t) * c.k + s] = ids[s];
    }
    std::vector<int64_t> offsets(c.E + 1);
    std::vector<int> row_token(topk.size()), slot_row(topk.size());
    cpu::MoeDispatchPlan(topk.data(), c.n, c.E, c.k, offsets.data(), row_token.data(),
                         slot_row.data());
    auto gtopk = ToDevice(topk);
    for (MoeDispatch kind : {MoeDispatch::kScan, MoeDispatch::kSort}) {
      SCOPED_TRACE(kind == MoeDispatch::kScan ? "scan" : "sort");
      DeviceBuffer<int64_t> goffsets(c.E + 1);
      DeviceBuffer<int> grow_token(row_token.size()), gslot_row(slot_row.size());
      MoeDispatchPlan(gtopk.data(), c.n, c.E, c.k, goffsets.data(), grow_token.data(),
                      gslot_row.data(), kind);
      EXPECT_EQ(goffsets.Download(), offsets);
      EXPECT_EQ(grow_token.Download(), row_token);
      EXPECT_EQ(gslot_row.Download(), slot_row);
    }
  }
}

// The plan alone at gpu-moe's shape (64 experts, top-8; 16384 tokens a micro-batch in the bench,
// 32768 the whole batch): ms per call of each kind, on a routing like the bench's (8 distinct
// experts a token, skewed toward low ids) and on a collapsed one (every token on experts 0..7, so
// the sort's tallies contend and 56 experts get no rows). Prints; asserts only that the two kinds
// agree (a benchmark, not a timed test).
TEST(CudaMoeDispatchBench, BothPlansAtGpuMoeShape) {
  MOELAB_REQUIRE_GPU();
  const int E = 64, k = 8;
  for (int n : {16384, 32768}) {
    for (bool collapsed : {false, true}) {
      std::mt19937 rng(n);
      std::vector<int> topk(size_t(n) * k);
      for (int t = 0; t < n; ++t) {
        std::vector<int> ids;
        while (static_cast<int>(ids.size()) < k) {
          const int e = collapsed ? static_cast<int>(ids.size())
                                  : static_cast<int>(std::min(rng() % E, rng() % E));
          if (std::find(ids.begin(), ids.end(), e) == ids.end()) ids.push_back(e);
        }
        std::copy(ids.begin(), ids.end(), topk.begin() + size_t(t) * k);
      }
      auto gtopk = ToDevice(topk);
      DeviceBuffer<int64_t> goffsets(E + 1);
      DeviceBuffer<int> grow_token(topk.size()), gslot_row(topk.size());
      double ms[2];
      std::vector<int> slot_row[2];
      for (MoeDispatch kind : {MoeDispatch::kScan, MoeDispatch::kSort}) {
        const int i = kind == MoeDispatch::kSort;
        ms[i] = TimeMs(
            [&] {
              MoeDispatchPlan(gtopk.data(), n, E, k, goffsets.data(), grow_token.data(),
                              gslot_row.data(), kind);
            },
            20);
        slot_row[i] = gslot_row.Download();
      }
      EXPECT_EQ(slot_row[0], slot_row[1]);
      std::printf("[dispatch plan] n %d, k %d, E %d, %s routing: scan %.4f ms, sort %.4f ms\n", n,
                  k, E, collapsed ? "collapsed" : "skewed", ms[0], ms[1]);
    }
  }
}

// The plan follows the installed selection at every call (no GPU needed): scan by default.
TEST(CudaMoeDispatch, PlanFollowsTheSelection) {
  EXPECT_EQ(MoeDispatchInUse(), MoeDispatch::kScan);
  KernelSelection k;
  k.dispatch_sort = true;
  {
    const ScopedKernelSelection use(k);
    EXPECT_EQ(MoeDispatchInUse(), MoeDispatch::kSort);
    // A second selection alive at once must agree (a second model's launches would run these).
    EXPECT_THROW(ScopedKernelSelection(KernelSelection{}), std::logic_error);
    const ScopedKernelSelection same(k);
    EXPECT_EQ(MoeDispatchInUse(), MoeDispatch::kSort);
  }
  EXPECT_EQ(MoeDispatchInUse(), MoeDispatch::kScan);
}

// What the plan cannot hold is refused before anything touches the device (so no GPU is needed,
// and the null pointers are never read): 2^31 assignments for both kinds, 20000 experts for sort.
TEST(CudaMoeDispatch, RefusesShapesBeforeAnyLaunch) {
  for (MoeDispatch kind : {MoeDispatch::kScan, MoeDispatch::kSort}) {
    EXPECT_THROW(MoeDispatchPlan(nullptr, 1 << 28, 64, 8, nullptr, nullptr, nullptr, kind),
                 std::invalid_argument);
    EXPECT_THROW(MoeDispatchPlan(nullptr, 16, 0, 8, nullptr, nullptr, nullptr, kind),
                 std::invalid_argument);
  }
  EXPECT_THROW(
      MoeDispatchPlan(nullptr, 16, 20000, 8, nullptr, nullptr, nullptr, MoeDispatch::kSort),
      std::invalid_argument);
}

// bf16 mode's dispatch side: bf16 expert rows (ye, dxe, dye), fp32 tokens and gates. On
// bf16-representable rows the sums are the fp32 kernels' to the last bit (same order, exact
// widening), and dye is the fp32 g·dy rounded once to bf16.
TEST(CudaMoeDispatch, Bf16ExpertRowsMatchFp32Kernels) {
  MOELAB_REQUIRE_GPU();
  const int n = 300, E = 6, k = 2, d = 40;
  std::mt19937 rng(21);
  std::vector<int> topk(size_t(n) * k);
  for (int t = 0; t < n; ++t) {
    const int a = rng() % E;
    topk[size_t(t) * k] = a;
    topk[size_t(t) * k + 1] = (a + 1 + rng() % (E - 1)) % E;
  }
  auto gtopk = ToDevice(topk);
  DeviceBuffer<int64_t> goffsets(E + 1);
  DeviceBuffer<int> grow_token(size_t(n) * k), gslot_row(size_t(n) * k);
  MoeDispatchPlan(gtopk.data(), n, E, k, goffsets.data(), grow_token.data(), gslot_row.data());
  const int64_t rows = int64_t(n) * k;
  // Rows rounded to bf16 first, so the fp32 kernels see exactly the values the bf16 ones widen.
  const auto ye = ToFloat(ToBf16(Random(size_t(rows) * d, 31)));
  const auto gates = Random(size_t(n) * k, 32), dy = Random(size_t(n) * d, 33),
             y0 = Random(size_t(n) * d, 34), dx0 = Random(size_t(n) * d, 35);
  auto fye = ToDevice(ye), ggates = ToDevice(gates), gdy = ToDevice(dy);
  auto bye = ToDevice(ToBf16(ye));
  for (bool accumulate : {false, true}) {
    SCOPED_TRACE(accumulate ? "accumulate" : "overwrite");
    auto fy = ToDevice(y0), by = ToDevice(y0), fdx = ToDevice(dx0), bdx = ToDevice(dx0);
    MoeCombine(fye.data(), gslot_row.data(), ggates.data(), n, k, d, fy.data(), accumulate);
    MoeCombine(bye.data(), gslot_row.data(), ggates.data(), n, k, d, by.data(), accumulate);
    EXPECT_EQ(by.Download(), fy.Download());
    MoeGatherBackward(fye.data(), gslot_row.data(), n, k, d, fdx.data(), accumulate);
    MoeGatherBackward(bye.data(), gslot_row.data(), n, k, d, bdx.data(), accumulate);
    EXPECT_EQ(bdx.Download(), fdx.Download());
  }
  DeviceBuffer<float> fdye(ye.size()), fdgates(gates.size()), bdgates(gates.size());
  MoeCombineBackward(gdy.data(), fye.data(), gslot_row.data(), ggates.data(), n, k, d, fdye.data(),
                     fdgates.data());
  // In place, as the model calls it: dye overwrites ye.
  MoeCombineBackward(gdy.data(), bye.data(), gslot_row.data(), ggates.data(), n, k, d, bye.data(),
                     bdgates.data());
  EXPECT_EQ(bdgates.Download(), fdgates.Download());
  const auto want = ToFloat(ToBf16(fdye.Download()));
  EXPECT_EQ(ToFloat(bye.Download()), want);
}

// The experts' CPU reference on four experts of uneven loads, expert 1 without rows.
struct ExpertsCase {
  static constexpr int E = 4, d = 32, hidden = 48;
  const std::vector<int64_t> offsets = {0, 13, 13, 40, 47};
  const int64_t rows = offsets.back();
  const size_t ws = size_t(hidden) * d, rh = size_t(rows) * hidden;
  const std::vector<float> xe = Random(size_t(rows) * d, 11), w1 = Random(E * ws, 12, -0.3f, 0.3f),
                           w3 = Random(E * ws, 13, -0.3f, 0.3f),
                           w2 = Random(E * ws, 14, -0.3f, 0.3f), dye = Random(size_t(rows) * d, 15);
  std::vector<float> h1 = std::vector<float>(rh), h3 = h1, act = h1,
                     ye = std::vector<float>(size_t(rows) * d), dxe = ye,
                     dw1 = std::vector<float>(E * ws, 7.0f), dw3 = dw1, dw2 = dw1;
  ExpertsCase() {
    std::vector<float> scratch(2 * rh);
    cpu::MoeExpertsForward(xe.data(), offsets.data(), E, d, hidden, w1.data(), w3.data(), w2.data(),
                           h1.data(), h3.data(), act.data(), ye.data(),
                           cpu::MoeExpertSchedule::kBlasParallel);
    cpu::MoeExpertsBackward(xe.data(), offsets.data(), E, d, hidden, w1.data(), w3.data(),
                            w2.data(), h1.data(), h3.data(), act.data(), dye.data(), dxe.data(),
                            dw1.data(), dw3.data(), dw2.data(), scratch.data(),
                            cpu::MoeExpertSchedule::kBlasParallel);
  }
};

// The row moves with dispatch "sort" move 16 bytes a thread access
// (moe_rows_kernels.cuh, kVec = 8): on the device the same bits as the element-per-thread
// kernels (scan), bf16 and fp32 expert rows, at the gpu-moe width and an odd multiple of 8;
// dgates (a double dot product split differently) within 1e-6.
TEST(CudaMoeDispatch, SixteenByteRowMovesGiveTheElementKernelsBits) {
  MOELAB_REQUIRE_GPU();
  const int n = 257, E = 5, k = 3;
  std::vector<int> topk(size_t(n) * k);
  for (int t = 0; t < n; ++t) {  // distinct experts per token
    for (int s = 0; s < k; ++s) topk[size_t(t) * k + s] = (t + s) % E;
  }
  auto gtopk = ToDevice(topk);
  DeviceBuffer<int64_t> offsets(E + 1);
  DeviceBuffer<int> row_token(topk.size()), slot_row(topk.size());
  MoeDispatchPlan(gtopk.data(), n, E, k, offsets.data(), row_token.data(), slot_row.data());
  const size_t rows = topk.size();
  for (int d : {1024, 40}) {
    SCOPED_TRACE(d);
    const auto x = Random(size_t(n) * d, 41), ye = Random(rows * d, 42),
               dy = Random(size_t(n) * d, 43), gates = Random(rows, 44);
    auto gx = ToDevice(x), gye = ToDevice(ye), gdy = ToDevice(dy), ggates = ToDevice(gates);
    auto bx = ToDevice(ToBf16(x)), bye = ToDevice(ToBf16(ye));
    struct Out {
      std::vector<float> y, dx, dgates, fxe, fdye;
      std::vector<bf16> bxe, by_rows, bdye;
    };
    auto run = [&](const char* kind) {
      KernelSelection selection;
      selection.dispatch_sort = std::string(kind) == "sort";
      const ScopedKernelSelection use(selection);
      Out o;
      DeviceBuffer<float> fxe(rows * d), y(size_t(n) * d), dx(size_t(n) * d), dg(rows),
          fdye(rows * d);
      DeviceBuffer<bf16> bxe(rows * d), bdye(rows * d);
      MoeGather(gx.data(), d, row_token.data(), int64_t(rows), fxe.data());
      MoeGather(bx.data(), d, row_token.data(), int64_t(rows), bxe.data());
      MoeCombine(bye.data(), slot_row.data(), ggates.data(), n, k, d, y.data(), false);
      MoeCombine(gye.data(), slot_row.data(), ggates.data(), n, k, d, y.data(), true);
      MoeGatherBackward(bye.data(), slot_row.data(), n, k, d, dx.data(), false);
      MoeCombineBackward(gdy.data(), bye.data(), slot_row.data(), ggates.data(), n, k, d,
                         bdye.data(), dg.data());
      MoeCombineBackward(gdy.data(), gye.data(), slot_row.data(), ggates.data(), n, k, d,
                         fdye.data(), dg.data());
      o.fxe = fxe.Download(), o.bxe = bxe.Download(), o.y = y.Download(), o.dx = dx.Download();
      o.dgates = dg.Download(), o.bdye = bdye.Download(), o.fdye = fdye.Download();
      return o;
    };
    const Out one = run("scan"), eight = run("sort");
    EXPECT_EQ(eight.fxe, one.fxe);
    EXPECT_EQ(std::memcmp(eight.bxe.data(), one.bxe.data(), 2 * rows * d), 0);
    EXPECT_EQ(eight.y, one.y);
    EXPECT_EQ(eight.dx, one.dx);
    EXPECT_EQ(eight.fdye, one.fdye);
    EXPECT_EQ(std::memcmp(eight.bdye.data(), one.bdye.data(), 2 * rows * d), 0);
    ExpectNear(eight.dgates, one.dgates, 1e-6, 1e-6, "dgates");
  }
}

TEST(CudaMoeExperts, GroupedGemmsMatchCpuIncludingAnEmptyExpert) {
  MOELAB_REQUIRE_GPU();
  const ExpertsCase cs;
  const int E = cs.E, d = cs.d, hidden = cs.hidden;
  const auto& [offsets, rows, ws, rh] = std::tie(cs.offsets, cs.rows, cs.ws, cs.rh);
  const auto &xe = cs.xe, &w1 = cs.w1, &w3 = cs.w3, &w2 = cs.w2, &dye = cs.dye;
  const auto &ye = cs.ye, &dxe = cs.dxe, &dw1 = cs.dw1, &dw3 = cs.dw3, &dw2 = cs.dw2;
  auto gxe = ToDevice(xe), gw1 = ToDevice(w1), gw3 = ToDevice(w3), gw2 = ToDevice(w2),
       gdye = ToDevice(dye);
  DeviceBuffer<float> gh1(rh), gh3(rh), gact(rh), gye(ye.size()), gdxe(dxe.size()), gdw1(E * ws),
      gdw3(E * ws), gdw2(E * ws), gscratch(2 * rh);
  Fill(gdw1.data(), E * ws, 7.0f);  // stale values: the empty expert's gradient must be zeroed
  Fill(gdw3.data(), E * ws, 7.0f);
  Fill(gdw2.data(), E * ws, 7.0f);
  MoeExpertsForward(gxe.data(), offsets.data(), E, d, hidden, gw1.data(), gw3.data(), gw2.data(),
                    gh1.data(), gh3.data(), gact.data(), gye.data());
  MoeExpertsBackward(gxe.data(), offsets.data(), E, d, hidden, gw1.data(), gw3.data(), gw2.data(),
                     gh1.data(), gh3.data(), gact.data(), gdye.data(), gdxe.data(), gdw1.data(),
                     gdw3.data(), gdw2.data(), gscratch.data());
  ExpectNear(gye.Download(), ye, 1e-5, 1e-4, "ye");
  ExpectNear(gdxe.Download(), dxe, 1e-5, 1e-4, "dxe");
  ExpectNear(gdw1.Download(), dw1, 1e-5, 1e-4, "dw1");
  ExpectNear(gdw3.Download(), dw3, 1e-5, 1e-4, "dw3");
  ExpectNear(gdw2.Download(), dw2, 1e-5, 1e-4, "dw2");

  // bf16 path: bf16 activations and weights, fp32 weight gradients; within bf16 rounding of the
  // fp32 result (inputs in [-1, 1], inner dimensions ≤ 48).
  auto bxe = ToDevice(ToBf16(xe)), bw1 = ToDevice(ToBf16(w1)), bw3 = ToDevice(ToBf16(w3)),
       bw2 = ToDevice(ToBf16(w2)), bdye = ToDevice(ToBf16(dye));
  DeviceBuffer<bf16> bh1(rh), bh3(rh), bact(rh), bye(ye.size()), bdxe(dxe.size()), bscratch(2 * rh);
  MoeExpertsForward(bxe.data(), offsets.data(), E, d, hidden, bw1.data(), bw3.data(), bw2.data(),
                    bh1.data(), bh3.data(), bact.data(), bye.data());
  MoeExpertsBackward(bxe.data(), offsets.data(), E, d, hidden, bw1.data(), bw3.data(), bw2.data(),
                     bh1.data(), bh3.data(), bact.data(), bdye.data(), bdxe.data(), gdw1.data(),
                     gdw3.data(), gdw2.data(), bscratch.data());
  DeviceBuffer<float> fye(ye.size()), fdxe(dxe.size());
  CastToFloat(bye.data(), fye.data(), ye.size());
  CastToFloat(bdxe.data(), fdxe.data(), dxe.size());
  ExpectNear(fye.Download(), ye, 5e-2, 3e-2, "bf16 ye");
  ExpectNear(fdxe.Download(), dxe, 5e-2, 3e-2, "bf16 dxe");
  ExpectNear(gdw1.Download(), dw1, 5e-2, 3e-2, "bf16 dw1");
  ExpectNear(gdw2.Download(), dw2, 5e-2, 3e-2, "bf16 dw2");
}

// The chunked layout's plan (host only): chunks of 8 rows over counts 13, 0, 27, 7.
TEST(CudaMoeChunks, PlanCutsEachExpertInOrderAndBoundsThePadding) {
  const std::vector<int64_t> offsets = {0, 13, 13, 40, 47};
  const MoeChunks ch = PlanMoeChunks(offsets.data(), 4, 8);
  EXPECT_EQ(ch.rows, 8);
  EXPECT_EQ(ch.expert, (std::vector<int>{0, 0, 2, 2, 2, 2, 3}));
  EXPECT_EQ(ch.round, (std::vector<int>{0, 1, 0, 1, 2, 3, 0}));
  EXPECT_EQ(ch.rounds, 4);
  EXPECT_EQ(ch.table, (std::vector<int64_t>{0, 8, 13, 21, 29, 37, 40,       // first rows
                                            13, 13, 40, 40, 40, 40, 47}));  // their experts' ends
  EXPECT_EQ(MoeChunkRows(131072, 64), 512);  // gpu-moe: a quarter of the mean load
  EXPECT_EQ(MoeChunkRows(100, 64), 8);       // never below 8
  for (int64_t nk : {1, 100, 1000, 131072}) {
    for (int E : {1, 4, 64}) {
      std::vector<int64_t> skew(E + 1, 0);  // every row on the last expert, plus one each
      for (int e = 0; e < E; ++e) skew[e + 1] = skew[e] + (e + 1 == E ? nk : 1);
      const MoeChunks c = PlanMoeChunks(skew.data(), E, MoeChunkRows(skew[E], E));
      EXPECT_LE(int64_t(c.count()) * c.rows, MoeChunkedRows(skew[E], E)) << nk << " " << E;
    }
  }
}

// The chunked layout (batched experts, bf16 mode's default) against the CPU experts, as the
// grouped bf16 path above is checked, with an empty expert whose stale gradients must become 0;
// and the layout kernels exact: gathering chunked = chunking the compact gather, zeros in the
// padding, unchunk(chunk) = identity.
TEST(CudaMoeExperts, ChunkedLayoutMatchesCpuIncludingAnEmptyExpert) {
  MOELAB_REQUIRE_GPU();
  const ExpertsCase cs;
  const int E = cs.E, d = cs.d, hidden = cs.hidden, n = 30;
  const auto& [offsets, rows, ws] = std::tie(cs.offsets, cs.rows, cs.ws);
  const auto &xe = cs.xe, &w1 = cs.w1, &w3 = cs.w3, &w2 = cs.w2, &dye = cs.dye;
  const auto &ye = cs.ye, &dxe = cs.dxe, &dw1 = cs.dw1, &dw3 = cs.dw3, &dw2 = cs.dw2;
  for (int chunk : {8, 16}) {
    SCOPED_TRACE(chunk);
    const MoeChunks ch = PlanMoeChunks(offsets.data(), E, chunk);
    const size_t cr = size_t(ch.count()) * ch.rows;
    auto table = ToDevice(ch.table);
    // Layout kernels: the token rows of xe come from a token matrix through row_token.
    std::vector<int> row_token(rows);
    for (int64_t r = 0; r < rows; ++r) row_token[r] = static_cast<int>((r * 7) % n);
    const auto x = ToBf16(Random(size_t(n) * d, 16));
    auto gx = ToDevice(x);
    auto grow = ToDevice(row_token);
    DeviceBuffer<bf16> compact(size_t(rows) * d), chunked(cr * d), direct(cr * d),
        back(size_t(rows) * d);
    MoeGather(gx.data(), d, grow.data(), rows, compact.data());
    MoeChunkRowsOf(compact.data(), table.data(), ch.count(), ch.rows, d, chunked.data());
    MoeGatherChunked(gx.data(), d, grow.data(), table.data(), ch.count(), ch.rows, direct.data());
    MoeUnchunkRows(chunked.data(), table.data(), ch.count(), ch.rows, d, back.data());
    const auto chunked_host = chunked.Download(), direct_host = direct.Download();
    ASSERT_EQ(std::memcmp(chunked_host.data(), direct_host.data(), 2 * cr * d), 0);
    const auto compact_host = compact.Download(), back_host = back.Download();
    ASSERT_EQ(std::memcmp(compact_host.data(), back_host.data(), 2 * back_host.size()), 0);
    for (int b = 0; b < ch.count(); ++b) {
      for (int j = 0; j < ch.rows; ++j) {
        const int64_t r = ch.table[b] + j;
        const bool real = r < ch.table[ch.count() + b];
        for (int c = 0; c < d; c += 5) {
          const float v = __bfloat162float(chunked_host[(size_t(b) * ch.rows + j) * d + c]);
          const float want = real ? __bfloat162float(x[size_t(row_token[r]) * d + c]) : 0.0f;
          ASSERT_EQ(v, want) << "chunk " << b << " row " << j;
        }
      }
    }
    // The experts over the chunked layout.
    auto bxe = ToDevice(ToBf16(xe)), bw1 = ToDevice(ToBf16(w1)), bw3 = ToDevice(ToBf16(w3)),
         bw2 = ToDevice(ToBf16(w2)), bdye = ToDevice(ToBf16(dye));
    DeviceBuffer<bf16> xc(cr * d), yc(cr * d), ch1(cr * hidden), ch3(cr * hidden),
        cact(cr * hidden), cscratch(2 * cr * hidden), bye(size_t(rows) * d), bdxe(size_t(rows) * d);
    DeviceBuffer<float> gdw1(E * ws), gdw3(E * ws), gdw2(E * ws);
    Fill(gdw1.data(), E * ws, 7.0f);  // stale values: the empty expert's gradient must become 0
    Fill(gdw3.data(), E * ws, 7.0f);
    Fill(gdw2.data(), E * ws, 7.0f);
    MoeChunkRowsOf(bxe.data(), table.data(), ch.count(), ch.rows, d, xc.data());
    MoeExpertsForwardChunked(xc.data(), ch, d, hidden, bw1.data(), bw3.data(), bw2.data(),
                             ch1.data(), ch3.data(), cact.data(), yc.data());
    MoeUnchunkRows(yc.data(), table.data(), ch.count(), ch.rows, d, bye.data());
    MoeChunkRowsOf(bdye.data(), table.data(), ch.count(), ch.rows, d, yc.data());
    MoeExpertsBackwardChunked(xc.data(), ch, E, d, hidden, bw1.data(), bw3.data(), bw2.data(),
                              ch1.data(), ch3.data(), cact.data(), yc.data(), yc.data(),
                              gdw1.data(), gdw3.data(), gdw2.data(), cscratch.data());
    MoeUnchunkRows(yc.data(), table.data(), ch.count(), ch.rows, d, bdxe.data());
    DeviceBuffer<float> fye(ye.size()), fdxe(dxe.size());
    CastToFloat(bye.data(), fye.data(), ye.size());
    CastToFloat(bdxe.data(), fdxe.data(), dxe.size());
    ExpectNear(fye.Download(), ye, 5e-2, 3e-2, "chunked ye");
    ExpectNear(fdxe.Download(), dxe, 5e-2, 3e-2, "chunked dxe");
    ExpectNear(gdw1.Download(), dw1, 5e-2, 3e-2, "chunked dw1");
    ExpectNear(gdw3.Download(), dw3, 5e-2, 3e-2, "chunked dw3");
    ExpectNear(gdw2.Download(), dw2, 5e-2, 3e-2, "chunked dw2");
    const auto empty = gdw2.Download();
    for (size_t i = ws; i < 2 * ws; ++i) ASSERT_EQ(empty[i], 0.0f) << "empty expert's dw2 " << i;
  }
}

// The experts' forward with its grouped products on cuDNN (experts "cudnn"; the backward
// is MoeExpertsBackward<bf16>'s): the CPU twin within bf16 rounding, the expert offsets on the
// device, one expert without rows.
TEST(CudaMoeExperts, CudnnGroupedProductsMatchCpuIncludingAnEmptyExpert) {
  MOELAB_REQUIRE_GPU();
  std::string why;
  if (!CudnnGroupedMatmulAvailable(&why)) GTEST_SKIP() << "cuDNN test skipped: " << why;
  const ExpertsCase cs;
  const int E = cs.E, d = cs.d, hidden = cs.hidden;
  const auto& [offsets, rows, rh] = std::tie(cs.offsets, cs.rows, cs.rh);
  auto bxe = ToDevice(ToBf16(cs.xe)), bw1 = ToDevice(ToBf16(cs.w1)), bw3 = ToDevice(ToBf16(cs.w3)),
       bw2 = ToDevice(ToBf16(cs.w2));
  auto goffsets = ToDevice(offsets);
  DeviceBuffer<int32_t> first_row(E);
  MoeFirstRows(goffsets.data(), E, first_row.data());
  const std::vector<int32_t> first = first_row.Download();
  for (int e = 0; e < E; ++e) ASSERT_EQ(first[e], offsets[e]) << e;
  DeviceBuffer<bf16> h1(rh), h3(rh), act(rh), ye(size_t(rows) * d);
  MoeExpertsCudnn experts(E, rows, d, hidden);
  experts.Forward(bxe.data(), first_row.data(), bw1.data(), bw3.data(), bw2.data(), h1.data(),
                  h3.data(), act.data(), ye.data());
  DeviceBuffer<float> fact(rh), fye(cs.ye.size());
  CastToFloat(act.data(), fact.data(), rh);
  CastToFloat(ye.data(), fye.data(), cs.ye.size());
  ExpectNear(fact.Download(), cs.act, 5e-2, 3e-2, "cuDNN act");
  ExpectNear(fye.Download(), cs.ye, 5e-2, 3e-2, "cuDNN ye");
}

}  // namespace
}  // namespace moelab::cuda
