// GPU twins of the bf16-output norms (kernels/cuda/norm.h: RmsNormForwardBf16,
// AddRmsNormForwardBf16, what the CUDA backend's norms run in bf16 mode): on the device, y and
// rstd are those of the fp32 launchers bit for bit and the bf16 copy is CastToBf16(y) bit for bit,
// which is what lets the backend hand the copy to the GEMMs instead of casting. Skipped without a
// GPU (the indexing and rounding are checked on the CPU by norm_bf16_emulation_test.cc).
#include <gtest/gtest.h>

#include <vector>

#include "kernels/cuda/device.h"
#include "kernels/cuda/norm.h"
#include "tests/cuda_kernels/cuda_test_util.h"

namespace moelab::cuda {
namespace {

using emulation_test::SameBits;
using testing::Random;
using testing::ToDevice;

TEST(CudaRmsNormBf16, CopyIsTheCastOfTheFp32Output) {
  MOELAB_REQUIRE_GPU();
  for (const int d : {40, 200, 1024}) {
    SCOPED_TRACE(d);
    const int n = 37;
    const size_t nd = static_cast<size_t>(n) * d;
    const double eps = 1e-6;
    auto x = ToDevice(Random(nd, 1, -2, 2)), gain = ToDevice(Random(d, 2, 0.5f, 1.5f));
    DeviceBuffer<float> y(nd), rstd(n), y_ref(nd), rstd_ref(n);
    DeviceBuffer<bf16> yb(nd), cast(nd);
    RmsNormForwardBf16(x.data(), gain.data(), n, d, eps, y.data(), yb.data(), rstd.data());
    RmsNormForward(x.data(), gain.data(), n, d, eps, y_ref.data(), rstd_ref.data());
    CastToBf16(y_ref.data(), cast.data(), nd);
    EXPECT_EQ(y.Download(), y_ref.Download());
    EXPECT_EQ(rstd.Download(), rstd_ref.Download());
    EXPECT_TRUE(SameBits(yb.Download(), cast.Download()));
  }
}

TEST(CudaRmsNormBf16, AddCopyIsTheCastOfTheFp32Output) {
  MOELAB_REQUIRE_GPU();
  for (const int d : {40, 200, 1024}) {
    SCOPED_TRACE(d);
    const int n = 29;
    const size_t nd = static_cast<size_t>(n) * d;
    const double eps = 1e-6;
    const std::vector<float> a = Random(nd, 3, -2, 2), b = Random(nd, 4, -2, 2);
    auto ga = ToDevice(a), gb = ToDevice(b), gain = ToDevice(Random(d, 5, 0.5f, 1.5f));
    DeviceBuffer<float> sum(nd), y(nd), rstd(n), sum_ref(nd), y_ref(nd), rstd_ref(n);
    DeviceBuffer<bf16> yb(nd), cast(nd);
    AddRmsNormForwardBf16(ga.data(), gb.data(), sum.data(), gain.data(), n, d, eps, y.data(),
                          yb.data(), rstd.data());
    AddRmsNormForward(ga.data(), gb.data(), sum_ref.data(), gain.data(), n, d, eps, y_ref.data(),
                      rstd_ref.data());
    CastToBf16(y_ref.data(), cast.data(), nd);
    EXPECT_EQ(sum.Download(), sum_ref.Download());
    EXPECT_EQ(y.Download(), y_ref.Download());
    EXPECT_EQ(rstd.Download(), rstd_ref.Download());
    EXPECT_TRUE(SameBits(yb.Download(), cast.Download()));
  }
}

}  // namespace
}  // namespace moelab::cuda
