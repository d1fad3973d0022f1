// The register layouts the fused attention's mma kernels rely on, under the CPU emulation: one
// warp multiplies A by B through kernels/cuda/mma.cuh's documented fragments (mma.sync m16n8k16
// bf16), one loads a tile by cp.async and ldmatrix (flash_forward_mma.cuh). Their GPU twins
// (mma_test.cc) run the same bodies on the hardware against the same expectations.
// clang-format off
// The emulation first: it replaces the CUDA primitives the kernel headers use.
#include "tests/cuda_kernels/emulation/cuda_emulation.h"
#include "kernels/cuda/flash_forward_mma.cuh"
#include "kernels/cuda/mma.cuh"
// clang-format on

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "tests/cuda_kernels/mma_reference.h"

namespace moelab::cuda {
namespace {

TEST(MmaEmulation, TileProductMatchesTheMatrixProduct) {
  const MmaCase m = MakeMmaCase(11);
  std::vector<__nv_bfloat16> a(256), b(128);
  std::memcpy(a.data(), m.a.data(), 512);
  std::memcpy(b.data(), m.b.data(), 256);
  std::vector<float> c(128, -1.0f);
  emu::Launch(dim3(1), 32, 0, [&] { mma::TileProduct(a.data(), b.data(), c.data()); });
  ExpectMmaProduct(m, c);
}

TEST(MmaEmulation, PackedPairsKeepTheLowerIndexInTheLowHalf) {
  const uint32_t w = mma::PackBf16x2(1.0f, -2.0f);
  EXPECT_EQ(w & 0xffffu, 0x3f80u);  // bf16(1)
  EXPECT_EQ(w >> 16, 0xc000u);      // bf16(-2)
  EXPECT_EQ(mma::LowBf16(w), 1.0f);
  EXPECT_EQ(mma::HighBf16(w), -2.0f);
}

TEST(MmaEmulation, CpAsyncAndLdMatrixGiveThePtxLayout) {
  const LdMatrixCase c = MakeLdMatrixCase();
  std::vector<__nv_bfloat16> tile(256);
  std::memcpy(tile.data(), c.tile.data(), 512);
  std::vector<uint32_t> out(256, 0xdeadbeef);
  emu::Launch(dim3(1), 32, 32 * 16 * 2, [&] {
    flash::LdMatrixProbe(tile.data(), c.valid, reinterpret_cast<bf16*>(emu::ctx.smem), out.data());
  });
  ExpectLdMatrixRegisters(c, out);
}

// The emulation's dynamic shared memory ends where the launch says, as on the GPU (an access past
// it faults there): a write past either end aborts after the block, a read there sees NaN.
TEST(EmulatedSharedMemory, AccessPastTheLaunchSizeIsCaught) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  constexpr size_t kBytes = 1000;
  float seen = 0;
  emu::Launch(dim3(2), 32, kBytes, [&] {
    if (threadIdx.x == 0 && blockIdx.x == 1) std::memcpy(&seen, emu::ctx.smem + kBytes, 4);
  });
  EXPECT_TRUE(std::isnan(seen));
  EXPECT_DEATH(
      emu::Launch(dim3(2), 32, kBytes,
                  [&] {
                    if (threadIdx.x == 31 && blockIdx.x == 1) emu::ctx.smem[kBytes] = 0;
                  }),
      "block \\(1, 0\\) wrote shared memory outside its 1000 dynamic bytes, at offset 1000");
  EXPECT_DEATH(emu::Launch(dim3(1), 32, kBytes, [&] { emu::ctx.smem[-1] = 0; }), "at offset -1");
  emu::Launch(dim3(1), 32, kBytes, [&] { emu::ctx.smem[kBytes - 1] = 0; });  // the last byte: fine
}

}  // namespace
}  // namespace moelab::cuda
