// Shared helpers for the CUDA twin tests: the GPU skip, random inputs, comparisons, and the
// micro-benchmarks' timer.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "kernels/cuda/device.h"
#include "tests/cuda_kernels/emulation_test_util.h"

namespace moelab::cuda::testing {

// Skips the current test when no CUDA device is usable, with the reason.
#define MOELAB_REQUIRE_GPU()                                      \
  do {                                                            \
    std::string moelab_gpu_reason;                                \
    if (!::moelab::cuda::CudaAvailable(&moelab_gpu_reason)) {     \
      GTEST_SKIP() << "CUDA test skipped: " << moelab_gpu_reason; \
    }                                                             \
  } while (0)

// emulation_test's seeded values, with this file's default range [-1, 1).
inline std::vector<float> Random(size_t n, uint32_t seed, float lo = -1, float hi = 1) {
  return emulation_test::Random(n, seed, lo, hi);
}

// bf16 rounding of host values (round to nearest even, __float2bfloat16) and back.
using emulation_test::ToBf16;
inline std::vector<float> ToFloat(const std::vector<bf16>& v) {
  std::vector<float> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = __bfloat162float(v[i]);
  return out;
}

template <typename T>
DeviceBuffer<T> ToDevice(const std::vector<T>& host) {
  DeviceBuffer<T> d;
  d.Upload(host);
  return d;
}

// Max over i of |a−b| / (atol + rtol·|b|) must be ≤ 1: expects a within tolerance of b.
inline void ExpectNear(const std::vector<float>& got, const std::vector<float>& want, double atol,
                       double rtol, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double worst = 0;
  size_t at = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err =
        std::abs(double(got[i]) - want[i]) / (atol + rtol * std::abs(double(want[i])));
    if (!(err <= worst)) {  // NaN counts as worst
      worst = std::isnan(err) ? INFINITY : err;
      at = i;
    }
  }
  EXPECT_LE(worst, 1.0) << what << ": worst at " << at << " got " << got[at] << " want " << want[at]
                        << " (atol " << atol << ", rtol " << rtol << ")";
}

// Milliseconds per call of f, timed with CUDA events over `iters` calls after 2 warm-ups.
inline double TimeMs(const std::function<void()>& f, int iters = 10) {
  for (int i = 0; i < 2; ++i) f();
  EventTimer timer;
  timer.Start();
  for (int i = 0; i < iters; ++i) f();
  timer.Stop();
  return timer.Seconds() * 1e3 / iters;
}

}  // namespace moelab::cuda::testing
