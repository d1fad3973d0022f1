// The register layouts of kernels/cuda/mma.cuh and flash_forward_mma.cuh on the GPU (skip without
// one): the same one-warp product (exact on these inputs) and cp.async + ldmatrix load as
// mma_emulation_test.cc.
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

TEST(CudaMma, CpAsyncAndLdMatrixGiveThePtxLayout) {
  MOELAB_REQUIRE_GPU();
  const LdMatrixCase c = MakeLdMatrixCase();
  std::vector<uint32_t> out(256, 0xdeadbeef);
  MmaLdMatrixOnDevice(c.tile.data(), c.valid, out.data());
  ExpectLdMatrixRegisters(c, out);
}

}  // namespace
}  // namespace moelab::cuda
