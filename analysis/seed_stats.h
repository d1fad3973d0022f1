// Seed-level statistics for a paired comparison: the replicate is the seed, so every interval and
// test here has as many units as there are seeds (df = seeds − 1), never as many as there are
// budgets, branches or resamples. The primary statement of a comparison is a Student t interval
// on the mean of the per-seed values (for a ratio: of their logs) and an exact sign-flip
// (permutation) p-value; the seed bootstrap is reported beside it, enumerated exactly when the
// seeds are few, and below 8 seeds labelled "seed range" (its percentile ends then sit on the
// extreme seeds: coverage ≈ 1 − 2/n at n seeds, far below its nominal level).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "analysis/scaling.h"

namespace moelab::analysis {

// Student t distribution with integer degrees of freedom (the closed forms of Abramowitz & Stegun
// 26.7.3–4: exact, no series truncation). df ≥ 1.
double StudentTCdf(double t, int df);
// The p-quantile (0 < p < 1) by bisection on the exact CDF (|error| < 1e-12).
double StudentTQuantile(double p, int df);

// mean ± t_{df, 1−(1−level)/2} · sd / √n over the values, df = n − 1. NaN ends for n < 2.
Estimate TInterval(const std::vector<double>& values, double level);

// Exact two-sided sign-flip p-value of H0 "the values are symmetric about zero": the share of
// the 2ⁿ sign assignments whose |mean| is at least the observed one. Its smallest possible
// value is 2/2ⁿ (0.25 at 3 seeds, 0.125 at 4): few seeds cannot reject at small alpha, and the
// p-value says so. Enumerated up to 20 values; beyond, 2¹⁶ deterministic random assignments.
double SignFlipP(const std::vector<double>& values);

// The bootstrap distribution of a statistic of n seeds: every multiset of n draws from n seeds
// with its multinomial probability when there are at most `max_exact` of them (C(2n−1, n): 10
// at 3 seeds, 35 at 4, 6435 at 8), else `resamples` draws (seeded, thread-independent). `fn`
// gets the multiplicity of each seed and returns the statistic (NaN: the resample is skipped).
struct BootstrapDistribution {
  std::vector<double> values, weights;  // weights sum to 1 over the non-NaN values
  bool exact = false;
};
BootstrapDistribution SeedBootstrap(int n, const std::function<double(const std::vector<int>&)>& fn,
                                    int resamples = 2000, uint64_t seed = 12345,
                                    int64_t max_exact = 50000);
// Two-sided percentile interval of a weighted distribution (the lowest value whose cumulative
// weight reaches the lower tail, and likewise the upper). NaN ends when it is empty.
std::pair<double, double> WeightedPercentile(const BootstrapDistribution& d, double level);

// Below this many seeds the bootstrap percentile interval is the seed range, and named so.
constexpr int kMinSeedsForBootstrapLevel = 8;

// The primary statement about a mean over seeds (`log_scale`: of the logs of per-seed ratios,
// reported back on the ratio scale).
struct SeedStatement {
  int seeds = 0;
  int df = 0;  // seeds − 1
  double level = 0.90;
  Estimate t;                    // point (mean, or geometric mean) with the t interval
  double sign_flip_p = 0;        // exact, two-sided, H0: no difference (log ratio 0)
  Estimate bootstrap;            // point with the bootstrap percentile interval
  bool bootstrap_exact = false;  // every resample enumerated
  std::string bootstrap_label;   // "seed range" (< 8 seeds) or "90% bootstrap"
  std::string note;              // "n seeds: too few for an interval" (then NaN ends)
};

// `min_seeds`: fewer seeds give the point and the per-seed values only (no interval, p = NaN).
// `resamples`/`seed`: the bootstrap when the seeds are too many to enumerate.
SeedStatement DescribeSeeds(const std::vector<double>& per_seed, double level, bool log_scale,
                            int min_seeds = 3, int resamples = 2000, uint64_t seed = 12345);

// "1.133 [1.05, 1.21] (t, df 3), p = 0.125 (exact sign-flip); seed range [1.08, 1.19]".
std::string FormatStatement(const SeedStatement& s, const char* number_format = "{:.3f}");

void to_json(nlohmann::json& j, const SeedStatement& v);

}  // namespace moelab::analysis
