// The fused residual + RMSNorm and the two-slice RoPE kernels' own source
// (kernels/cuda/norm_kernels.cuh, rope_kernels.cuh) run on the CPU under
// tests/cuda_kernels/emulation/cuda_emulation.h, with the launch shapes of kernels/cuda/
// elementwise.cu, against their CPU twins (kernels/cpu/norm.h, rope.h). Runs on every machine;
// the hardware itself (and nvcc's FMA contraction of the sums of squares) only the GPU twins in
// ops_test.cc can check.
// clang-format off
// The emulation first: it replaces the CUDA primitives the kernel headers use.
#include "tests/cuda_kernels/emulation/cuda_emulation.h"
#include "kernels/cuda/norm_kernels.cuh"
#include "kernels/cuda/rope_kernels.cuh"
// clang-format on

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "kernels/cpu/norm.h"
#include "kernels/cpu/rope.h"
#include "tests/cuda_kernels/emulation_test_util.h"

namespace moelab::cuda {
namespace {

using emulation_test::Random;
using emulation_test::SameBits;

void ExpectNearRel(const std::vector<float>& got, const std::vector<float>& want, double rel,
                   const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int bad = 0;
  for (size_t i = 0; i < got.size() && bad < 5; ++i) {
    const double tol = rel * std::max(1.0, std::fabs(static_cast<double>(want[i])));
    if (!(std::fabs(static_cast<double>(got[i]) - want[i]) <= tol)) {
      ADD_FAILURE() << what << "[" << i << "]: got " << got[i] << ", want " << want[i];
      ++bad;
    }
  }
}

void ExpectNearAbs(const std::vector<float>& got, const std::vector<float>& want, double tol,
                   const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int bad = 0;
  for (size_t i = 0; i < got.size() && bad < 5; ++i) {
    if (!(std::fabs(static_cast<double>(got[i]) - want[i]) <= tol)) {
      ADD_FAILURE() << what << "[" << i << "]: got " << got[i] << ", want " << want[i];
      ++bad;
    }
  }
}

// AddRmsNormForward's launch (one block of NormThreads(d) per row) against (1) the add then
// RmsNormForward's launch of the same kernels file, which it must equal bit for bit, and (2) the
// CPU twin. Tolerance vs the CPU: both sum d squares in float in different orders (the block's
// strided partials and tree vs the CPU's SIMD lanes), a relative difference of a few ε·log d on
// mean(x²), half of it on rstd and y; 1e-5 relative (≈ 80 ε) covers d ≤ 1024 with margin, and
// the sum itself is one float add on both sides: exact.
void CheckAddRmsNorm(int n, int d, bool alias) {
  SCOPED_TRACE(::testing::Message() << "n " << n << " d " << d << (alias ? " sum aliases a" : ""));
  const size_t nd = static_cast<size_t>(n) * d;
  const auto a = Random(nd, 1), b = Random(nd, 2), gain = Random(d, 3, 0.5f, 1.5f);
  const double eps = 1e-6;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const int threads = norm::NormThreads(d);

  std::vector<float> a_in = a, sum_own(nd, nan), y(nd, nan), rstd(n, nan);
  float* sum = alias ? a_in.data() : sum_own.data();
  emu::Launch(dim3(n), threads, 0, [&] {
    norm::AddRmsNormKernel<float>(a_in.data(), b.data(), sum, gain.data(), d, eps, y.data(),
                                  rstd.data());
  });
  const std::vector<float> got_sum(sum, sum + nd);

  // (1) The separate kernels: the add (one float add per element), then RmsNormForward.
  std::vector<float> sum_ref(nd), y_ref(nd, nan), rstd_ref(n, nan);
  for (size_t i = 0; i < nd; ++i) sum_ref[i] = a[i] + b[i];
  emu::Launch(dim3(n), threads, 0, [&] {
    norm::RmsNormForwardKernel<float>(sum_ref.data(), d, y_ref.data(), d, 1, d, gain.data(), eps,
                                      rstd_ref.data());
  });
  EXPECT_TRUE(SameBits(got_sum, sum_ref));
  EXPECT_TRUE(SameBits(y, y_ref));
  EXPECT_TRUE(SameBits(rstd, rstd_ref));

  // (2) The CPU twin.
  std::vector<float> sum_cpu(nd), y_cpu(nd), rstd_cpu(n);
  cpu::AddRmsNormForward(a.data(), b.data(), sum_cpu.data(), gain.data(), n, d, eps, y_cpu.data(),
                         rstd_cpu.data());
  EXPECT_TRUE(SameBits(got_sum, sum_cpu));
  ExpectNearRel(rstd, rstd_cpu, 1e-5, "rstd");
  ExpectNearRel(y, y_cpu, 1e-5, "y");
}

// One launch shape per NormThreads branch (32, 128, 256 threads), d not a multiple of the block
// (threads with one element fewer), and the in-place sum.
TEST(CudaFusedEmulation, AddRmsNormEqualsAddThenRmsNormAndMatchesCpu) {
  CheckAddRmsNorm(3, 40, false);
  CheckAddRmsNorm(3, 200, false);
  CheckAddRmsNorm(2, 770, false);
  CheckAddRmsNorm(2, 200, true);
}

// RopeApplyQk's kernel on a small grid (so its grid-stride loop runs several rounds) against the
// CPU twin. The kernel rounds each product (__fmul_rn: no FMA, as on the GPU); GCC builds the CPU
// twin with -ffp-contract=fast, so with FMA hardware a·c − b·s may skip one product's rounding:
// a difference of at most one ulp of the larger product (|x| ≤ 2, |cos|, |sin| ≤ 1: ≤ 2.4e-7)
// plus the result's rounding, hence 5e-7 absolute.
void CheckRopeQk(int n, int seq, int rot, int ldq, cpu::RopeSlice<float> q, int ldk,
                 cpu::RopeSlice<float> k, bool same_buffer) {
  std::vector<float> cs(static_cast<size_t>(seq) * rot / 2), sn(cs.size());
  cpu::RopeTables(seq, rot, 10000.0, cs.data(), sn.data());
  for (bool inverse : {false, true}) {
    SCOPED_TRACE(inverse ? "inverse" : "forward");
    const auto x0 = Random(static_cast<size_t>(n) * ldq, 4), y0 = Random(size_t(n) * ldk, 5);
    std::vector<float> xc = x0, yc = y0, xg = x0, yg = y0;
    cpu::RopeSlice<float> qc = q, kc = k;
    qc.x = xc.data();
    kc.x = same_buffer ? xc.data() : yc.data();
    cpu::RopeApplyQk(qc, kc, n, seq, rot, cs.data(), sn.data(), inverse);
    q.x = xg.data();
    k.x = same_buffer ? xg.data() : yg.data();
    emu::Launch(dim3(3), 64, 0, [&] {
      rope::RopeQkKernel<float>(q, k, n, seq, rot, cs.data(), sn.data(), inverse ? -1.0f : 1.0f);
    });
    ExpectNearAbs(xg, xc, 5e-7, "q (and k)");
    ExpectNearAbs(yg, yc, 5e-7, "k");
    EXPECT_FALSE(SameBits(xg, x0));
  }
}

// The model's layouts: GQA's q | k | v rows (4 q heads and 2 k heads of 16 in one buffer), MLA's
// q^R columns of [q^C | q^R] rows (3 heads, dn 8, dr 4) with the shared key of [c_kv | k^R].
TEST(CudaFusedEmulation, RopeQkOneLaunchMatchesCpu) {
  const int seq = 5, n = 2 * seq;
  CheckRopeQk(n, seq, 16, 128, {nullptr, 128, 4, 16, 0}, 128, {nullptr, 128, 2, 16, 64}, true);
  CheckRopeQk(n, seq, 4, 36, {nullptr, 36, 3, 4, 24}, 14, {nullptr, 14, 1, 4, 10}, false);
  // A single slice (RopeApply's launch: k without heads).
  CheckRopeQk(n, seq, 8, 20, {nullptr, 20, 2, 10, 1}, 1, {}, false);
}

// The bf16 heads of a bf16 q | k | v activation (train.kernels.attention_acts "bf16"): each pair
// widened, rotated with the fp32 kernel's arithmetic and rounded once, so the bf16 kernel gives the
// bits of the fp32 kernel run on the widened values, rounded to bf16 — forward and inverse, on
// GQA's q | k | v rows (the v columns untouched).
TEST(CudaFusedEmulation, RopeQkOnBf16HeadsIsTheFp32KernelRounded) {
  const int seq = 5, n = 2 * seq, rot = 16, ld = 128;
  std::vector<float> cs(size_t(seq) * rot / 2), sn(cs.size());
  cpu::RopeTables(seq, rot, 10000.0, cs.data(), sn.data());
  const std::vector<__nv_bfloat16> x0 = emulation_test::ToBf16(Random(size_t(n) * ld, 6));
  for (bool inverse : {false, true}) {
    SCOPED_TRACE(inverse ? "inverse" : "forward");
    std::vector<__nv_bfloat16> xb = x0;
    std::vector<float> xf(x0.size());
    for (size_t i = 0; i < x0.size(); ++i) xf[i] = __bfloat162float(x0[i]);
    const float sign = inverse ? -1.0f : 1.0f;
    emu::Launch(dim3(3), 64, 0, [&] {
      rope::RopeQkKernel<__nv_bfloat16>({xb.data(), ld, 4, 16, 0}, {xb.data(), ld, 2, 16, 64}, n,
                                        seq, rot, cs.data(), sn.data(), sign);
    });
    emu::Launch(dim3(3), 64, 0, [&] {
      rope::RopeQkKernel<float>({xf.data(), ld, 4, 16, 0}, {xf.data(), ld, 2, 16, 64}, n, seq, rot,
                                cs.data(), sn.data(), sign);
    });
    int changed = 0;
    for (size_t i = 0; i < xb.size(); ++i) {
      const __nv_bfloat16 want = __float2bfloat16(xf[i]);
      ASSERT_EQ(__bfloat16_as_ushort(xb[i]), __bfloat16_as_ushort(want)) << "element " << i;
      changed += __bfloat16_as_ushort(xb[i]) != __bfloat16_as_ushort(x0[i]);
      if (i % ld >= 96) {  // v columns
        ASSERT_EQ(__bfloat16_as_ushort(xb[i]), __bfloat16_as_ushort(x0[i])) << "v touched " << i;
      }
    }
    // q and k columns (96 of 128) at positions 1 … seq−1 rotate (position 0 is the identity).
    EXPECT_GT(changed, (n - n / seq) * 96 / 2);
  }
}

}  // namespace
}  // namespace moelab::cuda
