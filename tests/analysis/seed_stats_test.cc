// The seed-level primitives (analysis/seed_stats.h) against values known in closed form, and the
// pre-registered sparsity slope β (analysis/sparsity_slope.h) against a table with a known β.
#include "analysis/seed_stats.h"

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>

#include "analysis/sparsity_slope.h"

namespace moelab::analysis {
namespace {

using ::testing::HasSubstr;

// Two-sided table values (R: qt(p, df)).
TEST(SeedStats, StudentTQuantileMatchesTables) {
  EXPECT_NEAR(StudentTQuantile(0.95, 1), 6.313752, 1e-6);
  EXPECT_NEAR(StudentTQuantile(0.95, 2), 2.919986, 1e-6);
  EXPECT_NEAR(StudentTQuantile(0.95, 3), 2.353363, 1e-6);
  EXPECT_NEAR(StudentTQuantile(0.95, 7), 1.894579, 1e-6);
  EXPECT_NEAR(StudentTQuantile(0.95, 11), 1.795885, 1e-6);
  EXPECT_NEAR(StudentTQuantile(0.975, 3), 3.182446, 1e-6);
  EXPECT_NEAR(StudentTQuantile(0.995, 4), 4.604095, 1e-6);
  EXPECT_NEAR(StudentTQuantile(0.975, 40), 2.021075, 1e-6);
  EXPECT_NEAR(StudentTQuantile(0.05, 5), -2.015048, 1e-6);
  EXPECT_NEAR(StudentTCdf(1.0, 1), 0.75, 1e-12);  // Cauchy
  EXPECT_NEAR(StudentTCdf(0.0, 6), 0.5, 1e-12);
}

TEST(SeedStats, TIntervalIsMeanPlusMinusTSe) {
  const Estimate e = TInterval({1, 2, 3, 4}, 0.90);
  const double half = 2.353363 * std::sqrt(5.0 / 3.0) / 2;  // sd² = 5/3, √n = 2
  EXPECT_NEAR(e.estimate, 2.5, 1e-12);
  EXPECT_NEAR(e.lo, 2.5 - half, 1e-6);
  EXPECT_NEAR(e.hi, 2.5 + half, 1e-6);
  EXPECT_TRUE(std::isnan(TInterval({1}, 0.9).lo));
}

// The smallest exact p with n seeds all on one side is 2/2ⁿ: 3 seeds can never reach 0.10.
TEST(SeedStats, SignFlipPIsExact) {
  EXPECT_DOUBLE_EQ(SignFlipP({0.1, 0.2, 0.3}), 0.25);
  EXPECT_DOUBLE_EQ(SignFlipP({0.1, 0.2, 0.3, 0.4}), 0.125);
  EXPECT_DOUBLE_EQ(SignFlipP({0.1, -0.1}), 1.0);
  // Mixed signs: the share of the 16 assignments with |sum| ≥ 3.5, counted here by brute force.
  const std::vector<double> v = {3, 1, -1, 0.5};
  int hits = 0;
  for (int m = 0; m < 16; ++m) {
    double s = 0;
    for (int i = 0; i < 4; ++i) s += (m >> i & 1) ? -v[i] : v[i];
    hits += std::abs(s) >= 3.5 - 1e-12;
  }
  EXPECT_DOUBLE_EQ(SignFlipP(v), hits / 16.0);
  // Beyond 20 values: Monte Carlo, still a valid p (never 0).
  std::vector<double> many(24, 1.0);
  EXPECT_GT(SignFlipP(many), 0);
  EXPECT_LT(SignFlipP(many), 1e-4);
}

TEST(SeedStats, BootstrapIsEnumeratedWhenSmall) {
  auto mean = [](const std::vector<double>& x) {
    return [x](const std::vector<int>& c) {
      double s = 0;
      for (size_t i = 0; i < x.size(); ++i) s += c[i] * x[i];
      return s / x.size();
    };
  };
  const BootstrapDistribution d4 = SeedBootstrap(4, mean({1, 2, 3, 4}));
  EXPECT_TRUE(d4.exact);
  EXPECT_EQ(d4.values.size(), 35u);  // C(7, 4) multisets (4⁴ = 256 ordered draws)
  double total = 0, all_low = 0;
  for (size_t i = 0; i < d4.values.size(); ++i) {
    total += d4.weights[i];
    if (d4.values[i] == 1.0) all_low += d4.weights[i];
  }
  EXPECT_NEAR(total, 1, 1e-12);
  EXPECT_NEAR(all_low, 1.0 / 256, 1e-12);
  // 90 %: the 5 % tail holds {1,1,1,1} (1/256), {1,1,1,2} (4/256) ... the ends are near the
  // extreme seeds: this is the seed range.
  const auto [lo, hi] = WeightedPercentile(d4, 0.90);
  EXPECT_GE(lo, 1.0);
  EXPECT_LE(lo, 1.75);
  EXPECT_GE(hi, 3.25);
  EXPECT_LE(hi, 4.0);
  EXPECT_EQ(SeedBootstrap(3, mean({1, 2, 3})).values.size(), 10u);
  EXPECT_EQ(SeedBootstrap(8, mean({1, 2, 3, 4, 5, 6, 7, 8})).values.size(), 6435u);
  const BootstrapDistribution d12 =
      SeedBootstrap(12, mean({1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}), 500);
  EXPECT_FALSE(d12.exact);
  EXPECT_EQ(d12.values.size(), 500u);
}

TEST(SeedStats, DescribeSeedsLabelsTheSeedRange) {
  const SeedStatement four = DescribeSeeds({1.10, 1.20, 1.15, 1.30}, 0.90, true);
  EXPECT_EQ(four.df, 3);
  EXPECT_EQ(four.bootstrap_label, "seed range");
  EXPECT_TRUE(four.bootstrap_exact);
  EXPECT_DOUBLE_EQ(four.sign_flip_p, 0.125);
  EXPECT_NEAR(four.t.estimate, std::pow(1.10 * 1.20 * 1.15 * 1.30, 0.25), 1e-12);
  EXPECT_LT(four.t.lo, 1.10);  // t reaches beyond the seeds; the bootstrap cannot
  EXPECT_GE(four.bootstrap.lo, 1.10 - 1e-12);
  EXPECT_THAT(FormatStatement(four),
              HasSubstr("(90% t, df 3), p = 0.125 (exact sign-flip); seed range"));
  const SeedStatement eight = DescribeSeeds({1, 2, 3, 4, 5, 6, 7, 8}, 0.90, false);
  EXPECT_EQ(eight.bootstrap_label, "90% bootstrap");
  const SeedStatement two = DescribeSeeds({1.1, 1.2}, 0.90, true);
  EXPECT_THAT(two.note, HasSubstr("2 seeds: too few for an interval"));
  EXPECT_TRUE(std::isnan(two.t.lo));
  EXPECT_TRUE(std::isnan(two.sign_flip_p));
}

// A table where seed k has C_S/C_48 = exp(β_k · log2(48/S)) exactly, β_k = 0.2 + 0.01·(k − 2)
// at L* = 3.0 and 0.1 larger at L* = 2.9: β per target is the seeds' mean, the trend is
// dβ/dL* = −1 in every seed.
TEST(SparsitySlope, RecoversAKnownSlopeAndTrend) {
  ModelFreeTable t;
  t.reference = "48";
  t.targets = {2.9, 3.0};
  for (double target : t.targets) {
    for (double s : {8.0, 16.0, 32.0}) {
      ModelFreeRow r;
      r.family = fmt::format("{:g}", s);
      r.target_loss = target;
      for (int k = 1; k <= 4; ++k) {
        const double beta = 0.2 + 0.01 * (k - 2) + (target < 2.95 ? 0.1 : 0.0);
        r.seeds.push_back(std::to_string(k));
        r.flops_reference.push_back(1e15);
        r.flops_family.push_back(1e15 * std::exp(beta * std::log2(48 / s)));
      }
      t.rows.push_back(r);
    }
  }
  const SparsitySlope sl = EstimateSparsitySlope(t, {});
  ASSERT_EQ(sl.targets.size(), 2u);
  EXPECT_NEAR(sl.targets[1].beta.t.estimate, 0.205, 1e-12);
  EXPECT_NEAR(sl.targets[0].beta.t.estimate, 0.305, 1e-12);
  EXPECT_NEAR(sl.targets[1].per_doubling, std::exp(0.205), 1e-12);
  EXPECT_DOUBLE_EQ(sl.targets[1].beta.sign_flip_p, 0.125);
  ASSERT_EQ(sl.trend_per_seed.size(), 4u);
  for (double d : sl.trend_per_seed) EXPECT_NEAR(d, -1.0, 1e-9);
  const std::string text = FormatSparsitySlope(sl, "fixed size (training curve)");
  EXPECT_THAT(text, HasSubstr("single-size training curve"));
  EXPECT_THAT(FormatSparsitySlope(sl, "frontier (compute-optimal)"),
              HasSubstr("estimand: frontier (compute-optimal): C_S read on each (S, seed)'s lower "
                        "envelope over model sizes, the report's estimand"));
  EXPECT_THAT(text, HasSubstr("per seed: s1 +0.290, s2 +0.300, s3 +0.310, s4 +0.320"));
  EXPECT_THAT(text, HasSubstr("trend dbeta/dL*"));
  // A table of another variable (no numeric sparsity): no β, and the report is empty.
  ModelFreeTable other = t;
  other.reference = "adamw";
  EXPECT_THROW(EstimateSparsitySlope(other, {}), AnalysisError);
  EXPECT_EQ(SparsitySlopeReport(other, {}, {}, 0.9, 3), "");
}

}  // namespace
}  // namespace moelab::analysis
