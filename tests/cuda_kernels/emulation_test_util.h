// Inputs and comparisons shared by the CPU-emulation tests of the kernels' own source
// (tests/cuda_kernels/*_emulation_test.cc, most of which live in this namespace): seeded uniform
// values, their bf16 rounding, and bit-for-bit equality.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

namespace moelab::cuda::emulation_test {

using bf16 = __nv_bfloat16;

// n values uniform in [lo, hi) from std::mt19937(seed).
inline std::vector<float> Random(size_t n, uint32_t seed, float lo = -2, float hi = 2) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

// Each value rounded to the nearest bf16.
inline std::vector<__nv_bfloat16> ToBf16(const std::vector<float>& v) {
  std::vector<__nv_bfloat16> b(v.size());
  for (size_t i = 0; i < v.size(); ++i) b[i] = __float2bfloat16(v[i]);
  return b;
}

template <typename T>
bool SameBits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), sizeof(T) * a.size()) == 0;
}

}  // namespace moelab::cuda::emulation_test
