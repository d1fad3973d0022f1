// The register layout of kernels/cuda/mma.cuh on the tensor cores (skips without a GPU): the
// same one-warp product as mma_emulation_test.cc, exact on these inputs.
#include <gtest/gtest.h>

#include "kernels/cuda/mma_check.h"
#include "tests/cuda_kernels/cuda_test_util.h"
#include "tests/cuda_kernels/mma_reference.h"

namespace moelab::cuda {
namespace {

TEST(CudaMma, TileProductMatchesTheMatrixProduct) {
  MOELAB_REQUIRE_GPU();
  for (uint32_t seed : {11u, 12u}) {
    const MmaCase m = MakeMmaCase(seed);
    std::vector<float> c(128, -1.0f);
    MmaTileProductOnDevice(m.a.data(), m.b.data(), c.data());
    ExpectMmaProduct(m, c);
  }
}

}  // namespace
}  // namespace moelab::cuda
