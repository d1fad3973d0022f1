#include "analysis/bootstrap.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>

#include "core/data/random.h"

namespace moelab::analysis::internal {
uint64_t StreamSeed(uint64_t seed, const std::string& name) {
  uint64_t h = data::SplitMix64(seed);
  for (unsigned char c : name) h = data::SplitMix64(h ^ c);
  return h;
}

std::vector<int> ResampleCounts(const std::vector<std::vector<int>>& strata, int n_runs,
                                uint64_t seed, int b) {
  std::vector<int> counts(n_runs, 0);
  // Seeding per resample (not one stream) keeps results independent of the thread schedule.
  std::mt19937_64 rng(data::SplitMix64(seed ^ data::SplitMix64(static_cast<uint64_t>(b) + 1)));
  for (const auto& stratum : strata) {
    const uint64_t n = stratum.size();
    // Modulo bias is < n / 2^64, negligible; it keeps the draw identical across libraries.
    for (uint64_t i = 0; i < n; ++i) counts[stratum[rng() % n]]++;
  }
  return counts;
}

std::vector<std::vector<double>> Bootstrap(
    const std::vector<std::vector<int>>& strata, int n_runs, int resamples, uint64_t seed,
    int threads, int width,
    const std::function<std::vector<double>(int b, const std::vector<int>& counts)>& fn) {
  std::vector<std::vector<double>> rows(
      resamples, std::vector<double>(width, std::numeric_limits<double>::quiet_NaN()));
  const int nt = threads > 0 ? threads : omp_get_max_threads();
#pragma omp parallel for schedule(dynamic) num_threads(nt)
  for (int b = 0; b < resamples; ++b) {
    std::vector<double> out = fn(b, ResampleCounts(strata, n_runs, seed, b));
    if (static_cast<int>(out.size()) == width) rows[b] = std::move(out);
  }
  return rows;
}

namespace {

double NormalCdf(double z) { return 0.5 * std::erfc(-z / std::sqrt(2.0)); }

double NormalQuantile(double p) {
  // Newton on the CDF; the density is smooth and the start at 0 converges for 1e-12 < p < 1.
  double z = 0;
  for (int i = 0; i < 60; ++i) {
    double step = (NormalCdf(z) - p) / (std::exp(-0.5 * z * z) / std::sqrt(2 * M_PI));
    z -= step;
    if (std::abs(step) < 1e-12) break;
  }
  return z;
}

// Student-t quantile from the normal one (Cornish–Fisher, Abramowitz & Stegun 26.7.5): accurate
// to ~1e-3 for ν ≥ 3, ample for an interval level.
double StudentQuantile(double p, double nu) {
  double z = NormalQuantile(p), z2 = z * z;
  double g1 = (z2 + 1) * z / 4;
  double g2 = ((5 * z2 + 16) * z2 + 3) * z / 96;
  double g3 = (((3 * z2 + 19) * z2 + 17) * z2 - 15) * z / 384;
  return z + g1 / nu + g2 / (nu * nu) + g3 / (nu * nu * nu);
}

}  // namespace

double ExpandedLevel(double level, int n) {
  if (n < 2) return level;
  double t = StudentQuantile(1 - (1 - level) / 2, n - 1);
  double z = std::sqrt(static_cast<double>(n) / (n - 1)) * t;
  return 1 - 2 * NormalCdf(-z);
}

std::pair<double, double> PercentileInterval(std::vector<double> values, double level) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  values.erase(std::remove_if(values.begin(), values.end(), [](double v) { return std::isnan(v); }),
               values.end());
  if (values.empty()) return {nan, nan};
  std::sort(values.begin(), values.end());
  auto at = [&](double q) {
    double pos = q * (values.size() - 1);
    size_t i = static_cast<size_t>(std::floor(pos));
    size_t j = std::min(i + 1, values.size() - 1);
    double f = pos - i;
    if (f == 0 || values[i] == values[j]) return values[i];
    return values[i] + f * (values[j] - values[i]);
  };
  double tail = (1 - level) / 2;
  return {at(tail), at(1 - tail)};
}

}  // namespace moelab::analysis::internal
