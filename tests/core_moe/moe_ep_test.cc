// Expert parallelism inside MoeLayer (SetMoeExpertParallel): P ranks run as threads of this
// process over an in-memory all-to-all, each with its own tokens, and together must compute what
// one layer computes on all their tokens: the same outputs and input gradients, the owned
// experts' weight gradients (zero for the others), and per-rank router/shared gradients that sum
// to the single layer's.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <thread>
#include <vector>

#include "core/comm/communicator.h"
#include "core/model/cpu_moe.h"
#include "tests/common/tiny_configs.h"
#include "tests/core_moe/thread_communicator.h"

namespace moelab {
namespace {

constexpr int kD = 8, kH = 12, kE = 4, kK = 2, kS = 1, kN = 10;  // kN tokens per rank

struct Params {
  std::vector<float> router, w1, w3, w2, sw1, sw3, sw2;
  explicit Params(bool random, uint32_t seed = 1) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.0f, 0.3f);
    auto fill = [&](std::vector<float>& v, size_t n) {
      v.resize(n);
      for (float& x : v) x = random ? nd(rng) : 0.0f;
    };
    fill(router, kE * kD);
    fill(w1, kE * kH * kD);
    fill(w3, kE * kH * kD);
    fill(w2, kE * kD * kH);
    fill(sw1, kS * kH * kD);
    fill(sw3, kS * kH * kD);
    fill(sw2, kS * kD * kH);
  }
  MoeWeights<float> view() {
    return {router.data(), w1.data(), w3.data(), w2.data(), sw1.data(), sw3.data(), sw2.data()};
  }
};

MoEConfig Moe() {
  MoEConfig c;
  test::UseMoe(&c, {.experts = kE, .top_k = kK, .shared = kS, .hidden = kH});
  c.router = "sigmoid";
  c.balance = "aux_free";
  return c;
}

void ExpectNear(const float* a, const float* b, size_t n, double tol, const char* what) {
  double worst = 0;
  for (size_t i = 0; i < n; ++i) worst = std::max(worst, std::abs(double(a[i]) - b[i]));
  EXPECT_LT(worst, tol) << what;
}

TEST(MoeExpertParallel, RanksAsThreadsMatchOneLayer) {
  for (int P : {2, 4}) {
    ModelConfig model;
    model.d_model = kD;
    Params w(true);
    std::mt19937 rng(7);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<float> x(static_cast<size_t>(P) * kN * kD), dy(x.size());
    for (float& v : x) v = nd(rng);
    for (float& v : dy) v = nd(rng);

    // One layer on all P·kN tokens.
    CpuMoeLayer<float> one(model, Moe());
    std::vector<float> y_ref(x.size()), dx_ref(x.size());
    std::vector<int64_t> counts_ref(kE);
    Params g_ref(false);
    one.Forward(w.view(), nullptr, x.data(), P * kN, y_ref.data(), counts_ref.data());
    one.Backward(w.view(), g_ref.view(), x.data(), dy.data(), P * kN, dx_ref.data());

    // P ranks, kN tokens each.
    ThreadWorld world(P);
    std::vector<std::vector<float>> y(P, std::vector<float>(kN * kD)), dx = y;
    std::vector<Params> g(P, Params(false));
    std::vector<std::vector<int64_t>> counts(P, std::vector<int64_t>(kE));
    std::vector<std::thread> ranks;
    for (int r = 0; r < P; ++r) {
      ranks.emplace_back([&, r] {
        ThreadCommunicator comm(world, r);
        SetMoeExpertParallel(&comm);
        CpuMoeLayer<float> layer(model, Moe());
        const float* xr = x.data() + static_cast<size_t>(r) * kN * kD;
        for (int rep = 0; rep < 2; ++rep) {  // a second step reuses the buffers
          layer.Forward(w.view(), nullptr, xr, kN, y[r].data(), counts[r].data());
          layer.Backward(w.view(), g[r].view(), xr, dy.data() + static_cast<size_t>(r) * kN * kD,
                         kN, dx[r].data());
        }
        SetMoeExpertParallel(nullptr);
      });
    }
    for (std::thread& t : ranks) t.join();

    for (int r = 0; r < P; ++r) {
      const size_t off = static_cast<size_t>(r) * kN * kD;
      ExpectNear(y[r].data(), y_ref.data() + off, kN * kD, 1e-5, "y");
      ExpectNear(dx[r].data(), dx_ref.data() + off, kN * kD, 1e-5, "dx");
      // Expert e is owned by rank e / (E/P): its gradient there, zero elsewhere.
      const size_t wsize = kH * kD;
      for (int e = 0; e < kE; ++e) {
        const bool owned = e / (kE / P) == r;
        for (auto [mine, ref] : {std::pair{&g[r].w1, &g_ref.w1}, std::pair{&g[r].w3, &g_ref.w3},
                                 std::pair{&g[r].w2, &g_ref.w2}}) {
          const float* m = mine->data() + e * wsize;
          if (owned) {
            ExpectNear(m, ref->data() + e * wsize, wsize, 1e-5, "owned expert grad");
          } else {
            EXPECT_TRUE(std::all_of(m, m + wsize, [](float v) { return v == 0.0f; }))
                << "rank " << r << " expert " << e;
          }
        }
      }
    }
    // Router and shared gradients are per rank (their tokens): they sum to one layer's.
    for (auto member : {&Params::router, &Params::sw1, &Params::sw3, &Params::sw2}) {
      std::vector<float> sum((g_ref.*member).size(), 0.0f);
      for (int r = 0; r < P; ++r) {
        for (size_t i = 0; i < sum.size(); ++i) sum[i] += (g[r].*member)[i];
      }
      ExpectNear(sum.data(), (g_ref.*member).data(), sum.size(), 1e-4, "router/shared grad");
    }
    // Counts stay local (the trainer sums them over ranks for the bias update).
    for (int e = 0; e < kE; ++e) {
      int64_t total = 0;
      for (int r = 0; r < P; ++r) total += counts[r][e];
      EXPECT_EQ(total, counts_ref[e]);
    }
  }
}

}  // namespace
}  // namespace moelab
