#include "kernels/cuda/profile.h"

#include <gtest/gtest.h>

#include <vector>

#include "kernels/cuda/gemm.h"
#include "tests/cuda_kernels/cuda_test_util.h"

namespace moelab::cuda {
namespace {

TEST(CudaProfile, DisabledProfilerRecordsNothingAndNeedsNoDevice) {
  EventProfiler p;
  ASSERT_FALSE(p.enabled());
  p.Begin("region");
  p.End();
  EXPECT_TRUE(p.Collect().empty());
  {
    ProfileRegion r("scoped");  // the thread's profiler, disabled by default
  }
  EXPECT_TRUE(Profiler().Collect().empty());
}

TEST(CudaProfile, RegionsAggregateByNameLargestFirst) {
  MOELAB_REQUIRE_GPU();
  EventProfiler& p = Profiler();
  p.Reset();
  p.set_enabled(true);
  const int n = 512;
  DeviceBuffer<float> a(size_t(n) * n), c(size_t(n) * n);
  a.Zero();
  for (int i = 0; i < 3; ++i) {
    ProfileRegion outer("gemm x2");
    Gemm(false, false, n, n, n, 1.0f, a.data(), n, a.data(), n, 0.0f, c.data(), n);
    {
      ProfileRegion inner("gemm");
      Gemm(false, false, n, n, n, 1.0f, a.data(), n, a.data(), n, 0.0f, c.data(), n);
    }
  }
  const auto entries = p.Collect();
  p.set_enabled(false);
  ASSERT_EQ(entries.size(), 2u);
  EXPECT_EQ(entries[0].name, "gemm x2");  // encloses the inner region: the larger total
  EXPECT_EQ(entries[0].calls, 3);
  EXPECT_EQ(entries[1].name, "gemm");
  EXPECT_EQ(entries[1].calls, 3);
  EXPECT_GT(entries[1].ms, 0.0);
  EXPECT_GT(entries[0].ms, entries[1].ms);
}

}  // namespace
}  // namespace moelab::cuda
