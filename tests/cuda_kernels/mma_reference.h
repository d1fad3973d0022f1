// A 16×16 by 16×8 product case for the mma.sync layout checks (mma_emulation_test.cc on the
// CPU, mma_test.cc on the GPU): bf16-representable inputs whose every product and partial sum is
// exact in fp32, so the expected C is exact whatever the summation order.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

namespace moelab::cuda {

struct MmaCase {
  std::vector<uint16_t> a, b;  // bf16 bits: A 16×16, B 16×8, row-major
  std::vector<double> c;       // A·B, 16×8
};

inline uint16_t Bf16Bits(float x) {  // x is bf16-representable: its high half
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return static_cast<uint16_t>(u >> 16);
}

// Small integers times powers of two: every entry distinct enough that a swapped row, column,
// half or register shows up.
inline MmaCase MakeMmaCase(uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> v(-15, 15);
  MmaCase m;
  std::vector<float> a(256), b(128);
  for (int i = 0; i < 256; ++i) a[i] = static_cast<float>(v(rng)) * (i % 2 ? 0.5f : 1.0f);
  for (int i = 0; i < 128; ++i) b[i] = static_cast<float>(v(rng)) * (i % 3 ? 0.25f : 1.0f);
  for (float x : a) m.a.push_back(Bf16Bits(x));
  for (float x : b) m.b.push_back(Bf16Bits(x));
  m.c.assign(128, 0.0);
  for (int r = 0; r < 16; ++r)
    for (int n = 0; n < 8; ++n)
      for (int k = 0; k < 16; ++k) m.c[r * 8 + n] += double(a[r * 16 + k]) * b[k * 8 + n];
  return m;
}

inline void ExpectMmaProduct(const MmaCase& m, const std::vector<float>& c) {
  ASSERT_EQ(c.size(), 128u);
  int bad = 0;
  for (int i = 0; i < 128 && bad < 8; ++i)
    if (c[i] != m.c[i]) {
      ADD_FAILURE() << "C[" << i / 8 << "][" << i % 8 << "] = " << c[i] << ", want " << m.c[i];
      ++bad;
    }
}

}  // namespace moelab::cuda
