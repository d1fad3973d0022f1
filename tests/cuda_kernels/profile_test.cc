// CudaOpProfiler (core/cuda_profiler.h), the per-op-class GPU time of `moelab bench`.
#include <gtest/gtest.h>

#include <stdexcept>
#include <vector>

#include "core/cuda_profiler.h"
#include "kernels/cuda/gemm.h"
#include "tests/cuda_kernels/cuda_test_util.h"

namespace moelab::cuda {
namespace {

// The bench's per-op-class breakdown (core/cuda_profiler.h): a bracket inside another is its
// sub-class ("moe/experts"), and the outer keeps its inclusive total.
TEST(CudaOpProfilerTest, NestedBracketsAreSubClassesBesideTheOuterTotal) {
  MOELAB_REQUIRE_GPU();
  CudaOpProfiler p;
  const int n = 512;
  DeviceBuffer<float> a(size_t(n) * n), c(size_t(n) * n);
  a.Zero();
  auto gemm = [&] {
    Gemm(false, false, n, n, n, 1.0f, a.data(), n, a.data(), n, 0.0f, c.data(), n);
  };
  for (int i = 0; i < 2; ++i) {
    ProfileScope outer(&p, "moe");
    ProfilePhases phase(&p);
    phase.Next("route");
    gemm();
    phase.Next("experts");
    gemm();
    gemm();
  }
  {
    ProfileScope alone(&p, "gemm");
    gemm();
  }
  const auto t = p.Totals();
  ASSERT_EQ(t.size(), 4u);
  ASSERT_TRUE(t.count("moe") && t.count("moe/route") && t.count("moe/experts") && t.count("gemm"));
  // (No order between the phases' times: on the H200 the first product's cuBLAS set-up once made
  // one GEMM slower than two.)
  EXPECT_GT(t.at("moe/route"), 0.0);
  EXPECT_GT(t.at("moe/experts"), 0.0);
  EXPECT_GE(t.at("moe") * 1.001, t.at("moe/route") + t.at("moe/experts"));
  EXPECT_THROW(p.End(), std::logic_error);  // every bracket closed
  p.Reset();
  EXPECT_TRUE(p.Totals().empty());
}

TEST(CudaOpProfilerTest, NullProfilerPhasesDoNothing) {
  ProfilePhases phase(nullptr);
  phase.Next("route");
  phase.Next("experts");  // no device needed, nothing recorded
  SUCCEED();
}

}  // namespace
}  // namespace moelab::cuda
