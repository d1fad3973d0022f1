// cuDNN's MoE grouped matmul (kernels/cuda/cudnn_grouped_matmul.h). Its descriptors are checked
// here without a GPU (cuDNN finalizes an operation without a device and refuses wrong shapes); on a
// GPU every product is compared with cuBLAS's grouped GEMM on the same bf16 operands, experts
// without rows included (in the middle and last).
#include "kernels/cuda/cudnn_grouped_matmul.h"

#include <gtest/gtest.h>

#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "kernels/cuda/gemm.h"
#include "tests/cuda_kernels/cuda_test_util.h"

namespace moelab::cuda {
namespace {

using testing::ExpectNear;
using testing::Random;
using testing::ToBf16;
using testing::ToDevice;

#define MOELAB_REQUIRE_CUDNN_BUILD()                                                    \
  do {                                                                                  \
    if (CudnnVersion() == 0) GTEST_SKIP() << "cuDNN test skipped: built without cuDNN"; \
  } while (0)

// The version gate: 9.18 is the first cuDNN whose support matrix lists the operation (9.15 to 9.17
// have its enums but the frontend's own tests skip them), refused naming both versions.
TEST(CudnnGroupedMatmul, NeedsCudnn918) {
  for (size_t old : {91500u, 91700u}) {
    std::string why;
    EXPECT_FALSE(CudnnVersionHasGroupedMatmul(old, &why)) << old;
    EXPECT_NE(why.find(std::to_string(old)), std::string::npos) << why;
    EXPECT_NE(why.find("9.18 or later"), std::string::npos) << why;
  }
  for (size_t ok : {91800u, 91900u, 92200u}) EXPECT_TRUE(CudnnVersionHasGroupedMatmul(ok)) << ok;
}

// The shapes the experts use at gpu-moe's size (64 experts, 32 × 1024 tokens × top-8 rows,
// d 1024, hidden 512) in both weight layouts: cuDNN accepts the operation.
TEST(CudnnGroupedMatmul, DescribesTheExpertProductsWithoutAGpu) {
  MOELAB_REQUIRE_CUDNN_BUILD();
  const int64_t rows = 32 * 1024 * 8;
  for (bool out_by_in : {true, false}) {
    for (auto [k, n] : {std::pair{1024, 512}, std::pair{512, 1024}}) {
      SCOPED_TRACE(std::to_string(k) + " -> " + std::to_string(n) + (out_by_in ? " W^T" : " W"));
      EXPECT_NO_THROW(CudnnGroupedMatmul({64, rows, k, n, out_by_in}));
    }
  }
}

// A shape the descriptors cannot promise (an empty inner dimension, rows off 16-byte boundaries)
// is refused when it is described, naming why and the shape.
TEST(CudnnGroupedMatmul, RefusesShapesItCannotDescribe) {
  MOELAB_REQUIRE_CUDNN_BUILD();
  const std::vector<std::pair<GroupedMatmulShape, std::string>> bad = {
      {{8, 64, 0, 16, true}, "positive"},
      {{0, 64, 16, 16, true}, "positive"},
      {{8, 64, 12, 16, true}, "multiples of 8"},
      {{8, 64, 16, 20, false}, "multiples of 8"}};
  for (const auto& [shape, why] : bad) {
    try {
      CudnnGroupedMatmul mm(shape);
      ADD_FAILURE() << "no refusal of k " << shape.k << " n " << shape.n;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
    }
  }
}

TEST(CudnnGroupedMatmul, MatchesCublasGroupedGemmInBothWeightLayouts) {
  MOELAB_REQUIRE_GPU();
  std::string why;
  if (!CudnnGroupedMatmulAvailable(&why)) GTEST_SKIP() << "cuDNN test skipped: " << why;
  const std::vector<int32_t> first = {0, 37, 37, 101, 106, 196};  // experts 1 and 5 empty
  const int E = 6, k = 64, n = 48;
  const int64_t rows = 196;
  auto tok = ToDevice(ToBf16(Random(size_t(rows) * k, 1)));
  auto w = ToDevice(ToBf16(Random(size_t(E) * k * n, 2, -0.3f, 0.3f)));
  auto first_row = ToDevice(first);
  for (bool out_by_in : {true, false}) {
    SCOPED_TRACE(out_by_in ? "weights [E, n, k]" : "weights [E, k, n]");
    DeviceBuffer<bf16> got(size_t(rows) * n), want(size_t(rows) * n);
    std::vector<GemmGroup<bf16, bf16>> groups;
    for (int e = 0; e < E; ++e) {
      const int64_t r0 = first[e], r1 = e + 1 < E ? first[e + 1] : rows;
      if (r1 == r0) continue;
      const bf16* we = w.data() + size_t(e) * k * n;
      groups.push_back({int(r1 - r0), n, k, tok.data() + r0 * k, k, we, out_by_in ? k : n,
                        want.data() + r0 * n, n});
    }
    GemmGrouped(false, out_by_in, 1.0f, 0.0f, groups);
    CudnnGroupedMatmul mm({E, rows, k, n, out_by_in});
    mm.Run(tok.data(), w.data(), first_row.data(), got.data());
    DeviceBuffer<float> fgot(got.size()), fwant(want.size());
    CastToFloat(got.data(), fgot.data(), got.size());
    CastToFloat(want.data(), fwant.data(), want.size());
    // Both accumulate in fp32 and round once to bf16: one bf16 step apart at most.
    ExpectNear(fgot.Download(), fwant.Download(), 1e-3, 8e-3, "cuDNN against cuBLAS");
  }
}

}  // namespace
}  // namespace moelab::cuda
