// The tuned mma attention kernels (train.kernels.attention_kernel "mma": kTuned in
// kernels/cuda/flash_forward_mma.cuh and flash_backward_mma.cuh) run on the CPU under
// tests/cuda_kernels/emulation/cuda_emulation.h, whose ldmatrix and mma.sync form each lane's
// registers from the documented layouts and whose cp.async lands a copy only at its wait (shared
// memory starts as NaN), so a read before the right wait or barrier shows up as NaN:
//   - the forward's 128-key tiles (two 64-key register passes, the second partly or wholly past
//     the end or above the diagonal) against the CPU attention in double, on every kind of shape;
//   - the scale folded into exp2's multiplier: S_max bit for bit the first kernel's ("mma64"),
//     LSE and out within rounding of it, an exactly known case exact;
//   - the backward's cp.async pipeline (query tiles across the heads of a GQA group, key tiles)
//     and its ldmatrix.trans B fragments: bit for bit the first kernels' results (the same bf16
//     operands, the same products in the same order), and against the CPU in double.
// The GPU twins: flash_attention_test.cc (Mma/ and Mma64/ FlashShapes, FlashFullShape).
// clang-format off
// The emulation first: it replaces the CUDA primitives the kernel headers use.
#include "tests/cuda_kernels/emulation/cuda_emulation.h"
#include "kernels/cuda/flash_backward_mma.cuh"
#include "kernels/cuda/flash_forward_mma.cuh"
// clang-format on

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "tests/cuda_kernels/flash_reference.h"

namespace moelab::cuda::flash {
namespace {

using testing::ExpectNear;
using testing::FlashCase;
using testing::FlashEmulationBuffers;
using testing::FlashReference;
using testing::UniformFlashCase;

struct Forward {
  std::vector<float> out, lse, pmax;
};

// FlashAttentionForward's mma launch on the emulation (kTuned: "mma", else "mma64"), outputs
// poisoned with NaN.
template <typename T, int DQK, int DV, bool kTuned>
Forward RunForward(const FlashReference& ref) {
  const AttentionDims& a = ref.a;
  FlashEmulationBuffers<T> b(ref);
  const size_t pairs = size_t(a.batch) * a.heads;
  constexpr int tile = kTile * MmaRowBlocks(DQK, DV);
  emu::Launch(dim3(pairs, (a.seq + tile - 1) / tile), kThreads,
              FwdMmaSmemOf<DQK, DV, kTuned>::kBytes, [&] {
                FlashForwardMmaKernel<T, DQK, DV, false, kTuned>(
                    MakeParams(a), b.q, b.k, b.v, b.out.data(), b.lse.data(), b.pmax.data());
              });
  return {b.OutAsFloat(), b.lse, b.pmax};
}

// FlashAttentionBackward's sequence (D, dK/dV, dQ) with the mma kernels (kTuned: "mma", else
// "mma64") on the CPU forward's out and LSE; dx in the input layout, untouched entries NaN.
template <typename T, int DQK, int DV, bool kTuned>
std::vector<float> RunBackward(const FlashCase& c, const FlashReference& ref) {
  const Params p = MakeParams(ref.a);
  FlashEmulationBuffers<T> b(ref);
  const float* lse = b.ref_lse.data();
  const long pairs = long(c.batch) * c.heads, rows = pairs * c.seq;
  emu::Launch(dim3((rows * 32 + 255) / 256), 256, 0,
              [&] { RowDotKernel<T>(p, c.v_dim, b.ref_out.data(), b.dout.data(), b.d.data()); });
  emu::Launch(dim3(c.batch * c.kv_heads, (c.seq + kTile - 1) / kTile), kThreads,
              BwdMmaKvSmemBytes<DQK, DV, kTuned>(), [&] {
                FlashBackwardKvMmaKernel<T, DQK, DV, false, kTuned>(
                    p, b.q, b.k, b.v, lse, b.d.data(), b.dout.data(), b.dk, b.dv);
              });
  constexpr int kRows = kDqQueryTile<DQK, DV>;
  emu::Launch(dim3(pairs, (c.seq + kRows - 1) / kRows), kThreads,
              BwdMmaQSmem<DQK, DV, kTuned>::kBytes, [&] {
                FlashBackwardQMmaKernel<T, DQK, DV, false, kTuned>(p, b.q, b.k, b.v, lse,
                                                                   b.d.data(), b.dout.data(), b.dq);
              });
  return b.dx;
}

void ExpectSameBits(const std::vector<float>& got, const std::vector<float>& want,
                    const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  size_t differ = 0, first = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::memcmp(&got[i], &want[i], sizeof(float)) != 0 && differ++ == 0) first = i;
  }
  EXPECT_EQ(differ, 0u) << what << ": " << differ << " of " << got.size()
                        << " entries differ, the first at " << first;
}

// The tuned forward against the CPU attention in double (flash_reference.h's tolerances).
template <typename T, int DQK, int DV>
void ExpectForwardMatchesReference(const FlashCase& c) {
  SCOPED_TRACE(c.name);
  const FlashReference ref(c);
  const Forward f = RunForward<T, DQK, DV, true>(ref);
  ref.ExpectForward(f.out, f.lse, f.pmax);
}

// The tuned backward: bit for bit the first kernels', and within the bf16 tolerances of the CPU
// backward in double.
template <typename T, int DQK, int DV>
void ExpectBackwardAsTheFirst(const FlashCase& c) {
  SCOPED_TRACE(c.name);
  const FlashReference ref(c);
  const std::vector<float> tuned = RunBackward<T, DQK, DV, true>(c, ref);
  ExpectSameBits(tuned, RunBackward<T, DQK, DV, false>(c, ref), "dq | dk | dv, tuned vs first");
  ref.ExpectGrads(tuned);
}

static_assert(MmaKeyPasses(true, 64, 64) == 2 && MmaKeyPasses(true, 16, 16) == 2 &&
              MmaKeyPasses(true, 48, 32) == 2 && MmaKeyPasses(true, 128, 128) == 1 &&
              MmaKeyPasses(true, 96, 64) == 1 && MmaKeyPasses(false, 64, 64) == 1);

// 128-key tiles at head dim 64: S = 100 (one tile, its second pass partly past the end), S = 300
// (three tiles: the cp.async double buffer reused, the last tile's second pass wholly past the
// diagonal of the first query tiles), two sequences.
TEST(FlashTunedEmulation, ForwardKeyTilesOf128AcrossBoundaries) {
  ExpectForwardMatchesReference<bf16, 64, 64>({"mha 64, S=100", 1, 100, 2, 2, 64, 64, 0.0, false});
  ExpectForwardMatchesReference<bf16, 64, 64>(
      {"one head 64, S=300", 1, 300, 1, 1, 64, 64, 0.0, false});
  ExpectForwardMatchesReference<bf16, 32, 32>(
      {"32/32 B=2, S=130", 2, 130, 1, 1, 32, 32, 0.0, false});
}

// GQA/MQA with fused strides, fp32 inputs (synchronous loads into the same buffers), soft-caps
// (the scaled path, no folding), MLA's unequal dims, one-pass tiles above head dim 64, ragged and
// single-token sequences.
TEST(FlashTunedEmulation, ForwardEveryKindOfShape) {
  ExpectForwardMatchesReference<float, 64, 64>(
      {"gqa 64 fused fp32, S=150", 1, 150, 4, 2, 64, 64, 0.0, true});
  ExpectForwardMatchesReference<bf16, 64, 64>(
      {"mqa softcap 3, S=77", 1, 77, 2, 1, 64, 64, 3.0, false});
  ExpectForwardMatchesReference<bf16, 48, 32>(
      {"mla 48/32 softcap, S=65", 1, 65, 2, 2, 48, 32, 2.0, false});
  ExpectForwardMatchesReference<bf16, 128, 128>(
      {"gqa 128 fused, S=70", 1, 70, 4, 2, 128, 128, 0.0, true});
  ExpectForwardMatchesReference<bf16, 96, 64>({"96/64, S=64", 1, 64, 2, 1, 96, 64, 0.0, false});
  ExpectForwardMatchesReference<float, 16, 16>(
      {"16/16 softcap, S=17", 2, 17, 2, 2, 16, 16, 2.0, false});
  ExpectForwardMatchesReference<bf16, 32, 32>({"32/32, S=1", 2, 1, 2, 1, 32, 32, 0.0, false});
}

// The scale folded into exp2: the scores stay q·k, so the raw max is max(q·k)·scale, which for
// scale > 0 is bit for bit the max of the scaled scores the first kernel takes; the LSE's max
// term is the same number, only the exponents' rounding moves (ulps); out moves by bf16 rounding
// of P at most.
TEST(FlashTunedEmulation, ScaleFoldedIntoExp2KeepsSmaxAndLse) {
  const FlashReference ref({"gqa 64, S=200", 1, 200, 2, 1, 64, 64, 0.0, false});
  const Forward tuned = RunForward<bf16, 64, 64, true>(ref);
  const Forward first = RunForward<bf16, 64, 64, false>(ref);
  ExpectSameBits(tuned.pmax, first.pmax, "S_max, tuned vs first");
  ExpectNear(tuned.lse, first.lse, 1e-5, 1e-5, "lse, tuned vs first");
  double max_abs = 0;
  for (float x : first.out) max_abs = std::max(max_abs, double(std::abs(x)));
  ExpectNear(tuned.out, first.out, 1e-2 * max_abs, 1e-2, "out, tuned vs first");
}

TEST(FlashTunedEmulation, ExactCaseAcrossTwoKeyTiles) {
  // UniformFlashCase at S = 200: two 128-key tiles, and rows past the end in the last query tile.
  UniformFlashCase u(200);
  constexpr int D = UniformFlashCase::kD;
  emu::Launch(dim3(1, 2), kThreads, FwdMmaSmemOf<D, D, true>::kBytes, [&] {
    FlashForwardMmaKernel<bf16, D, D, false, true>(MakeParams(u.a), u.q.data(), u.k.data(),
                                                   u.v.data(), u.out.data(), u.lse.data(),
                                                   u.pmax.data());
  });
  u.Expect();
}

// The backward's pipelines: the dK/dV kernel's query tiles run over the heads of a GQA group
// (the buffer parity carries across the head boundary: 4 tiles a head at S = 200 for key tile 0,
// 3 for key tile 1), the dQ kernel's key tiles; both against the first kernels bit for bit.
TEST(FlashTunedEmulation, BackwardPipelinesEqualTheFirstKernels) {
  ExpectBackwardAsTheFirst<bf16, 64, 64>(
      {"gqa 64 softcap 2 fused, S=200", 1, 200, 2, 1, 64, 64, 2.0, true});
  ExpectBackwardAsTheFirst<bf16, 16, 16>(
      {"16/16 one head, S=200", 1, 200, 1, 1, 16, 16, 0.0, false});
}

// Every other kind of shape: fp32 inputs (synchronous loads into the double buffers), MLA dims,
// 192/128 (K/V fragments re-read from shared memory), ragged and single-token sequences.
TEST(FlashTunedEmulation, BackwardEveryKindOfShape) {
  ExpectBackwardAsTheFirst<float, 128, 128>(
      {"gqa 128 fused fp32, S=70", 1, 70, 4, 2, 128, 128, 0.0, true});
  ExpectBackwardAsTheFirst<bf16, 48, 32>(
      {"mla 48/32 softcap 2, S=65", 1, 65, 2, 2, 48, 32, 2.0, false});
  ExpectBackwardAsTheFirst<bf16, 192, 128>(
      {"mla 192/128, S=33", 1, 33, 2, 1, 192, 128, 0.0, false});
  ExpectBackwardAsTheFirst<bf16, 96, 64>(
      {"gqa 96/64 softcap 1.5, S=64", 1, 64, 2, 1, 96, 64, 1.5, false});
  ExpectBackwardAsTheFirst<float, 16, 16>({"16/16 softcap, S=17", 2, 17, 2, 2, 16, 16, 2.0, false});
  ExpectBackwardAsTheFirst<bf16, 32, 32>({"32/32, S=1", 2, 1, 2, 1, 32, 32, 0.0, false});
}

}  // namespace
}  // namespace moelab::cuda::flash
