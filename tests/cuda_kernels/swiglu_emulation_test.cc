// The SwiGLU activation kernels' own source (kernels/cuda/swiglu_kernels.cuh) on the CPU under
// tests/cuda_kernels/emulation/cuda_emulation.h: the paired layout of the fused gate-and-up GEMM
// (h1 | h3 side by side in one row, dact in place of dh1) gives the same bits as the contiguous
// kernels that ran on a GPU, and both follow the SwiGLU derivative in double.
// clang-format off
// The emulation first: it replaces the CUDA primitives the kernel headers use.
#include "tests/cuda_kernels/emulation/cuda_emulation.h"
#include "kernels/cuda/swiglu_kernels.cuh"
// clang-format on

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "tests/cuda_kernels/emulation_test_util.h"

namespace moelab::cuda {
namespace {

using bf16 = __nv_bfloat16;

using emulation_test::SameBits;

std::vector<bf16> RandomBf16(size_t n, uint32_t seed) {
  return emulation_test::ToBf16(emulation_test::Random(n, seed, -4, 4));
}

double F(bf16 x) { return static_cast<double>(__bfloat162float(x)); }

// Grids and blocks smaller than the work: the contiguous kernels' grid-stride loop wraps, and the
// row kernels' block-stride loop over 7 rows and their 32-thread loop over 37 columns.
constexpr int kBlocks = 2, kThreads = 64, kRowThreads = 32;

TEST(SwigluEmulation, PairedRowsGiveTheContiguousKernelsBits) {
  const int rows = 7, H = 37;  // H odd: a row's halves start at any element
  const size_t nh = size_t(rows) * H;
  const std::vector<bf16> h1 = RandomBf16(nh, 1), h3 = RandomBf16(nh, 2), dact = RandomBf16(nh, 3);
  std::vector<bf16> h13(2 * nh);
  for (int r = 0; r < rows; ++r) {
    for (int j = 0; j < H; ++j) {
      h13[size_t(r) * 2 * H + j] = h1[size_t(r) * H + j];
      h13[size_t(r) * 2 * H + H + j] = h3[size_t(r) * H + j];
    }
  }
  // Contiguous (the kernels' existing launch: one row of count elements).
  std::vector<bf16> act(nh), dh1 = dact, dh3(nh);
  const long count = static_cast<long>(nh);
  emu::Launch(dim3(kBlocks), kThreads, 0,
              [&] { swiglu::ActKernel<bf16>(h1.data(), h3.data(), count, act.data()); });
  emu::Launch(dim3(kBlocks), kThreads, 0, [&] {  // dh1 aliases dact, as in the MoE experts
    swiglu::ActBackwardKernel<bf16>(h1.data(), h3.data(), dh1.data(), count, dh1.data(),
                                    dh3.data());
  });
  // Paired (SwigluActivationPaired / ...Backward's launches): dact enters in dh13's h1 columns.
  std::vector<bf16> pact(nh), dh13(2 * nh, __float2bfloat16(99.0f));
  for (int r = 0; r < rows; ++r) {
    for (int j = 0; j < H; ++j) dh13[size_t(r) * 2 * H + j] = dact[size_t(r) * H + j];
  }
  const swiglu::Rows fwd{rows, H, 2L * H, H}, bwd{rows, H, 2L * H, 2L * H};
  emu::Launch(dim3(kBlocks), kRowThreads, 0,
              [&] { swiglu::ActRowsKernel<bf16>(h13.data(), h13.data() + H, fwd, pact.data()); });
  emu::Launch(dim3(kBlocks), kRowThreads, 0, [&] {
    swiglu::ActBackwardRowsKernel<bf16>(h13.data(), h13.data() + H, dh13.data(), bwd, dh13.data(),
                                        dh13.data() + H);
  });
  EXPECT_TRUE(SameBits(pact, act));
  std::vector<bf16> pdh1(nh), pdh3(nh);
  for (int r = 0; r < rows; ++r) {
    for (int j = 0; j < H; ++j) {
      pdh1[size_t(r) * H + j] = dh13[size_t(r) * 2 * H + j];
      pdh3[size_t(r) * H + j] = dh13[size_t(r) * 2 * H + H + j];
    }
  }
  EXPECT_TRUE(SameBits(pdh1, dh1));
  EXPECT_TRUE(SameBits(pdh3, dh3));

  // Both against the definition in double: act = silu(a)·b, dh3 = g·silu(a),
  // dh1 = g·b·σ(a)(1 + a(1 − σ(a))); one bf16 rounding (2^-8 relative) plus float's own error.
  for (size_t i = 0; i < nh; ++i) {
    const double a = F(h1[i]), b = F(h3[i]), g = F(dact[i]);
    const double s = 1 / (1 + std::exp(-a));
    const double want_act = a * s * b, want_dh3 = g * a * s,
                 want_dh1 = g * b * s * (1 + a * (1 - s));
    EXPECT_NEAR(F(act[i]), want_act, 5e-3 * std::abs(want_act) + 1e-6) << i;
    EXPECT_NEAR(F(dh3[i]), want_dh3, 5e-3 * std::abs(want_dh3) + 1e-6) << i;
    EXPECT_NEAR(F(dh1[i]), want_dh1, 5e-3 * std::abs(want_dh1) + 1e-6) << i;
  }
}

TEST(SwigluEmulation, PairedKernelsTouchOnlyTheirColumns) {
  // act's row stride H: every element of rows·H written, nothing past it.
  const int rows = 3, H = 8;
  const std::vector<bf16> h13 = RandomBf16(size_t(rows) * 2 * H, 4);
  std::vector<bf16> act(size_t(rows) * H + 5, __float2bfloat16(NAN));
  const swiglu::Rows fwd{rows, H, 2L * H, H};
  emu::Launch(dim3(1), 32, 0,
              [&] { swiglu::ActRowsKernel<bf16>(h13.data(), h13.data() + H, fwd, act.data()); });
  for (size_t i = 0; i < act.size(); ++i)
    EXPECT_EQ(std::isnan(F(act[i])), i >= size_t(rows) * H) << i;
}

}  // namespace
}  // namespace moelab::cuda
