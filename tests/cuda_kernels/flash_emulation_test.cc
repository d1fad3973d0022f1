// The fused attention kernels' own source (kernels/cuda/flash_attention_kernels.cuh) run on the
// CPU under tests/cuda_kernels/emulation/cuda_emulation.h against the double CPU reference, with
// the GPU test's tolerances (flash_reference.h). Runs on every machine: it checks the tiling,
// masking, online softmax, barriers and backward formulas where no GPU is lent; the hardware's
// wmma and timing only the GPU test (flash_attention_test.cc) can check.
// clang-format off
// The emulation first: it replaces the CUDA primitives the kernel header uses.
#include "tests/cuda_kernels/emulation/cuda_emulation.h"
#include "kernels/cuda/flash_attention_kernels.cuh"
// clang-format on

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "tests/cuda_kernels/flash_reference.h"

namespace moelab::cuda::flash {
namespace {

using testing::FlashCase;
using testing::FlashEmulationBuffers;
using testing::FlashReference;

// The launch sequence of FlashAttentionForward / FlashAttentionBackward, on the emulation.
template <typename T, int DQK, int DV>
void RunCase(const FlashCase& c) {
  SCOPED_TRACE(c.name);
  const FlashReference ref(c);
  const Params p = MakeParams(ref.a);
  FlashEmulationBuffers<T> b(ref);
  const size_t pairs = size_t(c.batch) * c.heads;
  const unsigned tiles = (c.seq + kTile - 1) / kTile;
  emu::Launch(dim3(pairs, tiles), kThreads, FwdSmem<DQK, DV>::kBytes, [&] {
    FlashForwardKernel<T, DQK, DV>(p, b.q, b.k, b.v, b.out.data(), b.lse.data(), b.pmax.data());
  });
  const long rows = long(pairs) * c.seq;
  emu::Launch(dim3((rows * 32 + 255) / 256), 256, 0,
              [&] { RowDotKernel<T>(p, c.v_dim, b.out.data(), b.dout.data(), b.d.data()); });
  emu::Launch(dim3(c.batch * c.kv_heads, tiles), kThreads, BwdSmem<DQK, DV>::kBytes, [&] {
    FlashBackwardKvKernel<T, DQK, DV>(p, b.q, b.k, b.v, b.lse.data(), b.d.data(), b.dout.data(),
                                      b.dk, b.dv);
  });
  emu::Launch(dim3(pairs, tiles), kThreads, BwdSmem<DQK, DV>::kBytes, [&] {
    FlashBackwardQKernel<T, DQK, DV>(p, b.q, b.k, b.v, b.lse.data(), b.d.data(), b.dout.data(),
                                     b.dq);
  });
  ref.Expect(b.OutAsFloat(), b.lse, b.pmax, b.dx);
}

// Small shapes (the emulation runs a thread per CUDA thread): every tile boundary case, GQA with
// fused strides, soft-cap, MLA's unequal dims, both input types.
TEST(CudaFlashEmulation, MhaAndMqaSoftCapAcrossTileBoundaries) {
  RunCase<bf16, 64, 64>({"mha 64, S=100", 1, 100, 2, 2, 64, 64, 0.0, false});
  RunCase<bf16, 64, 64>({"mqa softcap 3, S=77", 1, 77, 2, 1, 64, 64, 3.0, false});
}

TEST(CudaFlashEmulation, GqaFusedStridesFp32Inputs) {
  RunCase<float, 128, 128>({"gqa 128 fused fp32, S=70", 1, 70, 4, 2, 128, 128, 0.0, true});
}

TEST(CudaFlashEmulation, MlaUnequalDimsAndShortSequences) {
  RunCase<bf16, 48, 32>({"mla 48/32, S=65", 1, 65, 2, 2, 48, 32, 2.0, false});
  RunCase<float, 16, 16>({"16/16 softcap, S=17", 2, 17, 2, 2, 16, 16, 2.0, false});
  RunCase<bf16, 32, 32>({"32/32, S=1", 2, 1, 2, 1, 32, 32, 0.0, false});
}

}  // namespace
}  // namespace moelab::cuda::flash
