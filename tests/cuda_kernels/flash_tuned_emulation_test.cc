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
#include <tuple>
#include <vector>

#include "tests/cuda_kernels/flash_reference.h"

namespace moelab::cuda::flash {
namespace {

using testing::ExpectNear;
using testing::FlashCase;
using testing::FlashReference;
using testing::FromFloat;
using testing::ToFloat;

struct Forward {
  std::vector<float> out, lse, pmax;
};

// FlashAttentionForward's mma launch on the emulation (kTuned: "mma", else "mma64"), outputs
// poisoned with NaN.
template <typename T, int DQK, int DV, bool kTuned>
Forward RunForward(const FlashReference& ref) {
  const AttentionDims& a = ref.a;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<T> x(ref.total), out(ref.out.size(), FromFloat<T>(nan));
  for (size_t i = 0; i < x.size(); ++i) x[i] = FromFloat<T>(ref.x[i]);
  const T *q = x.data() + ref.q_off, *k = x.data() + ref.k_off, *v = x.data() + ref.v_off;
  const size_t pairs = size_t(a.batch) * a.heads;
  Forward f;
  f.lse.assign(ref.lse.size(), nan), f.pmax.assign(pairs, -INFINITY);
  constexpr int tile = kTile * MmaRowBlocks(DQK, DV);
  emu::Launch(dim3(pairs, (a.seq + tile - 1) / tile), kThreads,
              FwdMmaSmemOf<DQK, DV, kTuned>::kBytes, [&] {
                FlashForwardMmaKernel<T, DQK, DV, false, kTuned>(MakeParams(a), q, k, v, out.data(),
                                                                 f.lse.data(), f.pmax.data());
              });
  for (const T& o : out) f.out.push_back(ToFloat(o));
  return f;
}

// FlashAttentionBackward's sequence (D, dK/dV, dQ) with the mma kernels (kTuned: "mma", else
// "mma64") on the CPU forward's out and LSE; dx in the input layout, untouched entries NaN.
template <typename T, int DQK, int DV, bool kTuned>
std::vector<float> RunBackward(const FlashCase& c, const FlashReference& ref) {
  const Params p = MakeParams(ref.a);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<T> x(ref.total), dout(ref.dout.size()), out(ref.out.size());
  for (size_t i = 0; i < x.size(); ++i) x[i] = FromFloat<T>(ref.x[i]);
  for (size_t i = 0; i < dout.size(); ++i) dout[i] = FromFloat<T>(ref.dout[i]);
  for (size_t i = 0; i < out.size(); ++i) out[i] = FromFloat<T>(float(ref.out[i]));
  std::vector<float> lse(ref.lse.begin(), ref.lse.end()), d(ref.lse.size(), nan),
      dx(ref.total, nan);
  const T *q = x.data() + ref.q_off, *k = x.data() + ref.k_off, *v = x.data() + ref.v_off;
  const long pairs = long(c.batch) * c.heads, rows = pairs * c.seq;
  emu::Launch(dim3((rows * 32 + 255) / 256), 256, 0,
              [&] { RowDotKernel<T>(p, c.v_dim, out.data(), dout.data(), d.data()); });
  float *dq = dx.data() + ref.q_off, *dk = dx.data() + ref.k_off, *dv = dx.data() + ref.v_off;
  emu::Launch(dim3(c.batch * c.kv_heads, (c.seq + kTile - 1) / kTile), kThreads,
              BwdMmaKvSmemBytes<DQK, DV, kTuned>(), [&] {
                FlashBackwardKvMmaKernel<T, DQK, DV, false, kTuned>(p, q, k, v, lse.data(),
                                                                    d.data(), dout.data(), dk, dv);
              });
  constexpr int kRows = kDqQueryTile<DQK, DV>;
  emu::Launch(dim3(pairs, (c.seq + kRows - 1) / kRows), kThreads,
              BwdMmaQSmem<DQK, DV, kTuned>::kBytes, [&] {
                FlashBackwardQMmaKernel<T, DQK, DV, false, kTuned>(p, q, k, v, lse.data(), d.data(),
                                                                   dout.data(), dq);
              });
  return dx;
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
  FlashReference::ExpectBf16Near(f.out, ref.out, "out");
  ExpectNear(f.lse, FlashReference::ToFloat(ref.lse), 2e-4, 2e-4, "lse");
  ExpectNear(f.pmax, FlashReference::ToFloat(ref.pmax), 1e-4, 1e-4, "S_max per (batch, head)");
}

// The tuned backward: bit for bit the first kernels', and within the bf16 tolerances of the CPU
// backward in double.
template <typename T, int DQK, int DV>
void ExpectBackwardAsTheFirst(const FlashCase& c) {
  SCOPED_TRACE(c.name);
  const FlashReference ref(c);
  const std::vector<float> tuned = RunBackward<T, DQK, DV, true>(c, ref);
  ExpectSameBits(tuned, RunBackward<T, DQK, DV, false>(c, ref), "dq | dk | dv, tuned vs first");
  for (auto [off, width, what] :
       {std::tuple{ref.q_off, ref.qw, "dq"}, std::tuple{ref.k_off, ref.kw, "dk"},
        std::tuple{ref.v_off, ref.vw, "dv"}}) {
    FlashReference::ExpectBf16Near(ref.Slice(tuned, off, width), ref.Slice(ref.dx, off, width),
                                   what);
  }
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
  // Every q·k is 64·(0.5·−0.5) = −16, every logit −16·0.125 = −2 exactly; S = 200 spans two
  // 128-key tiles, and the rows past the end in the last query tile score 0 on unmasked keys and
  // must not reach S_max. P = 1/(i + 1) per key: out is exactly v, LSE = −2 + log(i + 1).
  constexpr int S = 200, D = 64;
  AttentionDims a;
  a.batch = 1, a.seq = S, a.heads = 1, a.kv_heads = 1, a.qk_dim = D, a.v_dim = D;
  a.ldq = a.ldk = a.ldv = a.ldo = D;
  a.scale = 0.125;
  std::vector<bf16> q(S * D, FromFloat<bf16>(0.5f)), k(S * D, FromFloat<bf16>(-0.5f)),
      v(S * D, FromFloat<bf16>(1.0f)), out(S * D);
  std::vector<float> lse(S), pmax(1, -INFINITY);
  emu::Launch(dim3(1, 2), kThreads, FwdMmaSmemOf<D, D, true>::kBytes, [&] {
    FlashForwardMmaKernel<bf16, D, D, false, true>(MakeParams(a), q.data(), k.data(), v.data(),
                                                   out.data(), lse.data(), pmax.data());
  });
  EXPECT_EQ(pmax[0], -2.0f);
  for (int i = 0; i < S; ++i) EXPECT_NEAR(lse[i], -2.0 + std::log(i + 1.0), 1e-5) << i;
  for (const bf16& o : out) EXPECT_EQ(ToFloat(o), 1.0f);
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
