// Elementwise math that the compiler can vectorise. std::exp is a libm call that GCC does not
// vectorise without -ffast-math, and the softmaxes, SiLU and cross-entropy spend most of their
// non-GEMM time in it; Exp<float> is a Cephes-style polynomial (≈1 ulp, max rel err < 2e-7 on
// [-87, 88]) written with plain arithmetic and integer selects only, so `#pragma omp simd`
// loops turn into AVX2/AVX-512 code.
// Exp<double> stays std::exp: double precision exists for finite-difference checks, not speed.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>

namespace moelab::cpu {

// Maps float bits to an int32 whose signed order is the float order (an involution): a float
// clamp done as an integer clamp vectorises, while float compares do not under GCC's default
// -ftrapping-math (if-conversion refuses them and the whole loop stays scalar).
constexpr int32_t FloatOrderKey(int32_t bits) { return bits ^ ((bits >> 31) & 0x7fffffff); }

inline float ExpFloat(float x) {
  const int32_t bits = std::bit_cast<int32_t>(x);
  // Clamp so 2^n stays a normal float; exp(-87.3) ≈ 1.2e-38 is "zero" for every softmax here
  // (−inf, the masked logit, also lands there).
  constexpr int32_t kLo = FloatOrderKey(std::bit_cast<int32_t>(-87.3f));
  constexpr int32_t kHi = FloatOrderKey(std::bit_cast<int32_t>(88.3f));
  int32_t key = FloatOrderKey(bits);
  key = key < kLo ? kLo : key;
  key = key > kHi ? kHi : key;
  x = std::bit_cast<float>(FloatOrderKey(key));
  // Round x·log2(e) to the nearest integer with the 1.5·2^23 trick (no libm, vectorisable).
  const float kShift = 12582912.0f;
  const float t = x * 1.44269504088896341f + kShift;
  const float n = t - kShift;
  const int32_t ni = std::bit_cast<int32_t>(t) - std::bit_cast<int32_t>(kShift);
  // r = x - n·ln2 in two parts for accuracy; |r| ≤ ln2/2.
  float r = x - n * 0.693359375f;
  r = r + n * 2.12194440e-4f;
  const float r2 = r * r;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r2 + r + 1.0f;
  const int32_t result = std::bit_cast<int32_t>(p * std::bit_cast<float>((ni + 127) << 23));
  // NaN in, NaN out (the clamp above would otherwise turn it into a number and hide a
  // divergence).
  // (An OR with a mask, not a select: a ternary here stops GCC vectorising the loop.)
  const int32_t nan_mask = -static_cast<int32_t>((bits & 0x7fffffff) > 0x7f800000);
  return std::bit_cast<float>(result | (nan_mask & 0x7fc00000));
}

template <typename T>
inline T Exp(T x) {
  return std::exp(x);
}
template <>
inline float Exp<float>(float x) {
  return ExpFloat(x);
}

// 1/(1+e^{-x}) built on Exp so it vectorises too.
template <typename T>
inline T Sigmoid(T x) {
  return T(1) / (T(1) + Exp<T>(-x));
}

}  // namespace moelab::cpu
