// The seed-level statistics of issue 21 under the structure the experiments really have: every
// budget of a seed is a WSD branch of one trunk (a per-seed offset and a random walk along the
// trunk shared by all its branches), arms share each seed's data order (a common part of the
// seed noise), and the true curve need not be a power law. Coverage is bounded from below and
// above; the model-free estimate, the cluster bootstrap, the runs test and the heads pairing
// are checked against truths the simulation knows.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "analysis/ablation.h"
#include "analysis/bootstrap.h"
#include "analysis/misfit.h"
#include "analysis/model_free.h"
#include "analysis/scaling.h"
#include "analysis/seed_stats.h"

namespace moelab::analysis {
namespace {

using ::testing::HasSubstr;

struct Sim {
  double E = 1.0, A = 2.0, alpha = 0.3;
  double gamma = 0;          // log L gains −gamma·(log c)²: slopes steepen (not a power law)
  double common_sd = 0.006;  // per seed, shared by the arms (same data order)
  double own_sd = 0.004;     // per seed and arm
  double walk_sd = 0.002;    // per budget step along a trunk, accumulated
  double eval_sd = 0.002;    // per evaluation
  int budgets = 8;
  double c_lo = 0.1, c_hi = 1e3;  // compute range in units of 1e15 FLOPs
};

double TrueLoss(const Sim& s, double c) {
  const double lc = std::log(c);
  return (s.E + s.A * std::exp(-s.alpha * lc)) * std::exp(-s.gamma * lc * lc);
}

// Final points of every (arm, seed, budget): arm `name` needs `shift` times the compute of the
// truth to reach any loss, so the true FLOPs (and tokens) ratio between two arms is the ratio of
// their shifts at every target.
std::vector<Observation> Simulate(const Sim& s, const std::map<std::string, double>& arms,
                                  int seeds, uint64_t data_seed) {
  std::mt19937_64 rng(data_seed);
  std::normal_distribution<double> g(0.0, 1.0);
  std::vector<Observation> obs;
  for (int k = 1; k <= seeds; ++k) {
    const double common = s.common_sd * g(rng);
    for (const auto& [arm, shift] : arms) {
      const double own = s.own_sd * g(rng);
      double walk = 0;
      for (int b = 0; b < s.budgets; ++b) {
        walk += s.walk_sd * g(rng);
        const double lc =
            std::log(s.c_lo) + (std::log(s.c_hi) - std::log(s.c_lo)) * b / (s.budgets - 1);
        const double c = std::exp(lc);
        const double loss =
            TrueLoss(s, c / shift) * std::exp(common + own + walk + s.eval_sd * g(rng));
        Observation o;
        o.run = arm + "/s" + std::to_string(k) + "/b" + std::to_string(b);
        o.family = arm;
        o.flops = 1e15 * c;
        o.tokens = o.flops / 6e5;
        o.params = 1e5;
        o.loss = loss;
        o.seed = std::to_string(k);
        o.unit = "seed " + o.seed + ", trunk " + arm;
        obs.push_back(o);
      }
    }
  }
  return obs;
}

FitOptions Fast(int resamples, uint64_t seed) {
  FitOptions o;
  o.bootstrap_resamples = resamples;
  o.seed = seed;
  o.threads = 1;
  o.final_only = true;
  return o;
}

// Branches of one trunk are one replicate: 8 budgets that are all branches of one seed's trunk
// give no interval at all, never a narrow one from resampling budgets.
TEST(SeedBootstrap, BranchesOfOneTrunkAreOneReplicate) {
  Sim s;
  const FamilyFits one = FitFamilies(Simulate(s, {{"f", 1.0}}, 1, 5), Fast(100, 1));
  const auto& f = one.Get("f");
  EXPECT_EQ(f.n_units, 1);
  EXPECT_THAT(f.interval_note, HasSubstr("1 seed: too few for an interval"));
  EXPECT_TRUE(std::isnan(f.params[3].value.lo));
  EXPECT_TRUE(f.draws.empty());
  const FamilyFits three = FitFamilies(Simulate(s, {{"f", 1.0}}, 3, 5), Fast(100, 1));
  const auto& g = three.Get("f");
  EXPECT_EQ(g.n_units, 3);
  EXPECT_TRUE(g.interval_note.empty());
  EXPECT_LT(g.params[3].value.lo, g.params[3].value.hi);
}

// The model-free FLOPs ratio under a misspecified law (slopes steepen with compute, as in the
// sparsity sweep) and trunk-structured seed noise: with 5 seeds its 90% interval (t on the log
// ratio, df 4) covers the true 1.15 at close to nominal. Measured (300 trials): see the printed
// line.
TEST(SeedBootstrap, ModelFreeCoverageUnderMisspecifiedLawAndTrunkNoise) {
  Sim s;
  s.E = 0;
  s.gamma = 0.01;
  const double truth = 1.15;
  int covered = 0, n = 0, too_few = 0;
  double width = 0;
  for (int t = 0; t < 300; ++t) {
    auto obs = Simulate(s, {{"8", truth}, {"48", 1.0}}, 5, 7000 + t);
    ModelFreeOptions o;
    o.resamples = 200;
    o.seed = 11 + t;
    const ModelFreeTable table = ModelFreeMultipliers(obs, "48", {}, o);
    ASSERT_EQ(table.rows.size(), 3u);
    const ModelFreeRow& r = table.rows[1];  // the middle target
    if (!r.interval_note.empty()) {
      too_few++;
      continue;
    }
    n++;
    covered += r.flops_ratio.lo <= truth && truth <= r.flops_ratio.hi;
    width += r.flops_ratio.hi - r.flops_ratio.lo;
  }
  const double coverage = static_cast<double>(covered) / std::max(1, n);
  std::printf(
      "model-free, 5 seeds, misspecified law: 90%% coverage %.3f, mean width %.3f (%d "
      "trials, %d without interval)\n",
      coverage, width / std::max(1, n), n, too_few);
  EXPECT_GE(n, 280);
  EXPECT_GE(coverage, 0.75);
  EXPECT_LE(coverage, 0.97);
  // Two seeds: no interval, the point only.
  auto two = Simulate(s, {{"8", truth}, {"48", 1.0}}, 2, 1);
  const auto t2 = ModelFreeMultipliers(two, "48", {}, {});
  EXPECT_THAT(t2.rows[0].interval_note, HasSubstr("2 seeds: too few for an interval"));
  EXPECT_TRUE(std::isnan(t2.rows[0].flops_ratio.lo));
}

// Issue 35: each interval method under the real structure (per-seed offsets shared by the arms,
// each arm's own offset and a random walk along its trunk shared by all its branches), at 3, 4,
// 8 and 12 seeds, bounded above and below. The t interval on the log ratio holds ~90 % at every
// n; the bootstrap percentile interval is the seed range at few seeds (≈ 1 − 2/n: far below 90 %
// at 3–4) and nears nominal only by 12; the exact sign-flip test never exceeds its level (and
// with 3–4 seeds cannot reject at 10 %: its smallest p is 0.25, 0.125).
TEST(SeedBootstrap, CoverageOfEachMethodAt3To12Seeds) {
  Sim s;
  s.E = 0;
  s.gamma = 0.01;
  const double truth = 1.15;
  struct Bounds {
    int seeds;
    double t_lo, t_hi, boot_lo, boot_hi, reject_hi;
  };
  const std::vector<Bounds> cases = {{3, 0.84, 0.96, 0.45, 0.80, 0.0},
                                     {4, 0.84, 0.96, 0.60, 0.86, 0.0},
                                     {8, 0.84, 0.96, 0.74, 0.92, 0.15},
                                     {12, 0.84, 0.96, 0.78, 0.94, 0.15}};
  const int trials = 300;
  for (const auto& c : cases) {
    int n = 0, t_cov = 0, b_cov = 0, rejected = 0;
    for (int t = 0; t < trials; ++t) {
      auto obs = Simulate(s, {{"8", truth}, {"48", 1.0}}, c.seeds, 91000 + 1000 * c.seeds + t);
      ModelFreeOptions o;
      o.resamples = 400;
      o.seed = 5 + t;
      const ModelFreeTable table = ModelFreeMultipliers(obs, "48", {}, o);
      const ModelFreeRow& r = table.rows[1];  // the middle target
      if (static_cast<int>(r.seeds.size()) != c.seeds) continue;
      n++;
      t_cov += r.flops_ratio.lo <= truth && truth <= r.flops_ratio.hi;
      b_cov += r.flops_stats.bootstrap.lo <= truth && truth <= r.flops_stats.bootstrap.hi;
      // The test of the true ratio (H0 true): the per-seed log ratios centred on the truth.
      std::vector<double> centred;
      for (size_t i = 0; i < r.seeds.size(); ++i)
        centred.push_back(std::log(r.flops_family[i] / r.flops_reference[i] / truth));
      rejected += SignFlipP(centred) <= 0.10;
    }
    const double tc = double(t_cov) / n, bc = double(b_cov) / n, rj = double(rejected) / n;
    std::printf(
        "%2d seeds (%d trials): 90%% t coverage %.3f, bootstrap (%s) %.3f, sign-flip "
        "size at 10%% %.3f\n",
        c.seeds, n, tc, c.seeds < kMinSeedsForBootstrapLevel ? "seed range" : "90%", bc, rj);
    EXPECT_GE(n, trials * 9 / 10) << c.seeds;
    EXPECT_GE(tc, c.t_lo) << c.seeds;
    EXPECT_LE(tc, c.t_hi) << c.seeds;
    EXPECT_GE(bc, c.boot_lo) << c.seeds;
    EXPECT_LE(bc, c.boot_hi) << c.seeds;
    EXPECT_LE(rj, c.reject_hi) << c.seeds;
    if (c.seeds >= 8) EXPECT_GE(rj, 0.04) << c.seeds;  // exact: near its level, not far below
  }
}

// The fitted law's C(L*) under trunk noise: the seed-level bootstrap covers near nominal; the
// old run-level bootstrap (every branch its own replicate) covers far less, because the
// branches of a trunk share its offset and walk.
TEST(SeedBootstrap, ClusterBootstrapCoversWhereRunLevelDoesNot) {
  Sim s;
  const double target = 1.5;
  const double c_true = 1e15 * std::pow(s.A / (target - s.E), 1 / s.alpha);
  int cover_seed = 0, cover_run = 0, n = 0;
  for (int t = 0; t < 30; ++t) {
    auto obs = Simulate(s, {{"f", 1.0}}, 5, 8000 + t);
    auto runs = obs;
    for (auto& o : runs) o.unit.clear(), o.seed.clear();
    auto covers = [&](const std::vector<Observation>& x) {
      const auto fits = FitFamilies(x, Fast(100, 50 + t));
      std::vector<double> cs;
      for (const auto& d : fits.Get("f").draws) {
        if (!std::isnan(d[0]) && target > d[0])
          cs.push_back(1e15 * std::exp((d[1] - std::log(target - d[0])) / d[2]));
      }
      auto [lo, hi] = internal::PercentileInterval(cs, 0.9);
      return lo <= c_true && c_true <= hi;
    };
    n++;
    cover_seed += covers(obs);
    cover_run += covers(runs);
  }
  const double seed_cov = static_cast<double>(cover_seed) / n;
  const double run_cov = static_cast<double>(cover_run) / n;
  std::printf("C(L*) 90%% coverage, 5 seeds x 8 branches: seed-level %.2f, run-level %.2f\n",
              seed_cov, run_cov);
  EXPECT_GE(seed_cov, 0.70);
  EXPECT_LE(seed_cov, 1.00);
  EXPECT_LT(run_cov, seed_cov - 0.15);
}

// The runs test and the unconstrained E: a law whose slopes steepen with compute (the sparsity
// sweep's shape) is rejected in most trials; a true power law with E > 0 rarely.
TEST(Misfit, RejectsASteepeningCurveNotATruePowerLaw) {
  EXPECT_NEAR(RunsTestLowerP(5, 6, 2), 2.0 / 462, 1e-12);  // 2 orders of 462 give 2 runs
  EXPECT_NEAR(RunsTestLowerP(5, 6, 11), 1.0, 1e-12);
  EXPECT_TRUE(std::isnan(RunsTestLowerP(0, 6, 1)));
  Sim bad;
  bad.E = 0;
  bad.gamma = 0.012;
  bad.budgets = 11;
  Sim good;
  good.budgets = 11;
  int rejected_bad = 0, rejected_good = 0;
  const int trials = 20;
  for (int t = 0; t < trials; ++t) {
    FitOptions o = Fast(2, 1);
    o.min_units = 100;  // no bootstrap needed here
    rejected_bad +=
        FitFamilies(Simulate(bad, {{"f", 1.0}}, 2, 100 + t), o).Get("f").misfit.rejected;
    rejected_good +=
        FitFamilies(Simulate(good, {{"f", 1.0}}, 2, 200 + t), o).Get("f").misfit.rejected;
  }
  std::printf("misfit rejected: steepening %d/%d, power law %d/%d\n", rejected_bad, trials,
              rejected_good, trials);
  EXPECT_GE(rejected_bad, 16);
  EXPECT_LE(rejected_good, 4);
}

// Heads: arms paired by seed, budgets of a seed resampled together. Seed offsets of ±6 % shared
// by both arms cancel in the paired delta; with 2 seeds there is no interval at all.
TEST(SeedBootstrap, HeadsDeltasArePairedBySeed) {
  std::vector<Observation> obs;
  const double offsets[4] = {0.06, -0.06, 0.03, -0.03};
  for (int seed = 0; seed < 4; ++seed) {
    for (int budget = 0; budget < 3; ++budget) {
      const double tokens = 1e5 * (1 << budget);
      for (int arm = 1; arm <= 2; ++arm) {
        Observation o;
        o.run =
            "b" + std::to_string(budget) + "s" + std::to_string(seed) + "a" + std::to_string(arm);
        o.family = arm == 1 ? "1" : "2";
        o.tokens = tokens;
        o.flops = 6e5 * tokens * arm;
        o.params = 1e5;
        o.loss = (4.0 - 0.3 * budget) * (1 + offsets[seed]) * (arm == 2 ? 0.99 : 1.0);
        o.seed = std::to_string(seed);
        o.unit = o.family + " seed " + o.seed;
        obs.push_back(o);
      }
    }
  }
  FitOptions o = Fast(200, 3);
  auto res = CompareHeads(obs, "1", "2", o);
  ASSERT_EQ(res.budgets.size(), 3u);
  // Paired by seed, the shared offsets cancel exactly: every seed's delta is −1 %.
  EXPECT_NEAR(res.mean_delta_equal_tokens.estimate, -0.01, 1e-12);
  EXPECT_NEAR(res.mean_delta_equal_tokens.lo, -0.01, 1e-12);
  EXPECT_NEAR(res.mean_delta_equal_tokens.hi, -0.01, 1e-12);
  // Two seeds: no interval.
  std::vector<Observation> two;
  for (const auto& x : obs)
    if (x.seed == "0" || x.seed == "1") two.push_back(x);
  auto r2 = CompareHeads(two, "1", "2", o);
  EXPECT_TRUE(std::isnan(r2.mean_delta_equal_tokens.lo));
  EXPECT_THAT(r2.budgets[0].note, HasSubstr("2 seeds: too few for an interval"));
}

}  // namespace
}  // namespace moelab::analysis
