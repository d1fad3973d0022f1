// Repeated looks at a seed-level estimand (analysis/sequential.h): the boundary against its
// closed form at a single look, its stability as looks are added, and a simulation under the
// real structure of a sweep (per-seed offsets shared by the arms, a trunk's stable-phase noise
// shared by its WSD branches, branch noise on top, the model-free log ratio read off each seed's
// own curve) showing the stated error rate holds while a naive repeated t check exceeds it.
#include "analysis/sequential.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "analysis/seed_stats.h"

namespace moelab::analysis {
namespace {

TEST(Sequential, SingleLookIsTheOrdinaryTInterval) {
  SequentialDesign d;
  d.alpha = 0.10;
  d.max_seeds = 4;
  const std::vector<double> c = RepeatedTBoundaries({4}, d);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_NEAR(c[0], StudentTQuantile(0.95, 3), 0.06);  // Monte Carlo quantile of |t_3|
  d.max_seeds = 8;
  EXPECT_NEAR(RepeatedTBoundaries({8}, d)[0], StudentTQuantile(0.95, 7), 0.04);
}

TEST(Sequential, EarlierBoundariesDoNotMoveWhenLooksAreAdded) {
  SequentialDesign d;
  d.max_seeds = 12;
  const auto a = RepeatedTBoundaries({3, 5}, d);
  const auto b = RepeatedTBoundaries({3, 5, 8, 12}, d);
  EXPECT_DOUBLE_EQ(a[0], b[0]);
  EXPECT_DOUBLE_EQ(a[1], b[1]);
  // Each look is stricter than an ordinary 90 % t interval at the same seeds.
  EXPECT_GT(b[0], StudentTQuantile(0.95, 2));
  EXPECT_GT(b[3], StudentTQuantile(0.95, 11));
  EXPECT_NEAR(PocockSpending(0.1, 1.0), 0.1, 1e-15);
}

TEST(Sequential, RejectsMalformedSchedules) {
  SequentialDesign d;
  d.max_seeds = 6;
  EXPECT_THROW(RepeatedTBoundaries({}, d), AnalysisError);
  EXPECT_THROW(RepeatedTBoundaries({1, 3}, d), AnalysisError);
  EXPECT_THROW(RepeatedTBoundaries({3, 3}, d), AnalysisError);
  EXPECT_THROW(RepeatedTBoundaries({3, 7}, d), AnalysisError);
  EXPECT_THROW(RepeatedTInterval({1, 2}, {3}, d), AnalysisError);
}

TEST(Sequential, IntervalIsMeanPlusMinusCriticalTimesSe) {
  SequentialDesign d;
  d.max_seeds = 6;
  const RepeatedInterval r = RepeatedTInterval({1, 2, 3, 4}, {3, 4}, d);
  const double c = RepeatedTBoundaries({3, 4}, d)[1];
  const double se = std::sqrt(5.0 / 3.0) / 2;
  EXPECT_DOUBLE_EQ(r.critical, c);
  EXPECT_NEAR(r.value.lo, 2.5 - c * se, 1e-12);
  EXPECT_NEAR(r.value.hi, 2.5 + c * se, 1e-12);
  EXPECT_EQ(r.look, 2);
  EXPECT_NEAR(r.alpha_spent, PocockSpending(0.1, 4.0 / 6), 1e-15);
}

// One simulated seed of a two-arm comparison: each arm's WSD family on a ladder of budgets.
// loss(C_i) = E + A_arm·(C_i/C_0)^(−0.3) + offset_seed + trunk_i + branch_i, where trunk_i is
// the stable phase's random walk (shared by every branch of the trunk up to its decay start)
// and branch_i the decay's own noise. The value is log C_B(L*) − log C_A(L*), each read by
// log-log interpolation between the two budgets that bracket L* on the seed's own curve.
class TwoArmWorld {
 public:
  static constexpr int kBudgets = 9;
  explicit TwoArmWorld(uint64_t seed) : rng_(seed) {}

  double SeedValue() {
    const double offset = Normal(0.05);
    const double a = LogFlopsAt(1.50, offset), b = LogFlopsAt(1.65, offset);
    return b - a;
  }

 private:
  double Normal(double sd) { return std::normal_distribution<double>(0, sd)(rng_); }
  double LogFlopsAt(double amplitude, double offset) {
    double trunk = 0, prev_loss = 0, prev_log_c = 0;
    for (int i = 0; i < kBudgets; ++i) {
      const double log_c = i * std::log(1.5);
      trunk += Normal(0.006);
      const double loss = 2.0 + amplitude * std::exp(-0.3 * log_c) + offset + trunk + Normal(0.004);
      if (i > 0 && prev_loss >= kTarget && kTarget >= loss) {
        const double t =
            (std::log(prev_loss) - std::log(kTarget)) / (std::log(prev_loss) - std::log(loss));
        return prev_log_c + t * (log_c - prev_log_c);
      }
      prev_loss = loss;
      prev_log_c = log_c;
    }
    return NAN;  // not reached: the world is built so that this does not happen
  }
  static constexpr double kTarget = 2.95;
  std::mt19937_64 rng_;
};

TEST(Sequential, ErrorRateHoldsUnderTheSweepStructureAndNaiveLooksExceedIt) {
  // The true value: the mean seed value over many seeds of the same world.
  TwoArmWorld truth_world(7);
  double truth = 0;
  const int kTruthSeeds = 100000;
  for (int i = 0; i < kTruthSeeds; ++i) truth += truth_world.SeedValue();
  truth /= kTruthSeeds;
  ASSERT_TRUE(std::isfinite(truth));

  SequentialDesign design;
  design.alpha = 0.10;
  design.max_seeds = 12;
  std::vector<int> looks;
  for (int n = 3; n <= 12; ++n) looks.push_back(n);  // a look after every seed from 3 on
  const std::vector<double> c = RepeatedTBoundaries(looks, design);

  const int kSims = 2000;
  int sequential_errors = 0, naive_errors = 0;
  TwoArmWorld world(11);
  for (int sim = 0; sim < kSims; ++sim) {
    std::vector<double> v;
    bool seq = false, naive = false;
    double mean = 0, m2 = 0;
    for (int n = 1; n <= 12; ++n) {
      const double x = world.SeedValue();
      ASSERT_TRUE(std::isfinite(x));
      v.push_back(x);
      const double d = x - mean;
      mean += d / n;
      m2 += d * (x - mean);
      if (n < 3) continue;
      const double se = std::sqrt(m2 / (n - 1) / n);
      const double t = std::abs(mean - truth) / se;
      seq |= t > c[n - 3];
      naive |= t > StudentTQuantile(0.95, n - 1);
    }
    sequential_errors += seq;
    naive_errors += naive;
  }
  const double seq_rate = double(sequential_errors) / kSims;
  const double naive_rate = double(naive_errors) / kSims;
  RecordProperty("sequential_rate", std::to_string(seq_rate));
  RecordProperty("naive_rate", std::to_string(naive_rate));
  EXPECT_GE(seq_rate, 0.055) << "naive " << naive_rate;
  EXPECT_LE(seq_rate, 0.135) << "naive " << naive_rate;
  EXPECT_GE(naive_rate, 0.20) << "sequential " << seq_rate;
}

}  // namespace
}  // namespace moelab::analysis
