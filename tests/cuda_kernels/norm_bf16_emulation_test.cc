// The RMSNorm kernels' bf16 output (kernels/cuda/norm_kernels.cuh; RmsNormForwardBf16 and
// AddRmsNormForwardBf16 in kernels/cuda/norm.h, what the CUDA backend's norms write in bf16 mode
// so that no cast runs before the GEMMs): the kernels' own source run on the CPU under
// tests/cuda_kernels/emulation/cuda_emulation.h with the launch shapes of elementwise.cu. The bf16
// copy must be the fp32 output rounded (round to nearest even: the bits the separate cast gave),
// the fp32 output and rstd unchanged by asking for it, the copy laid out as y (grouped, strided
// rows: nothing written between the vectors), and the whole within a bf16 rounding of the CPU
// norm followed by the cast. Runs on every machine.
// clang-format off
// The emulation first: it replaces the CUDA primitives the kernel headers use.
#include "tests/cuda_kernels/emulation/cuda_emulation.h"
#include "kernels/cuda/norm_kernels.cuh"
// clang-format on

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/cpu/norm.h"
#include "tests/cuda_kernels/emulation_test_util.h"

namespace moelab::cuda::emulation_test {
namespace {

uint16_t Bits(bf16 v) {
  uint16_t b;
  std::memcpy(&b, &v, sizeof(b));
  return b;
}

// A bf16 value no kernel writes: what must survive where the copy has no element.
bf16 Sentinel() {
  __nv_bfloat16_raw raw;
  raw.x = 0x7fa5;  // a NaN with a payload
  return bf16(raw);
}

// got is want's fp32 values rounded to bf16, where the CPU norm may differ from the kernel's by
// the order of its sums (a few float ε relative): at most one bf16 step apart (2^-8 relative to
// the larger magnitude, the bf16 spacing being at most 2^-7 of it), and most of them equal.
void ExpectWithinOneBf16Step(const std::vector<bf16>& got, const std::vector<float>& cpu_y) {
  ASSERT_EQ(got.size(), cpu_y.size());
  const std::vector<bf16> want = ToBf16(cpu_y);
  size_t equal = 0;
  int bad = 0;
  for (size_t i = 0; i < got.size() && bad < 5; ++i) {
    const double g = __bfloat162float(got[i]), w = __bfloat162float(want[i]);
    equal += Bits(got[i]) == Bits(want[i]);
    const double step = std::ldexp(std::max(std::fabs(g), std::fabs(w)), -7);
    if (!(std::fabs(g - w) <= step)) {
      ADD_FAILURE() << "yb[" << i << "]: " << g << ", the CPU norm cast " << w;
      ++bad;
    }
  }
  EXPECT_GT(equal, got.size() * 9 / 10) << "the kernel's rounding is not the cast's";
}

// RmsNormForwardKernel over `groups` vectors of d per row, rows ldy apart (ldy ≥ groups·d: the
// gap columns belong to no vector).
void CheckRmsNorm(int n, int groups, int d, int ld) {
  SCOPED_TRACE(::testing::Message()
               << "n " << n << " groups " << groups << " d " << d << " ld " << ld);
  const size_t total = static_cast<size_t>(n) * ld;
  const auto x = Random(total, 11), gain = Random(d, 12, 0.5f, 1.5f);
  const double eps = 1e-6;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const int threads = norm::NormThreads(d);
  const int vectors = n * groups;

  std::vector<float> y(total, nan), rstd(vectors, nan);
  std::vector<bf16> yb(total, Sentinel());
  emu::Launch(dim3(vectors), threads, 0, [&] {
    norm::RmsNormForwardKernel<float>(x.data(), ld, y.data(), ld, groups, d, gain.data(), eps,
                                      rstd.data(), yb.data());
  });
  // Without the copy: the same fp32 output and rstd, bit for bit.
  std::vector<float> y_plain(total, nan), rstd_plain(vectors, nan);
  emu::Launch(dim3(vectors), threads, 0, [&] {
    norm::RmsNormForwardKernel<float>(x.data(), ld, y_plain.data(), ld, groups, d, gain.data(), eps,
                                      rstd_plain.data());
  });
  EXPECT_TRUE(SameBits(y, y_plain));
  EXPECT_TRUE(SameBits(rstd, rstd_plain));
  // The copy is the cast of y where a vector has an element, untouched in the gaps.
  int bad = 0;
  for (int i = 0; i < n; ++i) {
    for (int c = 0; c < ld && bad < 5; ++c) {
      const size_t at = static_cast<size_t>(i) * ld + c;
      const uint16_t want = c < groups * d ? Bits(__float2bfloat16(y[at])) : Bits(Sentinel());
      if (Bits(yb[at]) != want) {
        ADD_FAILURE() << "row " << i << " column " << c << ": bits " << Bits(yb[at]) << ", want "
                      << want;
        ++bad;
      }
    }
  }
  // Against the CPU norm (one vector a row) followed by the cast.
  if (groups == 1 && ld == d) {
    std::vector<float> y_cpu(total), rstd_cpu(n);
    cpu::RmsNormForward(x.data(), gain.data(), n, d, eps, y_cpu.data(), rstd_cpu.data());
    ExpectWithinOneBf16Step(yb, y_cpu);
  }
}

// One launch shape per NormThreads branch (32, 128, 256 threads), d not a multiple of the block.
TEST(CudaNormBf16Emulation, RmsNormCopyIsTheCastOfItsOutput) {
  CheckRmsNorm(3, 1, 40, 40);
  CheckRmsNorm(3, 1, 200, 200);
  CheckRmsNorm(2, 1, 1030, 1030);
}

// Strided, grouped vectors (QK-norm's layout): the copy follows y's indexing, the gaps stay.
TEST(CudaNormBf16Emulation, GroupedStridedCopyFollowsTheOutputsLayout) {
  CheckRmsNorm(3, 2, 40, 96);
  CheckRmsNorm(2, 3, 130, 400);
}

// AddRmsNormKernel with the copy: sum, y and rstd those of the kernel without it, the copy their
// cast, and within a bf16 step of the CPU add + norm + cast; sum may alias a.
void CheckAddRmsNorm(int n, int d, bool alias) {
  SCOPED_TRACE(::testing::Message() << "n " << n << " d " << d << (alias ? " sum aliases a" : ""));
  const size_t nd = static_cast<size_t>(n) * d;
  const auto a = Random(nd, 21), b = Random(nd, 22), gain = Random(d, 23, 0.5f, 1.5f);
  const double eps = 1e-6;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const int threads = norm::NormThreads(d);
  const auto run = [&](bf16* yb, std::vector<float>* sum_out, std::vector<float>* y,
                       std::vector<float>* rstd) {
    std::vector<float> a_in = a, sum_own(nd, nan);
    float* sum = alias ? a_in.data() : sum_own.data();
    y->assign(nd, nan);
    rstd->assign(n, nan);
    emu::Launch(dim3(n), threads, 0, [&] {
      norm::AddRmsNormKernel<float>(a_in.data(), b.data(), sum, gain.data(), d, eps, y->data(),
                                    rstd->data(), yb);
    });
    sum_out->assign(sum, sum + nd);
  };
  std::vector<bf16> yb(nd, Sentinel());
  std::vector<float> sum, y, rstd, sum_plain, y_plain, rstd_plain;
  run(yb.data(), &sum, &y, &rstd);
  run(nullptr, &sum_plain, &y_plain, &rstd_plain);
  EXPECT_TRUE(SameBits(sum, sum_plain));
  EXPECT_TRUE(SameBits(y, y_plain));
  EXPECT_TRUE(SameBits(rstd, rstd_plain));
  EXPECT_TRUE(SameBits(yb, ToBf16(y))) << "the copy is not the cast of y";
  std::vector<float> sum_cpu(nd), y_cpu(nd), rstd_cpu(n);
  cpu::AddRmsNormForward(a.data(), b.data(), sum_cpu.data(), gain.data(), n, d, eps, y_cpu.data(),
                         rstd_cpu.data());
  ExpectWithinOneBf16Step(yb, y_cpu);
}

TEST(CudaNormBf16Emulation, AddRmsNormCopyIsTheCastOfItsOutput) {
  CheckAddRmsNorm(3, 40, false);
  CheckAddRmsNorm(3, 200, false);
  CheckAddRmsNorm(2, 770, false);
  CheckAddRmsNorm(2, 200, true);
}

}  // namespace
}  // namespace moelab::cuda::emulation_test
