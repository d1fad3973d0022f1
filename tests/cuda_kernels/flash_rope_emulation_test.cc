// RoPE fused into the mma attention kernels (kernels/cuda/flash_rope.cuh; FlashAttentionForward /
// Backward with a FlashRope) run on the CPU under tests/cuda_kernels/emulation/cuda_emulation.h:
//   - bit for bit the unfused sequence the model runs today: the rope kernel (RopeApplyQk's
//     device code) on q and k, the plain mma forward; the plain mma backward, then the inverse
//     rope kernel on dq and dk — out, LSE, S_max, dq, dk, dv all equal to the bit;
//   - against the CPU attention in double on the rotated inputs (flash_reference.h's tolerances).
// Inputs: FlashReference's (bf16-exact) q and k taken as the rotated values, un-rotated in double
// (so fp32, not bf16-exact: the kernels' rounding after the rotation is exercised). The GPU twins
// are in flash_attention_test.cc.
// clang-format off
// The emulation first: it replaces the CUDA primitives the kernel headers use.
#include "tests/cuda_kernels/emulation/cuda_emulation.h"
#include "kernels/cuda/flash_backward_mma.cuh"
#include "kernels/cuda/flash_forward_mma.cuh"
#include "kernels/cuda/rope_kernels.cuh"
// clang-format on

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/cpu/rope.h"
#include "tests/cuda_kernels/flash_reference.h"

namespace moelab::cuda::flash {
namespace {

using testing::ExpectNear;
using testing::FlashCase;
using testing::FlashReference;

constexpr double kTheta = 10000.0;

// Tables [seq, D/2] as the model builds them (cpu::RopeTables in double, rounded to T).
template <typename T>
struct Tables {
  Tables(int seq, int d) : cos(size_t(seq) * d / 2), sin(cos.size()) {
    cpu::RopeTables<T>(seq, d, kTheta, cos.data(), sin.data());
  }
  std::vector<T> cos, sin;
};

// The q and k slices of a FlashReference buffer x (RopeQkKernel's view).
std::pair<cpu::RopeSlice<float>, cpu::RopeSlice<float>> QkSlices(const FlashReference& ref,
                                                                 float* x) {
  const AttentionDims& a = ref.a;
  return {{x + ref.q_off, int(a.ldq), a.heads, a.qk_dim, 0},
          {x + ref.k_off, int(a.ldk), a.kv_heads, a.qk_dim, 0}};
}

// RopeApplyQk's kernel on the emulation, in place on q and k (inverse: the backward's R⁻¹).
void RopeKernel(const FlashReference& ref, float* x, const Tables<float>& t, bool inverse) {
  const auto [q, k] = QkSlices(ref, x);
  const AttentionDims& a = ref.a;
  emu::Launch(dim3(4), 128, 0, [&] {
    rope::RopeQkKernel<float>(q, k, long(a.batch) * a.seq, a.seq, a.qk_dim, t.cos.data(),
                              t.sin.data(), inverse ? -1.0f : 1.0f);
  });
}

// R⁻¹ (sign −1) in double on the q and k columns of x, a buffer in ref's layout.
template <typename V>
void InverseRopeInDouble(const FlashReference& ref, V& x) {
  const AttentionDims& a = ref.a;
  const int half = a.qk_dim / 2;
  const Tables<double> t(a.seq, a.qk_dim);
  struct Part {
    long off, ld;
    int heads;
  };
  for (long r = 0; r < ref.rows; ++r) {
    const size_t row = size_t(r % a.seq) * half;  // the position's table row
    for (const Part& s :
         {Part{ref.q_off, long(a.ldq), a.heads}, Part{ref.k_off, long(a.ldk), a.kv_heads}}) {
      for (int h = 0; h < s.heads; ++h) {
        for (int i = 0; i < half; ++i) {
          const long ia = s.off + r * s.ld + long(h) * a.qk_dim + i, ib = ia + half;
          const double c = t.cos[row + i], sn = t.sin[row + i], xa = x[ia], xb = x[ib];
          x[ia] = xa * c + xb * sn;
          x[ib] = xb * c - xa * sn;
        }
      }
    }
  }
}

struct Results {
  std::vector<float> out, lse, pmax, dx;
};

// The forward and the backward (D, dK/dV, dQ: FlashAttentionBackward's sequence) of the mma
// kernels with (kRope) or without the fused rotation, on fp32 inputs x in ref's layout. The
// backward takes the CPU's out and LSE (as flash_backward_mma_emulation_test.cc does), so that
// both variants see the same ones. Outputs poisoned with NaN (untouched entries stay NaN).
// kTuned: the tuned kernels (attention_kernel "mma"), else the first ones ("mma64").
template <int D, bool kRope, bool kTuned>
Results Run(const FlashReference& ref, const std::vector<float>& x, const Tables<float>& t) {
  const AttentionDims& a = ref.a;
  const Params p = MakeParams(a);
  const RopeArgs rope = kRope ? RopeArgs{t.cos.data(), t.sin.data()} : RopeArgs{};
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float *q = x.data() + ref.q_off, *k = x.data() + ref.k_off, *v = x.data() + ref.v_off;
  const unsigned pairs = a.batch * a.heads;
  Results r;
  r.out.assign(ref.out.size(), nan), r.lse.assign(ref.lse.size(), nan);
  r.pmax.assign(pairs, -INFINITY), r.dx.assign(ref.total, nan);
  constexpr int kFwdTile = kTile * MmaRowBlocks(D, D);
  emu::Launch(dim3(pairs, (a.seq + kFwdTile - 1) / kFwdTile), kThreads,
              FwdMmaSmemOf<D, D, kTuned>::kBytes, [&] {
                FlashForwardMmaKernel<float, D, D, kRope, kTuned>(
                    p, q, k, v, r.out.data(), r.lse.data(), r.pmax.data(), rope);
              });
  const std::vector<float> out(ref.out.begin(), ref.out.end()), lse(ref.lse.begin(), ref.lse.end());
  std::vector<float> dd(ref.lse.size(), nan);
  const long rows = long(pairs) * a.seq;
  emu::Launch(dim3((rows * 32 + 255) / 256), 256, 0,
              [&] { RowDotKernel<float>(p, D, out.data(), ref.dout.data(), dd.data()); });
  float *dq = r.dx.data() + ref.q_off, *dk = r.dx.data() + ref.k_off, *dv = r.dx.data() + ref.v_off;
  emu::Launch(dim3(a.batch * a.kv_heads, (a.seq + kTile - 1) / kTile), kThreads,
              BwdMmaKvSmemBytes<D, D, kTuned>(), [&] {
                FlashBackwardKvMmaKernel<float, D, D, kRope, kTuned>(
                    p, q, k, v, lse.data(), dd.data(), ref.dout.data(), dk, dv, rope);
              });
  constexpr int kDqTile = kDqQueryTile<D, D>;
  emu::Launch(dim3(pairs, (a.seq + kDqTile - 1) / kDqTile), kThreads,
              BwdMmaQSmem<D, D, kTuned>::kBytes, [&] {
                FlashBackwardQMmaKernel<float, D, D, kRope, kTuned>(
                    p, q, k, v, lse.data(), dd.data(), ref.dout.data(), dq, rope);
              });
  return r;
}

void ExpectSameBits(const std::vector<float>& got, const std::vector<float>& want,
                    const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  size_t differ = 0, first = got.size();
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::memcmp(&got[i], &want[i], sizeof(float)) != 0) {
      if (differ++ == 0) first = i;
    }
  }
  EXPECT_EQ(differ, 0u) << what << ": " << differ << " of " << got.size()
                        << " entries differ, the first at " << first << " (" << got[first] << " vs "
                        << want[first] << ")";
}

// Both checks of the header on one case (c.qk_dim = c.v_dim = D), on the first mma kernels or
// (kTuned) the tuned ones.
template <int D, bool kTuned = false>
void CheckCase(const FlashCase& c) {
  SCOPED_TRACE(c.name);
  const FlashReference ref(c);
  const Tables<float> t(c.seq, D);
  // Un-rotated inputs: the reference's rotated q and k through R⁻¹ in double, rounded to fp32.
  std::vector<double> x0d(ref.x.begin(), ref.x.end());
  InverseRopeInDouble(ref, x0d);
  const std::vector<float> x0(x0d.begin(), x0d.end());

  // Unfused: the rope kernel, the plain kernels, the inverse rope kernel on dq and dk.
  std::vector<float> xr = x0;
  RopeKernel(ref, xr.data(), t, /*inverse=*/false);
  Results unfused = Run<D, false, kTuned>(ref, xr, t);
  RopeKernel(ref, unfused.dx.data(), t, /*inverse=*/true);
  const Results fused = Run<D, true, kTuned>(ref, x0, t);
  ExpectSameBits(fused.out, unfused.out, "out");
  ExpectSameBits(fused.lse, unfused.lse, "lse");
  ExpectSameBits(fused.pmax, unfused.pmax, "S_max");
  ExpectSameBits(fused.dx, unfused.dx, "dq | dk | dv");

  // Against the CPU in double: out, LSE and S_max of the rotated inputs; dq and dk of the
  // rotated ones taken back through R⁻¹ (the chain rule through the orthogonal rotation).
  FlashReference::ExpectBf16Near(fused.out, ref.out, "out");
  ExpectNear(fused.lse, FlashReference::ToFloat(ref.lse), 2e-4, 2e-4, "lse");
  ExpectNear(fused.pmax, FlashReference::ToFloat(ref.pmax), 1e-4, 1e-4, "S_max");
  std::vector<double> dx = ref.dx;
  InverseRopeInDouble(ref, dx);
  FlashReference::ExpectBf16Near(ref.Slice(fused.dx, ref.q_off, ref.qw),
                                 ref.Slice(dx, ref.q_off, ref.qw), "dq");
  FlashReference::ExpectBf16Near(ref.Slice(fused.dx, ref.k_off, ref.kw),
                                 ref.Slice(dx, ref.k_off, ref.kw), "dk");
  FlashReference::ExpectBf16Near(ref.Slice(fused.dx, ref.v_off, ref.vw),
                                 ref.Slice(dx, ref.v_off, ref.vw), "dv");
}

// The model's layout (q | k | v columns of one buffer) with GQA over two sequences, so positions
// restart at each sequence: a 128-query forward tile (two row blocks a warp), key tiles below, on
// and past the diagonal, the dQ kernel's 128-query tile.
TEST(FlashRopeEmulation, GqaFusedLayoutTwoSequences) {
  CheckCase<64>({"gqa 64 fused, B=2, S=70", 2, 70, 2, 1, 64, 64, 0.0, true});
}

// One row block a warp (qk_dim 128) with a soft-cap; the smallest head (16: one chunk pair a
// row) over ragged sequences; separate q, k, v buffers.
TEST(FlashRopeEmulation, WideAndNarrowHeads) {
  CheckCase<128>({"mha 128 softcap 3, S=65", 1, 65, 2, 2, 128, 128, 3.0, true});
  CheckCase<16>({"16/16 separate, B=2, S=17", 2, 17, 2, 2, 16, 16, 0.0, false});
}

// The tuned kernels (attention_kernel "mma"): the rotation in each 64-row half of the forward's
// 128-key tiles and in the backward's cp.async-pipelined tiles, bit for bit as unfused.
TEST(FlashRopeEmulation, TunedKernelsFuseAlike) {
  CheckCase<64, true>({"tuned gqa 64 fused, B=2, S=70", 2, 70, 2, 1, 64, 64, 0.0, true});
  CheckCase<128, true>({"tuned mha 128 softcap 3, S=65", 1, 65, 2, 2, 128, 128, 3.0, true});
}

}  // namespace
}  // namespace moelab::cuda::flash
