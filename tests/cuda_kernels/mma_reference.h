// The layout checks' cases (mma_emulation_test.cc on the CPU, mma_test.cc on the GPU): a 16×16 by
// 16×8 mma.sync product of bf16-representable inputs whose every product and partial sum is
// exact in fp32, so the expected C is exact whatever the summation order; and a 32×8 tile loaded
// by cp.async and ldmatrix, the expected registers written from the PTX ISA's description.
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

// A 32×8 tile of distinct non-zero 16-bit patterns (row-major) for flash::LdMatrixProbe; rows
// ≥ valid are to arrive zero-filled.
struct LdMatrixCase {
  std::vector<uint16_t> tile;
  int valid = 27;
};
inline LdMatrixCase MakeLdMatrixCase() {
  LdMatrixCase c;
  for (int i = 0; i < 256; ++i) c.tile.push_back(static_cast<uint16_t>(0x4000 + 7 * i + 1));
  return c;
}

// What the PTX ISA says each lane receives (ldmatrix: "addresses addr0–addr7 correspond to the
// rows of the first matrix, ..."; "each thread in a warp loads fragments of a row, with thread 0
// receiving the first fragment in its register r ... a group of four threads loads an entire
// row"; .trans: the matrix loaded column-major). Lane l, matrix m (rows 8m..8m+7 of the tile):
// plain, row l/4 and columns 2(l%4), 2(l%4)+1; .trans, column l/4 and rows 2(l%4), 2(l%4)+1;
// the lower column (row) in the low 16 bits. out: 32 lanes × (4 plain, 4 .trans) registers.
inline void ExpectLdMatrixRegisters(const LdMatrixCase& c, const std::vector<uint32_t>& out) {
  ASSERT_EQ(out.size(), 256u);
  auto at = [&](int r, int col) -> uint32_t { return r < c.valid ? c.tile[r * 8 + col] : 0u; };
  int bad = 0;
  for (int l = 0; l < 32 && bad < 8; ++l) {
    const int g = l / 4, t = l % 4;
    for (int m = 0; m < 4; ++m) {
      const uint32_t plain = at(8 * m + g, 2 * t) | at(8 * m + g, 2 * t + 1) << 16;
      const uint32_t trans = at(8 * m + 2 * t, g) | at(8 * m + 2 * t + 1, g) << 16;
      if (out[8 * l + m] != plain || out[8 * l + 4 + m] != trans) {
        ADD_FAILURE() << "lane " << l << " matrix " << m << ": plain " << std::hex << out[8 * l + m]
                      << " want " << plain << ", trans " << out[8 * l + 4 + m] << " want " << trans;
        ++bad;
      }
    }
  }
}

}  // namespace moelab::cuda
