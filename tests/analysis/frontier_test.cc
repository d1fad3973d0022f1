// The frontier estimand (analysis/frontier.h) on synthetic runs whose multiplier is known by
// construction: each family's runs follow one Chinchilla law L(N, D) at three model sizes, and
// the treated family's runs sit at m_s times the reference's tokens for the same losses, so its
// compute-optimal frontier is the reference's shifted by exactly m_s in FLOPs on every seed.
#include "analysis/frontier.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <set>

namespace moelab::analysis {
namespace {

constexpr double kE = 2.0, kA = 25, kAlpha = 0.34, kB = 30, kBeta = 0.28;

double Law(double n, double d) { return kE + kA / std::pow(n, kAlpha) + kB / std::pow(d, kBeta); }

struct Design {
  std::vector<double> sizes = {1e5, 4e5, 1.6e6};  // active parameters
  std::vector<double> tokens = {1e6, 2e6, 4e6, 8e6, 1.6e7, 3.2e7, 6.4e7};
  double router_extra = 0;  // the treated family's extra active parameters (its router)
};

// One run per (family, size, budget, seed): its final evaluation. `shift[s]`: how many times
// the reference's tokens the treated family needs for the same loss on seed s; its sizes below
// `shift_from_size` equal the reference's (no shift there).
std::vector<Observation> Runs(const Design& d, const std::vector<double>& shift,
                              double shift_from_size = 0) {
  std::vector<Observation> obs;
  for (size_t s = 0; s < shift.size(); ++s) {
    for (const std::string family : {"8", "48"}) {
      for (size_t i = 0; i < d.sizes.size(); ++i) {
        for (double reference_tokens : d.tokens) {
          const double n = d.sizes[i];
          const bool treated = family == "8" && n >= shift_from_size;
          const double tokens = treated ? shift[s] * reference_tokens : reference_tokens;
          Observation o;
          o.family = family;
          o.seed = std::to_string(s + 1);
          o.unit = "seed " + o.seed + ", size " + std::to_string(i);
          o.run = fmt::format("{}/{}/{:g}/{}", family, i, reference_tokens, o.seed);
          o.params = n + (family == "8" ? d.router_extra : 0);
          o.tokens = tokens;
          o.flops = 6 * o.params * tokens;
          // The same loss as the reference's run, per seed offset in the loss (shared noise).
          o.loss = Law(n, reference_tokens) * (1 + 0.002 * static_cast<double>(s));
          obs.push_back(o);
        }
      }
    }
  }
  return obs;
}

TEST(Frontier, EstimandIsNamedFromTheModelSizesOfEachFamily) {
  Design d;
  const auto frontier = Runs(d, {1.5, 1.5, 1.5});
  EXPECT_EQ(EstimandOf(frontier), Estimand::kFrontier);
  EXPECT_EQ(EstimandLabel(Estimand::kFrontier), "frontier (compute-optimal)");
  d.sizes = {4e5};
  EXPECT_EQ(EstimandOf(Runs(d, {1.5, 1.5, 1.5})), Estimand::kFixedSize);
  EXPECT_EQ(EstimandLabel(Estimand::kFixedSize), "fixed size (training curve)");
  auto mixed = frontier;
  std::erase_if(mixed, [](const Observation& o) { return o.family == "8" && o.params != 4e5; });
  EXPECT_EQ(EstimandOf(mixed), Estimand::kMixed);
  // The model-free table carries the label.
  EXPECT_EQ(ModelFreeMultipliers(frontier, "48", {2.9}).estimand, "frontier (compute-optimal)");
}

// Sizes by sweep variables when the runs have them; by the rank of their active parameters
// (the router makes them differ across families) when not.
TEST(Frontier, ModelSizesFromSweepVariablesOrByRank) {
  Design d;
  d.router_extra = 123;
  const auto obs = Runs(d, {1.5});
  const auto by_rank = ModelSizeOfRuns(obs, {});
  for (const auto& o : obs) {
    const int rank = o.params < 2e5 ? 1 : o.params < 1e6 ? 2 : 3;
    EXPECT_EQ(by_rank.at(o.run), fmt::format("size {}", rank)) << o.run;
  }
  std::map<std::string, std::map<std::string, std::string>> vars;
  for (const auto& o : obs) {
    const int rank = o.params < 2e5 ? 24 : o.params < 1e6 ? 32 : 48;
    vars[o.run] = {{"model.d_model", std::to_string(rank)}, {"sparsity", o.family}};
  }
  const auto by_vars = ModelSizeOfRuns(obs, vars);
  EXPECT_EQ(by_vars.at(obs.front().run), "d_model=24");
  std::set<std::string> labels;
  for (const auto& [run, label] : by_vars) labels.insert(label);
  EXPECT_EQ(labels, (std::set<std::string>{"d_model=24", "d_model=32", "d_model=48"}));
}

// The known multiplier, per seed, read on envelopes that use every size; the statement is the
// library's: t interval on the mean log ratio, exact sign-flip p, "seed range" below 8 seeds.
TEST(Frontier, ReadsTheKnownMultiplierOnEachSeedsEnvelope) {
  Design d;
  const std::vector<double> m = {1.30, 1.45, 1.38, 1.52};
  const FrontierReport r = AnalyzeFrontier(Runs(d, m), {}, "48", {3.10, 2.90, 2.75});
  EXPECT_EQ(r.estimand, Estimand::kFrontier);
  EXPECT_EQ(r.frontier.estimand, "frontier (compute-optimal)");
  ASSERT_EQ(r.sizes, (std::vector<std::string>{"size 1", "size 2", "size 3"}));
  // The envelope of every (family, seed) is made of more than one size.
  ASSERT_EQ(r.envelopes.size(), 8u);
  for (const auto& e : r.envelopes) EXPECT_GE(e.sizes.size(), 2u) << e.family << e.seed;
  ASSERT_EQ(r.frontier.rows.size(), 3u);
  double mean_log = 0;
  for (double x : m) mean_log += std::log(x) / m.size();
  for (const auto& row : r.frontier.rows) {
    ASSERT_EQ(row.seeds.size(), m.size()) << row.target_loss;
    for (size_t s = 0; s < m.size(); ++s)
      EXPECT_NEAR(row.flops_family[s] / row.flops_reference[s], m[s], 1e-9) << row.target_loss;
    EXPECT_NEAR(row.flops_ratio.estimate, std::exp(mean_log), 1e-9);
    EXPECT_LT(row.flops_ratio.lo, std::exp(mean_log));
    EXPECT_GT(row.flops_ratio.hi, std::exp(mean_log));
    EXPECT_EQ(row.flops_stats.df, 3);
    EXPECT_DOUBLE_EQ(row.flops_stats.sign_flip_p, 0.125);  // 2 / 2^4: every seed > 1
    EXPECT_EQ(row.flops_stats.bootstrap_label, "seed range");
  }
  // Which size is compute-optimal changes along the frontier.
  std::set<std::string> optimal;
  for (const auto& e : r.envelopes)
    for (const auto& at : e.size_at_target) optimal.insert(at);
  EXPECT_GE(optimal.size(), 2u);
}

// The two estimands differ when the advantage lives at one size: the treated family equals the
// reference at the two small sizes and needs m times the tokens at the largest. The fixed-size
// tables read 1 at the small sizes and m at the largest; the frontier reads m where the largest
// size is compute-optimal for both families and 1 where a small size is.
TEST(Frontier, FixedSizeTablesAreATrainingCurveEstimandBesideTheFrontier) {
  Design d;
  const double m = 1.6;
  const std::vector<double> shift(8, m);
  const FrontierReport r =
      AnalyzeFrontier(Runs(d, shift, /*shift_from_size=*/1.6e6), {}, "48", {3.05, 2.45});
  ASSERT_EQ(r.fixed_size.size(), 3u);
  for (const auto& f : r.fixed_size) {
    ASSERT_TRUE(f.table) << f.size << ": " << f.error;
    EXPECT_EQ(f.table->estimand, "fixed size (training curve)");
    for (const auto& row : f.table->rows) {
      if (row.seeds.empty()) continue;  // this size does not reach the target
      EXPECT_NEAR(row.flops_ratio.estimate, f.size == "size 3" ? m : 1.0, 1e-9)
          << f.size << " at " << row.target_loss;
    }
  }
  ASSERT_EQ(r.frontier.rows.size(), 2u);
  for (const auto& row : r.frontier.rows) {
    ASSERT_EQ(row.seeds.size(), 8u);
    EXPECT_EQ(row.flops_stats.bootstrap_label.find("seed range"), std::string::npos)
        << "8 seeds: a bootstrap interval, not the seed range";
    EXPECT_DOUBLE_EQ(row.flops_stats.sign_flip_p, row.target_loss < 3 ? 2.0 / 256 : 1.0);
  }
  // At 3.05 the smallest size is optimal for both: ratio 1; at 2.45 the largest is: ratio m.
  EXPECT_NEAR(r.frontier.rows[0].flops_ratio.estimate, 1.0, 1e-9);
  EXPECT_NEAR(r.frontier.rows[1].flops_ratio.estimate, m, 1e-9);
  bool largest_noted = false;
  for (const auto& n : r.notes) largest_noted = largest_noted || n.find("largest size") != n.npos;
  EXPECT_TRUE(largest_noted);
}

TEST(Frontier, OneSizeFamiliesAreNamedATrainingCurve) {
  Design d;
  d.sizes = {4e5};
  const FrontierReport r = AnalyzeFrontier(Runs(d, {1.2, 1.3, 1.25}), {}, "48", {});
  EXPECT_EQ(r.estimand, Estimand::kFixedSize);
  EXPECT_EQ(r.frontier.estimand, "fixed size (training curve)");
  ASSERT_EQ(r.fixed_size.size(), 1u);
  EXPECT_EQ(r.frontier.targets.size(), 3u);
}

}  // namespace
}  // namespace moelab::analysis
