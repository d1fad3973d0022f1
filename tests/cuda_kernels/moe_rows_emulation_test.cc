// The MoE row-move kernels' own source (kernels/cuda/moe_rows_kernels.cuh) on the CPU under
// tests/cuda_kernels/emulation/cuda_emulation.h: the element-per-thread form (kVec = 1, the one
// that ran on a GPU) against the CPU twins (kernels/cpu/moe_routing.h) in fp32, and the 16-byte
// form (kVec = 8) against it bit for bit, in fp32 and with bf16 expert rows (dgates within double
// rounding: its dot product splits differently).
// clang-format off
// The emulation first: it replaces the CUDA primitives the kernel headers use.
#include "tests/cuda_kernels/emulation/cuda_emulation.h"
#include "kernels/cuda/moe_rows_kernels.cuh"
// clang-format on

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "kernels/cpu/moe_routing.h"
#include "tests/cuda_kernels/emulation_test_util.h"

namespace moelab::cuda::emulation_test {
namespace {

// n tokens, top-k, a random permutation of the n·k expert rows (what the dispatch plan gives).
struct Routing {
  int n = 5, k = 3, d = 40;  // d a multiple of 8, not of the block's 8·threads
  std::vector<int> slot_row, row_token;
  std::vector<float> gates;
  Routing() {
    slot_row.resize(size_t(n) * k);
    std::iota(slot_row.begin(), slot_row.end(), 0);
    std::shuffle(slot_row.begin(), slot_row.end(), std::mt19937(7));
    row_token.resize(slot_row.size());
    for (size_t i = 0; i < slot_row.size(); ++i) row_token[slot_row[i]] = static_cast<int>(i / k);
    gates = Random(slot_row.size(), 8);
  }
};

constexpr int kThreads = 32;  // fewer than d / 8 · 8 elements per pass: the column loop wraps

// Every row-move kernel at one kVec, T the token side, TE the expert rows.
template <int kVec, typename T, typename TE>
struct Moves {
  std::vector<TE> xe, xc, back, dye;
  std::vector<T> dx, y, dgates;
  Moves(const Routing& r, const std::vector<T>& x, const std::vector<TE>& xt,
        const std::vector<TE>& ye, const std::vector<T>& dy, const std::vector<int64_t>& table,
        int chunks, int rows) {
    const int n = r.n, k = r.k, d = r.d;
    const long nk = long(n) * k;
    xe.assign(size_t(nk) * d, TE(NAN));
    emu::Launch(dim3(nk), kThreads, 0,
                [&] { moe_rows::GatherKernel<kVec>(xt.data(), d, r.row_token.data(), xe.data()); });
    xc.assign(size_t(chunks) * rows * d, TE(NAN));
    emu::Launch(dim3(chunks * rows), kThreads, 0, [&] {
      moe_rows::GatherChunkedKernel<kVec>(xt.data(), d, r.row_token.data(), table.data(), chunks,
                                          rows, xc.data());
    });
    back.assign(size_t(nk) * d, TE(NAN));
    emu::Launch(dim3(chunks * rows), kThreads, 0, [&] {
      moe_rows::UnchunkKernel<kVec>(xc.data(), table.data(), chunks, rows, d, back.data());
    });
    dx = x;  // accumulate onto x
    emu::Launch(dim3(n), kThreads, 0, [&] {
      moe_rows::SumSlotsKernel<kVec>(ye.data(), r.slot_row.data(), static_cast<const T*>(nullptr),
                                     k, d, dx.data(), true);
    });
    y.assign(size_t(n) * d, T(NAN));
    emu::Launch(dim3(n), kThreads, 0, [&] {
      moe_rows::SumSlotsKernel<kVec>(ye.data(), r.slot_row.data(), r.gates.data(), k, d, y.data(),
                                     false);
    });
    dye = ye;  // in place, as the layer does
    dgates.assign(size_t(nk), T(NAN));
    emu::Launch(dim3(n), kThreads, 0, [&] {
      moe_rows::CombineBackwardKernel<kVec>(dy.data(), dye.data(), r.slot_row.data(),
                                            r.gates.data(), k, d, dye.data(), dgates.data());
    });
  }
};

// Two experts' rows [0, 7) and [7, 15) cut into chunks of 4: 2 + 2 chunks, padded.
struct Chunks {
  int chunks = 4, rows = 4;
  std::vector<int64_t> table = {0, 4, 7, 11, 7, 7, 15, 15};
};

TEST(MoeRowsEmulation, ElementPerThreadMatchesCpuTwins) {
  const Routing r;
  const Chunks ch;
  const int n = r.n, k = r.k, d = r.d;
  const size_t nk = size_t(n) * k;
  const auto x = Random(size_t(n) * d, 1), ye = Random(nk * d, 2), dy = Random(size_t(n) * d, 3);
  const Moves<1, float, float> got(r, x, x, ye, dy, ch.table, ch.chunks, ch.rows);
  std::vector<float> xe(nk * d), dx = x, y(size_t(n) * d), dye = ye, dgates(nk);
  cpu::MoeGather(x.data(), d, r.row_token.data(), long(nk), xe.data());
  cpu::MoeGatherBackward(ye.data(), r.slot_row.data(), n, k, d, dx.data(), true);
  cpu::MoeCombine(ye.data(), r.slot_row.data(), r.gates.data(), n, k, d, y.data(), false);
  cpu::MoeCombineBackward(dy.data(), dye.data(), r.slot_row.data(), r.gates.data(), n, k, d,
                          dye.data(), dgates.data());
  EXPECT_TRUE(SameBits(got.xe, xe));
  EXPECT_TRUE(SameBits(got.back, xe)) << "chunk then un-chunk is the compact gather";
  EXPECT_TRUE(SameBits(got.dx, dx));
  for (size_t i = 0; i < y.size(); ++i) {  // the CPU build may contract g·ye + acc into an FMA
    EXPECT_NEAR(got.y[i], y[i], 1e-6 * (1 + std::abs(y[i]))) << i;
  }
  EXPECT_TRUE(SameBits(got.dye, dye));
  for (size_t i = 0; i < nk; ++i) EXPECT_NEAR(got.dgates[i], dgates[i], 1e-5) << i;
  // The chunked layout: real rows from their tokens, padding zero.
  for (int b = 0; b < ch.chunks; ++b) {
    for (int j = 0; j < ch.rows; ++j) {
      const int64_t row = ch.table[b] + j;
      const bool real = row < ch.table[ch.chunks + b];
      for (int c = 0; c < d; ++c) {
        const float want = real ? x[size_t(r.row_token[row]) * d + c] : 0.0f;
        ASSERT_EQ(got.xc[(size_t(b) * ch.rows + j) * d + c], want) << b << " " << j << " " << c;
      }
    }
  }
}

template <typename TE>
void ExpectSixteenByteMovesSameBits(const std::vector<TE>& xt, const std::vector<TE>& ye) {
  const Routing r;
  const Chunks ch;
  const auto x = Random(size_t(r.n) * r.d, 1), dy = Random(size_t(r.n) * r.d, 3);
  const Moves<1, float, TE> one(r, x, xt, ye, dy, ch.table, ch.chunks, ch.rows);
  const Moves<8, float, TE> eight(r, x, xt, ye, dy, ch.table, ch.chunks, ch.rows);
  EXPECT_TRUE(SameBits(eight.xe, one.xe));
  EXPECT_TRUE(SameBits(eight.xc, one.xc));
  EXPECT_TRUE(SameBits(eight.back, one.back));
  EXPECT_TRUE(SameBits(eight.dx, one.dx));
  EXPECT_TRUE(SameBits(eight.y, one.y));
  EXPECT_TRUE(SameBits(eight.dye, one.dye));
  for (size_t i = 0; i < one.dgates.size(); ++i) {
    EXPECT_NEAR(eight.dgates[i], one.dgates[i], 1e-6 * (1 + std::abs(one.dgates[i]))) << i;
  }
}

TEST(MoeRowsEmulation, SixteenByteMovesGiveTheSameBitsFp32) {
  const Routing r;
  const auto x = Random(size_t(r.n) * r.d, 1), ye = Random(size_t(r.n) * r.k * r.d, 2);
  ExpectSixteenByteMovesSameBits<float>(x, ye);
}

TEST(MoeRowsEmulation, SixteenByteMovesGiveTheSameBitsBf16Rows) {
  const Routing r;
  ExpectSixteenByteMovesSameBits<bf16>(ToBf16(Random(size_t(r.n) * r.d, 1)),
                                       ToBf16(Random(size_t(r.n) * r.k * r.d, 2)));
}

}  // namespace
}  // namespace moelab::cuda::emulation_test
