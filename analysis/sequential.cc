#include "analysis/sequential.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <functional>

namespace moelab::analysis {

namespace {

// SplitMix64: a small, portable generator (std::normal_distribution differs between standard
// libraries; the boundary must not).
struct SplitMix {
  uint64_t state;
  uint64_t Next() {
    uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  double Uniform() { return (static_cast<double>(Next() >> 11) + 0.5) * 0x1.0p-53; }
  double Normal() {  // Box–Muller, one value per call (simple beats fast here)
    const double u = Uniform(), v = Uniform();
    return std::sqrt(-2.0 * std::log(u)) * std::cos(2.0 * M_PI * v);
  }
};

void CheckSchedule(const std::vector<int>& looks, const SequentialDesign& design) {
  if (!(design.alpha > 0 && design.alpha < 1)) {
    throw AnalysisError(fmt::format("sequential: alpha {} is not in (0, 1)", design.alpha));
  }
  if (design.paths < 1000) throw AnalysisError("sequential: fewer than 1000 simulated paths");
  if (looks.empty()) throw AnalysisError("sequential: no look");
  for (size_t k = 0; k < looks.size(); ++k) {
    if (looks[k] < 2 || (k > 0 && looks[k] <= looks[k - 1]) || looks[k] > design.max_seeds) {
      throw AnalysisError(fmt::format(
          "sequential: looks must be increasing seed counts from 2 to max_seeds {}, got [{}]",
          design.max_seeds, fmt::join(looks, ", ")));
    }
  }
}

}  // namespace

double PocockSpending(double alpha, double t) {
  t = std::clamp(t, 0.0, 1.0);
  return alpha * std::log(1.0 + (M_E - 1.0) * t);
}

std::vector<double> RepeatedTBoundaries(const std::vector<int>& looks,
                                        const SequentialDesign& design) {
  CheckSchedule(looks, design);
  const size_t K = looks.size();
  const int paths = design.paths;
  // |T_k| of every null path at every look. Path p draws its own stream (seeded by p), so its
  // first n values, and hence c_k, do not depend on how many looks follow.
  std::vector<double> abs_t(static_cast<size_t>(paths) * K);
  for (int p = 0; p < paths; ++p) {
    SplitMix rng{design.seed * 0x100000001b3ULL + static_cast<uint64_t>(p)};
    double mean = 0, m2 = 0;  // Welford
    size_t k = 0;
    for (int i = 1; i <= looks.back(); ++i) {
      const double z = rng.Normal();
      const double d = z - mean;
      mean += d / i;
      m2 += d * (z - mean);
      if (i == looks[k]) {
        const double se = std::sqrt(m2 / (i - 1) / i);
        abs_t[static_cast<size_t>(p) * K + k] = std::abs(mean) / se;
        ++k;
      }
    }
  }
  std::vector<char> alive(paths, 1);
  std::vector<double> critical(K);
  double spent_before = 0;
  for (size_t k = 0; k < K; ++k) {
    const double spent = PocockSpending(design.alpha, double(looks[k]) / design.max_seeds);
    const int64_t exits = std::llround((spent - spent_before) * paths);
    spent_before = spent;
    std::vector<double> v;
    for (int p = 0; p < paths; ++p) {
      if (alive[p]) v.push_back(abs_t[static_cast<size_t>(p) * K + k]);
    }
    std::sort(v.begin(), v.end(), std::greater<double>());
    double c;
    if (exits <= 0) {
      c = v.empty() ? INFINITY : v.front();
    } else if (exits >= static_cast<int64_t>(v.size())) {
      c = 0;
    } else {
      c = v[exits];  // exactly `exits` alive paths lie above c
    }
    critical[k] = c;
    for (int p = 0; p < paths; ++p) {
      if (alive[p] && abs_t[static_cast<size_t>(p) * K + k] > c) alive[p] = 0;
    }
  }
  return critical;
}

RepeatedInterval RepeatedTInterval(const std::vector<double>& values, const std::vector<int>& looks,
                                   const SequentialDesign& design) {
  CheckSchedule(looks, design);
  if (static_cast<int>(values.size()) != looks.back()) {
    throw AnalysisError(
        fmt::format("sequential: {} values at a look of {} seeds", values.size(), looks.back()));
  }
  const std::vector<double> c = RepeatedTBoundaries(looks, design);
  const double n = static_cast<double>(values.size());
  double mean = 0;
  for (double v : values) mean += v;
  mean /= n;
  double ss = 0;
  for (double v : values) ss += (v - mean) * (v - mean);
  const double se = std::sqrt(ss / (n - 1) / n);
  RepeatedInterval r;
  r.look = static_cast<int>(looks.size());
  r.seeds = looks.back();
  r.critical = c.back();
  r.alpha_spent = PocockSpending(design.alpha, n / design.max_seeds);
  r.value = {mean, mean - r.critical * se, mean + r.critical * se};
  return r;
}

std::string FormatRepeatedInterval(const RepeatedInterval& r, const SequentialDesign& design) {
  return fmt::format(
      "{:.4f} [{:.4f}, {:.4f}] (repeated t, look {} at {} seeds, c = {:.3f}, "
      "alpha spent {:.3f} of {:.3f})",
      r.value.estimate, r.value.lo, r.value.hi, r.look, r.seeds, r.critical, r.alpha_spent,
      design.alpha);
}

}  // namespace moelab::analysis
