// cuBLAS GEMM wrappers against OpenBLAS (kernels/cpu/gemm.h).
#include "kernels/cpu/gemm.h"

#include <gtest/gtest.h>

#include <vector>

#include "kernels/cuda/gemm.h"
#include "tests/cuda_kernels/cuda_test_util.h"

namespace moelab::cuda::testing {
namespace {

// fp32: true fp32 on both sides (no TF32), so only summation order differs.
constexpr double kGemmAtol = 1e-5, kGemmRtol = 1e-4;
// bf16 inputs (8-bit mantissa) against the fp32 product of the unrounded inputs, k = 64.
constexpr double kBf16Atol = 5e-2, kBf16Rtol = 2e-2;

TEST(CudaGemm, AllTransposesMatchCpu) {
  MOELAB_REQUIRE_GPU();
  const int m = 37, n = 29, k = 53;
  for (int ta = 0; ta < 2; ++ta) {
    for (int tb = 0; tb < 2; ++tb) {
      const int lda = ta ? m : k, ldb = tb ? k : n;
      const auto a = Random(size_t(m) * k, 1), b = Random(size_t(k) * n, 2);
      auto c = Random(size_t(m) * n, 3);
      auto da = ToDevice(a), db = ToDevice(b), dc = ToDevice(c);
      cpu::Gemm(ta, tb, m, n, k, 0.5f, a.data(), lda, b.data(), ldb, 0.25f, c.data(), n);
      Gemm(ta, tb, m, n, k, 0.5f, da.data(), lda, db.data(), ldb, 0.25f, dc.data(), n);
      ExpectNear(dc.Download(), c, kGemmAtol, kGemmRtol,
                 "gemm ta=" + std::to_string(ta) + " tb=" + std::to_string(tb));
    }
  }
}

TEST(CudaGemm, StridedBatchedMatchesLoop) {
  MOELAB_REQUIRE_GPU();
  const int m = 16, n = 24, k = 8, batch = 5;
  const auto a = Random(size_t(batch) * m * k, 4), b = Random(size_t(k) * n, 5);
  std::vector<float> c(size_t(batch) * m * n);
  for (int i = 0; i < batch; ++i) {
    cpu::Gemm(false, false, m, n, k, 1.0f, a.data() + i * m * k, k, b.data(), n, 0.0f,
              c.data() + i * m * n, n);
  }
  auto da = ToDevice(a), db = ToDevice(b);
  DeviceBuffer<float> dc(c.size());
  // stride_b = 0 broadcasts B.
  GemmStridedBatched(false, false, m, n, k, 1.0f, da.data(), k, m * k, db.data(), n, 0, 0.0f,
                     dc.data(), n, m * n, batch);
  ExpectNear(dc.Download(), c, kGemmAtol, kGemmRtol, "strided batched");
}

TEST(CudaGemm, LinearForwardBackwardFp32AndBf16) {
  MOELAB_REQUIRE_GPU();
  const int n = 19, in = 64, out = 48;
  const auto x = Random(size_t(n) * in, 6), w = Random(size_t(out) * in, 7),
             dy = Random(size_t(n) * out, 8);
  std::vector<float> y(size_t(n) * out), dx(size_t(n) * in), dw(size_t(out) * in);
  cpu::LinearForward(x.data(), w.data(), n, in, out, y.data());
  cpu::LinearBackward(x.data(), w.data(), dy.data(), n, in, out, dx.data(), dw.data());
  auto dxs = ToDevice(x), dws = ToDevice(w), ddy = ToDevice(dy);
  DeviceBuffer<float> gy(y.size()), gdx(dx.size()), gdw(dw.size());
  LinearForward(dxs.data(), dws.data(), n, in, out, gy.data());
  LinearBackward(dxs.data(), dws.data(), ddy.data(), n, in, out, gdx.data(), gdw.data());
  ExpectNear(gy.Download(), y, kGemmAtol, kGemmRtol, "linear y");
  ExpectNear(gdx.Download(), dx, kGemmAtol, kGemmRtol, "linear dx");
  ExpectNear(gdw.Download(), dw, kGemmAtol, kGemmRtol, "linear dw");

  auto bx = ToDevice(ToBf16(x)), bw = ToDevice(ToBf16(w)), bdy = ToDevice(ToBf16(dy));
  LinearForward(bx.data(), bw.data(), n, in, out, gy.data());
  LinearBackward(bx.data(), bw.data(), bdy.data(), n, in, out, gdx.data(), gdw.data());
  ExpectNear(gy.Download(), y, kBf16Atol, kBf16Rtol, "bf16 linear y");
  ExpectNear(gdx.Download(), dx, kBf16Atol, kBf16Rtol, "bf16 linear dx");
  ExpectNear(gdw.Download(), dw, kBf16Atol, kBf16Rtol, "bf16 linear dw");
}

TEST(CudaGemm, GroupedMatchesPerGroupCpu) {
  MOELAB_REQUIRE_GPU();
  // Three groups of different row counts (one empty) against a shared-shape weight per group.
  const int k = 32, n = 16;
  const std::vector<int> rows = {5, 0, 11};
  const int total = 16;
  const auto a = Random(size_t(total) * k, 9), b = Random(size_t(rows.size()) * n * k, 10);
  std::vector<float> c(size_t(total) * n, 0.0f);
  auto da = ToDevice(a), db = ToDevice(b);
  DeviceBuffer<float> dc(c.size());
  dc.Zero();
  std::vector<GemmGroup<float, float>> groups;
  int r0 = 0;
  for (size_t g = 0; g < rows.size(); ++g) {
    cpu::Gemm(false, true, rows[g], n, k, 1.0f, a.data() + r0 * k, k, b.data() + g * n * k, k, 0.0f,
              c.data() + r0 * n, n);
    groups.push_back(
        {rows[g], n, k, da.data() + r0 * k, k, db.data() + g * n * k, k, dc.data() + r0 * n, n});
    r0 += rows[g];
  }
  GemmGrouped(false, true, 1.0f, 0.0f, groups);
  ExpectNear(dc.Download(), c, kGemmAtol, kGemmRtol, "grouped");

  // bf16 inputs: bf16 output (the grouped call) and fp32 output (the per-group loop).
  auto ba = ToDevice(ToBf16(a)), bb = ToDevice(ToBf16(b));
  DeviceBuffer<bf16> bc(c.size());
  DeviceBuffer<float> fc(c.size()), bc_float(c.size());
  std::vector<GemmGroup<bf16, bf16>> g16;
  std::vector<GemmGroup<bf16, float>> g32;
  r0 = 0;
  for (size_t g = 0; g < rows.size(); ++g) {
    g16.push_back(
        {rows[g], n, k, ba.data() + r0 * k, k, bb.data() + g * n * k, k, bc.data() + r0 * n, n});
    g32.push_back(
        {rows[g], n, k, ba.data() + r0 * k, k, bb.data() + g * n * k, k, fc.data() + r0 * n, n});
    r0 += rows[g];
  }
  GemmGrouped(false, true, 1.0f, 0.0f, g16);
  GemmGrouped(false, true, 1.0f, 0.0f, g32);
  CastToFloat(bc.data(), bc_float.data(), c.size());
  ExpectNear(bc_float.Download(), c, kBf16Atol, kBf16Rtol, "grouped bf16 -> bf16");
  ExpectNear(fc.Download(), c, kBf16Atol, kBf16Rtol, "grouped bf16 -> fp32");
}

TEST(CudaGemm, Bf16RateProbeRunsOnASmallProduct) {
  MOELAB_REQUIRE_GPU();
  const GemmRate r = ProbeBf16GemmRate(1024, 3, 1);
  EXPECT_GT(r.flops_per_s, 1e11);  // any GPU of this decade does > 100 GFLOP/s in bf16
  EXPECT_FALSE(r.device_name.empty());
}

TEST(CudaGemm, Bf16RateProbeThrowsWithoutDevice) {
  std::string reason;
  if (CudaAvailable(&reason)) GTEST_SKIP() << "a GPU is present: nothing to check";
  EXPECT_THROW(ProbeBf16GemmRate(64, 1, 0), std::runtime_error);
}

}  // namespace
}  // namespace moelab::cuda::testing
