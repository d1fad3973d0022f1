// The min/max pyramid behind zooming: its per-column M4 equals the plain scan's, point for point,
// on random series with NaN gaps, on linear and log axes, at every zoom.
#include "gui/pyramid.h"

#include <gtest/gtest.h>
#include <time.h>

#include <cmath>
#include <cstdio>
#include <limits>
#include <random>
#include <vector>

namespace moelab::gui {
namespace {

TEST(Pyramid, QueryFindsTheFirstMinAndMaxOfAnyRange) {
  std::mt19937 rng(3);
  std::uniform_int_distribution<int> v(0, 20);  // ties on purpose
  std::vector<double> ys(1000);
  for (double& y : ys) y = v(rng);
  ys[17] = std::numeric_limits<double>::quiet_NaN();
  MinMaxPyramid p;
  p.Build(ys);
  std::uniform_int_distribution<size_t> at(0, ys.size());
  for (int trial = 0; trial < 2000; ++trial) {
    size_t a = at(rng), b = at(rng);
    if (a > b) std::swap(a, b);
    size_t want_min = SIZE_MAX, want_max = SIZE_MAX;
    for (size_t i = a; i < b; ++i) {
      if (std::isnan(ys[i])) continue;
      if (want_min == SIZE_MAX || ys[i] < ys[want_min]) want_min = i;
      if (want_max == SIZE_MAX || ys[i] > ys[want_max]) want_max = i;
    }
    size_t imin = 0, imax = 0;
    const bool found = p.Query(ys, a, b, &imin, &imax);
    ASSERT_EQ(found, want_min != SIZE_MAX) << a << " " << b;
    if (!found) continue;
    EXPECT_EQ(imin, want_min) << a << " " << b;
    EXPECT_EQ(imax, want_max) << a << " " << b;
  }
  EXPECT_LT(p.bytes(), ys.size() * 5);  // about 4 bytes per point
}

TEST(Pyramid, DownsampleEqualsThePlainM4AtEveryZoom) {
  std::mt19937 rng(5);
  std::normal_distribution<double> noise(0, 1);
  const size_t n = 100000;
  std::vector<double> xs(n), ys(n);
  for (size_t i = 0; i < n; ++i) {
    xs[i] = static_cast<double>(i + 1);
    ys[i] = 3 + std::sin(i * 1e-3) + 0.1 * noise(rng);
  }
  for (size_t i = 40000; i < 40100; ++i) ys[i] = std::numeric_limits<double>::quiet_NaN();
  MinMaxPyramid p;
  p.Build(ys);
  for (bool log : {false, true}) {
    for (double zoom : {1.0, 0.5, 0.1, 0.013, 0.002}) {
      for (int cols : {200, 997}) {
        const double lo = 1 + n * 0.3 * (1 - zoom), hi = lo + n * zoom;
        const AxisMap axis{lo, hi, log};
        std::vector<double> ax, ay, bx, by;
        DownsampleM4(xs, ys, axis, cols, &ax, &ay);
        DownsampleM4Pyramid(xs, ys, p, axis, cols, &bx, &by);
        ASSERT_EQ(ax, bx) << "log " << log << " zoom " << zoom << " cols " << cols;
        ASSERT_EQ(ay, by) << "log " << log << " zoom " << zoom << " cols " << cols;
      }
    }
  }
}

double ThreadCpuMs() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

TEST(Pyramid, AZoomCostsAFractionOfTheScan) {
  // 20 series x 100k points, 20 zoom steps at 1200 columns: CPU time (not wall: the test
  // machine is shared) of the plain M4 scan against the pyramid.
  const size_t n = 100000;
  std::vector<double> xs(n), ys(n);
  for (size_t i = 0; i < n; ++i) {
    xs[i] = static_cast<double>(i + 1);
    ys[i] = 3 + std::sin(i * 1e-3) + 0.1 * std::sin(i * 0.37);
  }
  MinMaxPyramid p;
  const double b0 = ThreadCpuMs();
  p.Build(ys);
  const double build_ms = ThreadCpuMs() - b0;
  std::vector<double> ox, oy;
  double scan_ms = 0, pyramid_ms = 0;
  for (int series = 0; series < 20; ++series) {
    for (int i = 0; i < 20; ++i) {
      const AxisMap axis{n * 0.002 * i, n * (1.0 - 0.004 * i), false};
      double t0 = ThreadCpuMs();
      DownsampleM4(xs, ys, axis, 1200, &ox, &oy);
      scan_ms += ThreadCpuMs() - t0;
      t0 = ThreadCpuMs();
      DownsampleM4Pyramid(xs, ys, p, axis, 1200, &ox, &oy);
      pyramid_ms += ThreadCpuMs() - t0;
    }
  }
  std::printf(
      "400 downsamples of 100k points to 1200 columns: scan %.1f ms, pyramid %.1f ms "
      "(build %.2f ms once per series version)\n",
      scan_ms, pyramid_ms, build_ms);
  EXPECT_LT(pyramid_ms, scan_ms * 0.8);  // about half here; loose for shared test machines
}

}  // namespace
}  // namespace moelab::gui
