// The fused attention's register-fragment backward (kernels/cuda/flash_backward_mma.cuh) run on
// the CPU under tests/cuda_kernels/emulation/cuda_emulation.h, whose mma.sync exchanges the
// documented per-lane fragments: so the fragment indexing, the transposed tiles, masking, the
// chunk skips and the dS formula are checked here, the hardware's rounding and speed only by the
// GPU test (flash_attention_test.cc, which runs this kernel by default). Inputs are the CPU
// forward's out and LSE (in double, rounded as the kernel sees them), so this test depends on no
// forward kernel; results against the CPU backward in double with the wmma tests' tolerances.
// clang-format off
// The emulation first: it replaces the CUDA primitives the kernel headers use.
#include "tests/cuda_kernels/emulation/cuda_emulation.h"
#include "kernels/cuda/flash_backward_mma.cuh"
// clang-format on

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <tuple>
#include <type_traits>
#include <vector>

#include "tests/cuda_kernels/flash_reference.h"

namespace moelab::cuda::flash {
namespace {

using testing::FlashCase;
using testing::FlashEmulationBuffers;
using testing::FlashReference;

// FlashAttentionBackward's launch sequence on the emulation (D, then dK/dV, then dQ) on the CPU
// forward's out and LSE, with the mma kernels or (wmma = true) the wmma ones. Returns dx in the
// input layout; untouched entries stay NaN.
template <typename T, int DQK, int DV>
std::vector<float> Backward(const FlashCase& c, const FlashReference& ref, bool wmma = false) {
  const Params p = MakeParams(ref.a);
  FlashEmulationBuffers<T> b(ref);
  const float* lse = b.ref_lse.data();
  const long pairs = long(c.batch) * c.heads, rows = pairs * c.seq;
  const unsigned tiles = (c.seq + kTile - 1) / kTile;
  emu::Launch(dim3((rows * 32 + 255) / 256), 256, 0,
              [&] { RowDotKernel<T>(p, c.v_dim, b.ref_out.data(), b.dout.data(), b.d.data()); });
  if (wmma) {
    emu::Launch(dim3(c.batch * c.kv_heads, tiles), kThreads, BwdSmem<DQK, DV>::kBytes, [&] {
      FlashBackwardKvKernel<T, DQK, DV>(p, b.q, b.k, b.v, lse, b.d.data(), b.dout.data(), b.dk,
                                        b.dv);
    });
    emu::Launch(dim3(pairs, tiles), kThreads, BwdSmem<DQK, DV>::kBytes, [&] {
      FlashBackwardQKernel<T, DQK, DV>(p, b.q, b.k, b.v, lse, b.d.data(), b.dout.data(), b.dq);
    });
  } else {
    emu::Launch(dim3(c.batch * c.kv_heads, tiles), kThreads, BwdMmaKvSmem<DQK, DV>::kBytes, [&] {
      FlashBackwardKvMmaKernel<T, DQK, DV>(p, b.q, b.k, b.v, lse, b.d.data(), b.dout.data(), b.dk,
                                           b.dv);
    });
    const unsigned q_tiles = (c.seq + kDqQueryTile<DQK, DV> - 1) / kDqQueryTile<DQK, DV>;
    emu::Launch(dim3(pairs, q_tiles), kThreads, BwdMmaQSmem<DQK, DV>::kBytes, [&] {
      FlashBackwardQMmaKernel<T, DQK, DV>(p, b.q, b.k, b.v, lse, b.d.data(), b.dout.data(), b.dq);
    });
  }
  return b.dx;
}

// The mma backward against the CPU backward in double (flash_reference.h's bf16 tolerances).
template <typename T, int DQK, int DV>
void RunCase(const FlashCase& c) {
  SCOPED_TRACE(c.name);
  static_assert(MmaBackwardCovers<DQK, DV>());
  const FlashReference ref(c);
  ref.ExpectGrads(Backward<T, DQK, DV>(c, ref));
}

// Small shapes (a thread per CUDA thread): tile and 16-row chunk boundaries, the diagonal skips,
// GQA with fused strides and fp32 inputs, soft-cap, MLA's unequal dims, seq 1, one m-tile a warp
// (128/128 and up) and two (64/64 and down) in the dQ kernel.
TEST(FlashBackwardMmaEmulation, MhaAndMqaSoftCapAcrossTileBoundaries) {
  RunCase<bf16, 64, 64>({"mha 64, S=100", 1, 100, 2, 2, 64, 64, 0.0, false});
  RunCase<bf16, 64, 64>({"mqa softcap 3, S=77", 1, 77, 2, 1, 64, 64, 3.0, false});
}

TEST(FlashBackwardMmaEmulation, GqaFusedStridesFp32Inputs) {
  RunCase<float, 128, 128>({"gqa 128 fused fp32, S=70", 1, 70, 4, 2, 128, 128, 0.0, true});
}

TEST(FlashBackwardMmaEmulation, MlaUnequalDimsRaggedAndSingleTokenSequences) {
  RunCase<bf16, 48, 32>({"mla 48/32 softcap 2, S=65", 1, 65, 2, 2, 48, 32, 2.0, false});
  RunCase<float, 16, 16>({"16/16 softcap, S=17", 2, 17, 2, 2, 16, 16, 2.0, false});
  RunCase<bf16, 32, 32>({"32/32, S=1", 2, 1, 2, 1, 32, 32, 0.0, false});
  // Two of the dQ kernel's 128-query tiles (two m-tiles a warp at these dims), the second ragged.
  static_assert(kDqQueryTile<16, 16> == 128);
  RunCase<bf16, 16, 16>({"16/16 one head, S=200", 1, 200, 1, 1, 16, 16, 0.0, false});
}

// DeepSeek-style MLA dims: 192/128 re-reads its K/V (and Q/dO) fragments from shared memory
// instead of keeping them in registers; 96/64 with a sequence of exactly one full tile.
TEST(FlashBackwardMmaEmulation, LargeMlaShapesOneOfThemReadingItsRowsFromSharedMemory) {
  static_assert(!kKeepRowsInRegisters<192, 128> && kKeepRowsInRegisters<96, 64>);
  RunCase<bf16, 192, 128>({"mla 192/128, S=33", 1, 33, 2, 1, 192, 128, 0.0, false});
  RunCase<bf16, 96, 64>({"gqa 96/64 softcap 1.5, S=64", 1, 64, 2, 1, 96, 64, 1.5, false});
}

TEST(FlashBackwardMmaEmulation, TwoRunsAreBitwiseEqualAndMatchTheWmmaKernels) {
  const FlashCase c{"gqa 64 softcap 2, S=70", 1, 70, 2, 1, 64, 64, 2.0, true};
  const FlashReference ref(c);
  const std::vector<float> a = Backward<bf16, 64, 64>(c, ref), b = Backward<bf16, 64, 64>(c, ref);
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
  // The wmma kernels round the same bf16 operands and, under the emulation, sum the same
  // products in the same 16-term steps: the two agree to fp32 rounding (bit for bit with GCC
  // today), where a fragment or mask error moves entries by percents. On the GPU the tensor
  // cores' own summation order may differ; flash_attention_test.cc bounds both against the CPU.
  const std::vector<float> w = Backward<bf16, 64, 64>(c, ref, /*wmma=*/true);
  for (auto [off, width, what] :
       {std::tuple{ref.q_off, ref.qw, "dq"}, std::tuple{ref.k_off, ref.kw, "dk"},
        std::tuple{ref.v_off, ref.vw, "dv"}}) {
    const std::vector<float> got = ref.Slice(a, off, width), want = ref.Slice(w, off, width);
    float max_abs = 0;
    for (float x : want) max_abs = std::max(max_abs, std::abs(x));
    testing::ExpectNear(got, want, 1e-5 * max_abs, 1e-5, what);
  }
}

}  // namespace
}  // namespace moelab::cuda::flash
