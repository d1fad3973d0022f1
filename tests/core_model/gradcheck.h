// Finite-difference helpers shared by the kernel and model gradient checks (double precision).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <vector>

namespace moelab::testing {

inline std::vector<double> RandomVector(size_t n, uint64_t seed, double scale = 1.0) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> dist(0.0, scale);
  std::vector<double> v(n);
  for (double& x : v) x = dist(rng);
  return v;
}

// |a − b| relative to the larger magnitude, with a floor so coordinates whose gradient is
// essentially zero are judged absolutely: below 1e-4 a bound of 1e-6 means |a − b| < 1e-10,
// still 100× the finite-difference rounding noise (≈ 1e-16·|f| / h ≈ 1e-12).
inline double RelErr(double a, double b, double floor = 1e-4) {
  return std::abs(a - b) / std::max({std::abs(a), std::abs(b), floor});
}

// Fourth-order central difference of f with respect to *x (x is restored):
// (f(x−2h) − 8f(x−h) + 8f(x+h) − f(x+2h)) / 12h. Its truncation error is O(h⁴), so h can be
// large enough (1e-4) that the rounding error of f, ≈ 1e-16·|f|/h, stays near 1e-12: the plain
// two-point difference cannot get both below 1e-9 and would hide real errors of that size.
inline double CentralDiff(const std::function<double()>& f, double* x, double h = 1e-4) {
  const double x0 = *x;
  double v[4];
  const double off[4] = {-2, -1, 1, 2};
  for (int i = 0; i < 4; ++i) {
    *x = x0 + off[i] * h;
    v[i] = f();
  }
  *x = x0;
  return (v[0] - 8 * v[1] + 8 * v[2] - v[3]) / (12 * h);
}

// Checks `count` coordinates of x (all of them when count >= n, else a fixed random sample plus
// the first and last): returns the max relative error of analytic vs numeric gradients.
inline double MaxGradErr(const std::function<double()>& f, double* x, const double* analytic,
                         size_t n, size_t count, uint64_t seed, double eps = 1e-4) {
  std::vector<size_t> idx;
  if (count >= n) {
    for (size_t i = 0; i < n; ++i) idx.push_back(i);
  } else {
    std::mt19937_64 rng(seed);
    idx.push_back(0);
    idx.push_back(n - 1);
    for (size_t c = 2; c < count; ++c) idx.push_back(rng() % n);
  }
  double worst = 0;
  for (size_t i : idx) {
    const double num = CentralDiff(f, x + i, eps);
    const double e = RelErr(analytic[i], num);
    if (e > worst && std::getenv("GRADCHECK_VERBOSE"))
      std::fprintf(stderr, "  [%zu] analytic %.12g numeric %.12g rel %.3g\n", i, analytic[i], num,
                   e);
    worst = std::max(worst, e);
  }
  return worst;
}

}  // namespace moelab::testing
