#include "analysis/seed_stats.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "analysis/bootstrap.h"
#include "analysis/fit_common.h"
#include "core/data/random.h"

namespace moelab::analysis {

using internal::kNaN;

double StudentTCdf(double t, int df) {
  if (df < 1) throw AnalysisError(fmt::format("Student t: df {} (needs ≥ 1)", df));
  if (std::isinf(t)) return t > 0 ? 1.0 : 0.0;
  // A(t|ν) = P(|T| ≤ |t|), Abramowitz & Stegun 26.7.3 (ν odd) and 26.7.4 (ν even).
  const double theta = std::atan(std::abs(t) / std::sqrt(static_cast<double>(df)));
  const double s = std::sin(theta), c = std::cos(theta), c2 = c * c;
  double a;
  if (df % 2 == 1) {
    double sum = 0;
    if (df > 1) {
      double term = c;  // cos θ, then ·(2k)/(2k+1)·cos²θ
      sum = term;
      for (int k = 1; 2 * k + 1 <= df - 2; ++k) {
        term *= c2 * (2.0 * k) / (2.0 * k + 1);
        sum += term;
      }
    }
    a = 2.0 / M_PI * (theta + s * sum);
  } else {
    double term = 1, sum = 1;
    for (int k = 1; 2 * k <= df - 2; ++k) {
      term *= c2 * (2.0 * k - 1) / (2.0 * k);
      sum += term;
    }
    a = s * sum;
  }
  return t >= 0 ? 0.5 + 0.5 * a : 0.5 - 0.5 * a;
}

double StudentTQuantile(double p, int df) {
  if (!(p > 0 && p < 1)) throw AnalysisError(fmt::format("Student t quantile: p = {}", p));
  if (p == 0.5) return 0;
  // The CDF is monotone: bracket, then bisect (1/ε tails at df = 1 reach ~1e12 for p ~ 1e-12).
  double lo = -1, hi = 1;
  while (StudentTCdf(lo, df) > p) lo *= 2;
  while (StudentTCdf(hi, df) < p) hi *= 2;
  for (int i = 0; i < 200 && hi - lo > 1e-13 * std::max(1.0, std::abs(lo)); ++i) {
    const double mid = 0.5 * (lo + hi);
    (StudentTCdf(mid, df) < p ? lo : hi) = mid;
  }
  return 0.5 * (lo + hi);
}

Estimate TInterval(const std::vector<double>& v, double level) {
  const int n = static_cast<int>(v.size());
  if (n == 0) return {kNaN, kNaN, kNaN};
  const double mean = std::accumulate(v.begin(), v.end(), 0.0) / n;
  if (n < 2) return {mean, kNaN, kNaN};
  double ss = 0;
  for (double x : v) ss += (x - mean) * (x - mean);
  const double se = std::sqrt(ss / (n - 1) / n);
  const double q = StudentTQuantile(1 - (1 - level) / 2, n - 1);
  return {mean, mean - q * se, mean + q * se};
}

double SignFlipP(const std::vector<double>& v) {
  const int n = static_cast<int>(v.size());
  if (n == 0) return kNaN;
  const double observed = std::abs(std::accumulate(v.begin(), v.end(), 0.0));
  // Ties within rounding count as "at least as extreme" (the conservative side).
  const double tol = 1e-12 * (1 + std::accumulate(v.begin(), v.end(), 0.0, [](double s, double x) {
                                return s + std::abs(x);
                              }));
  auto extreme = [&](const std::function<bool(int)>& flipped) {
    double s = 0;
    for (int i = 0; i < n; ++i) s += flipped(i) ? -v[i] : v[i];
    return std::abs(s) >= observed - tol;
  };
  constexpr int kMaxExact = 20;
  if (n <= kMaxExact) {
    const uint64_t total = uint64_t{1} << n;
    uint64_t hits = 0;
    for (uint64_t signs = 0; signs < total; ++signs)
      hits += extreme([&](int i) { return (signs >> i & 1) != 0; });
    return static_cast<double>(hits) / total;
  }
  std::mt19937_64 rng(data::SplitMix64(0x5167f11bULL + n));
  const uint64_t total = uint64_t{1} << 16;
  uint64_t hits = 0;
  for (uint64_t b = 0; b < total; ++b) hits += extreme([&](int) { return (rng() & 1) != 0; });
  // The observed assignment counts once (a valid Monte Carlo permutation p-value).
  return static_cast<double>(hits + 1) / (total + 1);
}

namespace {

// C(2n−1, n): the number of multisets of n draws from n seeds; capped to stop overflow.
int64_t MultisetCount(int n, int64_t cap) {
  double c = 1;
  for (int k = 1; k <= n; ++k) c = c * (n - 1 + k) / k;
  return c > static_cast<double>(cap) ? cap + 1 : static_cast<int64_t>(std::llround(c));
}

// Visits every composition of n into n non-negative parts (a multiset of seeds), with the
// multinomial probability n! / (Π c_i! · nⁿ).
void ForEachMultiset(int n, const std::function<void(const std::vector<int>&, double)>& visit) {
  std::vector<int> counts(n, 0);
  const double log_norm = std::lgamma(n + 1.0) - n * std::log(static_cast<double>(n));
  std::function<void(int, int, double)> rec = [&](int i, int left, double log_w) {
    if (i == n - 1) {
      counts[i] = left;
      visit(counts, std::exp(log_norm + log_w - std::lgamma(left + 1.0)));
      return;
    }
    for (int c = 0; c <= left; ++c) {
      counts[i] = c;
      rec(i + 1, left - c, log_w - std::lgamma(c + 1.0));
    }
  };
  rec(0, n, 0.0);
}

}  // namespace

BootstrapDistribution SeedBootstrap(int n, const std::function<double(const std::vector<int>&)>& fn,
                                    int resamples, uint64_t seed, int64_t max_exact) {
  BootstrapDistribution d;
  if (n < 1) return d;
  double total = 0;
  auto add = [&](double value, double w) {
    if (std::isnan(value)) return;
    d.values.push_back(value);
    d.weights.push_back(w);
    total += w;
  };
  if (MultisetCount(n, max_exact) <= max_exact) {
    d.exact = true;
    ForEachMultiset(n, [&](const std::vector<int>& c, double w) { add(fn(c), w); });
  } else {
    std::vector<int> all(n);
    std::iota(all.begin(), all.end(), 0);
    for (int b = 0; b < resamples; ++b) add(fn(internal::ResampleCounts({all}, n, seed, b)), 1);
  }
  for (double& w : d.weights) w /= total;
  return d;
}

std::pair<double, double> WeightedPercentile(const BootstrapDistribution& d, double level) {
  if (d.values.empty()) return {kNaN, kNaN};
  std::vector<size_t> order(d.values.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(),
            [&](size_t a, size_t b) { return d.values[a] < d.values[b]; });
  const double tail = (1 - level) / 2;
  double lo = d.values[order.front()], hi = d.values[order.back()];
  double cum = 0;
  bool lo_set = false;
  for (size_t i : order) {
    cum += d.weights[i];
    if (!lo_set && cum >= tail - 1e-12) lo = d.values[i], lo_set = true;
    if (cum >= 1 - tail - 1e-12) {
      hi = d.values[i];
      break;
    }
  }
  return {lo, hi};
}

SeedStatement DescribeSeeds(const std::vector<double>& per_seed, double level, bool log_scale,
                            int min_seeds, int resamples, uint64_t seed) {
  SeedStatement s;
  s.seeds = static_cast<int>(per_seed.size());
  s.df = std::max(0, s.seeds - 1);
  s.level = level;
  std::vector<double> x = per_seed;
  if (log_scale)
    for (double& v : x) v = std::log(v);
  auto back = [&](double v) { return log_scale ? std::exp(v) : v; };
  auto back_e = [&](Estimate e) { return Estimate{back(e.estimate), back(e.lo), back(e.hi)}; };
  const Estimate t = TInterval(x, level);
  s.t = {back(t.estimate), kNaN, kNaN};
  s.bootstrap = s.t;
  s.sign_flip_p = kNaN;
  s.note = internal::TooFewUnits(s.seeds, std::max(2, min_seeds));
  if (!s.note.empty()) return s;
  s.t = back_e(t);
  s.sign_flip_p = SignFlipP(x);
  const BootstrapDistribution d = SeedBootstrap(
      s.seeds,
      [&](const std::vector<int>& c) {
        double sum = 0;
        for (int i = 0; i < s.seeds; ++i) sum += c[i] * x[i];
        return sum / s.seeds;
      },
      resamples, seed);
  const auto [lo, hi] = WeightedPercentile(d, level);
  s.bootstrap = {s.t.estimate, back(lo), back(hi)};
  s.bootstrap_exact = d.exact;
  s.bootstrap_label = s.seeds < kMinSeedsForBootstrapLevel
                          ? "seed range"
                          : fmt::format("{:.0f}% bootstrap", 100 * level);
  return s;
}

std::string FormatStatement(const SeedStatement& s, const char* spec) {
  auto num = [&](double v) { return fmt::format(fmt::runtime(spec), v); };
  if (!s.note.empty()) return fmt::format("{} (no interval: {})", num(s.t.estimate), s.note);
  return fmt::format("{} [{}, {}] ({:.0f}% t, df {}), p = {:.3g} (exact sign-flip); {} [{}, {}]",
                     num(s.t.estimate), num(s.t.lo), num(s.t.hi), 100 * s.level, s.df,
                     s.sign_flip_p, s.bootstrap_label, num(s.bootstrap.lo), num(s.bootstrap.hi));
}

void to_json(nlohmann::json& j, const SeedStatement& v) {
  j = {{"seeds", v.seeds},
       {"df", v.df},
       {"level", v.level},
       {"t_interval", v.t},
       {"sign_flip_p", v.sign_flip_p},
       {"bootstrap", v.bootstrap},
       {"bootstrap_exact", v.bootstrap_exact},
       {"bootstrap_label", v.bootstrap_label},
       {"note", v.note}};
}

}  // namespace moelab::analysis
