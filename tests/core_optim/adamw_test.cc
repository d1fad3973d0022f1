// AdamW (core/optim/adamw.cc) against the textbook equations: bias correction, decoupled
// weight decay, and the no_decay kinds.
#include "core/optim/adamw.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "tests/core_optim/reference.h"

namespace moelab {
namespace {

std::vector<ParamInfo> Params() {
  std::vector<ParamInfo> ps(3);
  ps[0] = {"embedding", ParamKind::kEmbedding, -1, 0, 1, 8, 4};
  ps[1] = {"layers.0.norm", ParamKind::kNorm, 0, 36, 1, 1, 4};  // 4-element gap before it
  ps[2] = {"layers.0.attn.wq", ParamKind::kAttnQ, 0, 40, 1, 4, 4};
  return ps;
}

TEST(AdamW, MatchesEquationsWithBiasCorrectionAndNoDecayGroups) {
  const auto ps = Params();
  const size_t n = 56;
  OptimizerConfig c;
  c.lr = 1e-2;
  c.weight_decay = 0.1;
  c.beta1 = 0.9;
  c.beta2 = 0.95;
  c.eps = 1e-8;
  c.no_decay = {"norm", "embedding"};
  AdamW opt(c, ps);

  std::mt19937_64 rng(9);
  std::normal_distribution<double> nd;
  std::vector<float> wf(n);
  for (float& x : wf) x = static_cast<float>(nd(rng));
  std::vector<double> wd(wf.begin(), wf.end());
  std::vector<testing::ReferenceAdamW> ref(ps.size());
  for (int64_t t = 1; t <= 6; ++t) {
    std::vector<float> gf(n);
    for (float& x : gf) x = static_cast<float>(0.01 * nd(rng));
    std::vector<double> gd(gf.begin(), gf.end());
    const double lr = c.lr / t;
    opt.Step(wf.data(), gf.data(), lr, t);
    for (size_t i = 0; i < ps.size(); ++i) {
      ref[i].Step(c, !testing::ReferenceNoDecay(c, ps[i]), wd.data() + ps[i].offset,
                  gd.data() + ps[i].offset, ps[i].size(), lr, t);
    }
    for (size_t i = 0; i < n; ++i)
      EXPECT_NEAR(wf[i], wd[i], 2e-6) << "index " << i << " step " << t;
  }
  // Elements outside every segment are never touched.
  for (size_t i = 32; i < 36; ++i) EXPECT_EQ(wf[i], static_cast<float>(wd[i]));
}

TEST(AdamW, FirstStepIsSignTimesLr) {
  // With bias correction, step 1 moves every weight by lr·g/(|g| + ε) ≈ lr·sign(g).
  OptimizerConfig c;
  c.weight_decay = 0;
  std::vector<ParamInfo> ps = {{"lm_head", ParamKind::kLmHead, -1, 0, 1, 2, 2}};
  AdamW opt(c, ps);
  std::vector<float> w = {0, 0, 0, 0}, g = {3.0f, -0.5f, 1e-3f, -20.0f};
  opt.Step(w.data(), g.data(), 0.1, 1);
  EXPECT_NEAR(w[0], -0.1, 1e-6);
  EXPECT_NEAR(w[1], 0.1, 1e-6);
  EXPECT_NEAR(w[2], -0.1, 1e-5);
  EXPECT_NEAR(w[3], 0.1, 1e-6);
}

TEST(AdamW, GroupsAndDecayExclusion) {
  OptimizerConfig c;
  c.no_decay = {"norm"};
  const auto ps = Params();
  EXPECT_FALSE(ExcludedFromDecay(c, ps[0]));
  EXPECT_TRUE(ExcludedFromDecay(c, ps[1]));
  AdamW opt(c, ps);
  const auto g = opt.groups();
  ASSERT_EQ(g.size(), 3u);
  EXPECT_EQ(g[0].second, "adamw");
  EXPECT_EQ(g[1].second, "adamw_no_decay");
  EXPECT_EQ(g[2].second, "adamw");
  // Decay only: zero gradient keeps m = v = 0, so w ← w·(1 − lr·λ) exactly for decayed tensors.
  std::vector<float> w(56, 1.0f), zero(56, 0.0f);
  opt.Step(w.data(), zero.data(), 0.5, 1);
  EXPECT_FLOAT_EQ(w[0], 1.0f - 0.5f * 0.1f);
  EXPECT_FLOAT_EQ(w[36], 1.0f);
  EXPECT_FLOAT_EQ(w[40], 1.0f - 0.5f * 0.1f);
}

}  // namespace
}  // namespace moelab
