// The fused attention forward on `mma.sync` register fragments (kernels/cuda/mma.cuh),
// FlashAttention-2 style: what FlashAttentionForward runs when FlashKernelInUse() is kMma (the
// tuned kernel, kTuned) or kMma64 (the first one), for every head-dim pair. Same contract as the
// wmma FlashForwardKernel (flash_attention_kernels.cuh), whose Params and tile loader it shares;
// the difference is that only the Q, K and V operand tiles go through shared memory, every
// elementwise step stays in registers:
//   - grid (B·H, query tiles), heaviest (last) tiles first; 4 warps, each owning kM·16 query rows
//     (kM = MmaRowBlocks: 2 for qk_dim ≤ 64, FlashAttention-2's 128-query tile of 4 warps × 32
//     rows, so that every K/V fragment read from shared memory feeds two tensor-core products and
//     every K/V tile loaded serves 128 queries; 1 for larger dims, whose Q fragments and O
//     accumulators would not fit twice in 255 registers). Why not 8 warps × 16 rows: the same
//     tile, but each warp reads the whole K/V tile for 16 rows, twice the shared-memory traffic
//     per product of 4 warps × 32 (ldmatrix bandwidth, not the tensor cores, bounds this loop).
//   - Q tile → shared memory → each warp's A fragments (all qk_dim/16 k-steps) in registers.
//   - per key tile up to the diagonal (64 keys; the tuned kernel's 128 at head dims ≤ 64, walked
//     as two 64-key register passes, MmaKeyPasses): K and V tiles in shared memory as bf16 rows,
//     double-buffered by cp.async (the next tile loads during this one; fp32 inputs go through
//     registers to be rounded), rows padded by 16 bytes so that ldmatrix's eight 16-byte rows
//     fall in distinct banks; B fragments by ldmatrix.x4 (K as stored, V with .trans, so P·V
//     needs no transposed copy of V); S = Q·Kᵀ in C registers; scale, raw max (S_max), mask,
//     soft-cap and the online softmax per row in registers (a row lives in the 4 lanes of a
//     group: its max takes two __shfl_xor_sync, its sum stays per lane until the end); P packed
//     from C straight into A fragments; O += P·V in registers. The tuned kernel without a
//     soft-cap keeps the scores as q·k and folds the scale into exp2's multiplier.
//   - tiles skipped: above the block's diagonal (the loop ends there), and per warp the tiles
//     whose keys all lie above its rows; mask compares and the soft-cap branch only in the
//     template variants of the elementwise step that need them.
//   - end: O / l written from registers, LSE per row, the warp's raw max by the atomic max on the
//     float's bits.
// Registers of the first kernel (nvcc 13, -Xptxas -v, sm_90, bf16 inputs): kM = 2: 255 at 64/64,
// 48/32, 32/32 and 168 at 16/16; kM = 1: 254 at 128/128, 192/128 and 168 at 96/64. 255 or 254: 2
// blocks (8 warps) an SM; 168: 3 blocks. fp32 inputs the same or fewer. No spills (sm_80: 8 bytes
// at bf16 16/16). With RoPE fused (kRope, fp32 q/k, qk_dim = v_dim; flash_rope.cuh): 255 at 64/64,
// 199 at 32/32, 168 at 16/16, 188 at 128/128; no spills. The tuned kernel: 255 at 64/64, 48/32,
// 32/32 (bf16; fp32 32/32 179), 254 at 192/128, 247 at 128/128, 168 at 96/64 and 16/16; no
// spills, no stack.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/flash_attention_kernels.cuh"
#include "kernels/cuda/flash_rope.cuh"
#include "kernels/cuda/flash_tile_copy.cuh"
#include "kernels/cuda/mma.cuh"

namespace moelab::cuda::flash {

// 2^x by the special-function unit alone (ex2.approx.ftz: relative error ~2^-22, −∞ → 0, results
// below 2^-126 flushed to 0 — harmless for probabilities): exp2f without fast-math adds range
// handling around it, on every element of the tile.
__device__ __forceinline__ float Exp2(float x) {
#ifndef MOELAB_CUDA_EMULATION
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
#else
  return std::exp2(x);
#endif
}

// Query rows per warp in 16-row blocks: 2 (FlashAttention-2's 128-query tiles of 4 warps × 32
// rows) where the registers allow, so that each K and V fragment loaded from shared memory feeds
// two products and each K/V tile loaded into the block serves 128 queries; 1 (64-query tiles)
// for qk_dim > 64, whose Q fragments and O accumulators would not fit twice in 255 registers.
constexpr int MmaRowBlocks(int dqk, int dv) { return dqk <= 64 && dv <= 64 ? 2 : 1; }

// 64-key register passes per shared-memory K/V tile. The first kernel (kTuned false,
// attention_kernel "mma64"): 1, a 64-key tile. The tuned one ("mma"): 2 at head dims ≤ 64, a
// 128-key tile (FlashAttention-2's block at d 64) walked as two passes of the first kernel's
// register footprint (the scores of 128 keys would not fit beside O), which halves the barriers,
// the cp.async groups and the loop overhead per key; 1 above, whose double-buffered tiles would
// pass 100 KB a block.
constexpr int MmaKeyPasses(bool tuned, int dqk, int dv) {
  return tuned && dqk <= 64 && dv <= 64 ? 2 : 1;
}

// Shared memory of the mma forward: the Q tile (64·kM rows) and two K and V tiles of 64·kPasses
// keys (double-buffered: the next key tile loads while this one is used), bf16 rows of Ld16(D).
// With one pass never more than the wmma forward's FwdSmem; FlashAttentionSupported checks the
// largest of the kernels' sizes against the device.
template <int DQK, int DV, int kM = MmaRowBlocks(DQK, DV), int kPasses = 1>
struct FwdMmaSmem {
  static constexpr size_t kQ = 0;
  static constexpr size_t kQBytes = size_t(kM) * kTile * Ld16(DQK) * 2;
  static constexpr size_t kKBytes = size_t(kPasses) * kTile * Ld16(DQK) * 2;
  static constexpr size_t kVBytes = size_t(kPasses) * kTile * Ld16(DV) * 2;
  static constexpr size_t kK = kQ + kQBytes;  // buffer i at kK + i·kBuf
  static constexpr size_t kV = kK + kKBytes;  // buffer i at kV + i·kBuf
  static constexpr size_t kBuf = kKBytes + kVBytes;
  static constexpr size_t kBytes = kK + 2 * kBuf;
  static_assert((kPasses > 1 || kBytes <= FwdSmem<DQK, DV>::kBytes) && kKBytes % 128 == 0 &&
                kVBytes % 128 == 0 && DQK % 16 == 0 && DV % 16 == 0 && (kM == 1 || kM == 2) &&
                (kPasses == 1 || kPasses == 2));
};
// The layout of FlashForwardMmaKernel<T, DQK, DV, kRope, kTuned>.
template <int DQK, int DV, bool kTuned>
using FwdMmaSmemOf = FwdMmaSmem<DQK, DV, MmaRowBlocks(DQK, DV), MmaKeyPasses(kTuned, DQK, DV)>;

__device__ __forceinline__ void StorePair(float* p, float x, float y) {
  *reinterpret_cast<float2*>(p) = make_float2(x, y);
}
__device__ __forceinline__ void StorePair(bf16* p, float x, float y) {
  *reinterpret_cast<uint32_t*>(p) = mma::PackBf16x2(x, y);
}

// Scale, raw max, mask and soft-cap of a warp's scores in registers, in place: element e of
// s[m][n] is (row[m][e / 2], key k0 + 8n + 2t + e % 2); masked ones (key after the row, row past
// the end) become −∞ and stay out of the raw max. Templated so that the common tile (below the
// diagonal, no cap) carries neither the mask's compares nor the cap's branch. !kScale (the tuned
// kernel without a cap): the scores stay unscaled q·k, the scale is folded into exp2's
// multiplier, and the raw max is of q·k (scaled once at the end: scale > 0 keeps the max).
template <bool kMasked, bool kCap, bool kScale, int kM>
__device__ __forceinline__ void Logits(float (&s)[kM][kTile / 8][4], const int (&row)[kM][2],
                                       int k0, int t, const Params& p, float inv_cap,
                                       float& raw_max) {
  static_assert(kScale || !kCap, "the soft-cap needs the scaled logit");
#pragma unroll
  for (int m = 0; m < kM; ++m) {
#pragma unroll
    for (int n = 0; n < kTile / 8; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float x = kScale ? s[m][n][e] * p.scale : s[m][n][e];
        bool valid = true;
        if constexpr (kMasked) {
          const int i = row[m][e >> 1], j = k0 + n * 8 + 2 * t + (e & 1);
          valid = j <= i && i < p.seq;
        }
        raw_max = fmaxf(raw_max, valid ? x : -INFINITY);
        if constexpr (kCap) x = p.cap * tanhf(x * inv_cap);
        s[m][n][e] = valid ? x : -INFINITY;
      }
    }
  }
}

// The per-lane state a warp carries across key passes: O accumulators, per row (of the lane's
// 2·kM) the running max in score units and the lane's part of the running sum, and the lane's
// raw max.
template <int DV, int kM>
struct FwdRows {
  float o[kM][DV / 8][4];
  float m_run[kM][2], l_run[kM][2];
  float raw_max;
};

// One 64-key pass of a warp: S = Q·Kᵀ from the key rows sk (stride Ld16(DQK)) and the warp's Q
// fragments qa, the logits (masked where the keys k0.. reach past the warp's first row w0 or the
// warp has rows past the end), the online softmax in base 2 (to_log2: log2(e), or with the scale
// folded, scale·log2(e)), and O += P·V from the value rows sv.
template <int DQK, int DV, int kM>
__device__ __forceinline__ void ForwardKeyPass(FwdRows<DV, kM>& st,
                                               const uint32_t (&qa)[kM][DQK / 16][4],
                                               const bf16* sk, const bf16* sv,
                                               const int (&row)[kM][2], int k0, int w0,
                                               const Params& p, float inv_cap, bool fold,
                                               float to_log2) {
  constexpr int kQSteps = DQK / 16, kKeyTiles = kTile / 8, kVTiles = DV / 8;
  const int lane = threadIdx.x & 31, t = lane & 3, mrow = lane & 7, mat = lane >> 3;
  // S = Q·Kᵀ: B[k][n] = K[key n][dim k]; one ldmatrix gives two n-tiles' fragments for a
  // k-step: matrices (keys 0–7 | 8–15 of the pair) × (dims 0–7 | 8–15).
  float s[kM][kKeyTiles][4];
#pragma unroll
  for (int m = 0; m < kM; ++m) {
#pragma unroll
    for (int n = 0; n < kKeyTiles; ++n) s[m][n][0] = s[m][n][1] = s[m][n][2] = s[m][n][3] = 0;
  }
#pragma unroll
  for (int kk = 0; kk < kQSteps; ++kk) {
#pragma unroll
    for (int n = 0; n < kKeyTiles; n += 2) {
      uint32_t kb[4];
      LdMatrixX4<false>(kb,
                        sk + (n * 8 + (mat >> 1) * 8 + mrow) * Ld16(DQK) + kk * 16 + (mat & 1) * 8);
#pragma unroll
      for (int m = 0; m < kM; ++m) {
        mma::MmaBf16(s[m][n], qa[m][kk], kb);
        mma::MmaBf16(s[m][n + 1], qa[m][kk], kb + 2);
      }
    }
  }

  // Logits in registers, masked only where the tile reaches past the warp's first row or the
  // warp has rows past the end; the branches are uniform across the block.
  const bool masked = k0 + kTile - 1 > w0 || w0 + 16 * kM - 1 >= p.seq;
  if (masked) {
    if (p.cap > 0) {
      Logits<true, true, true>(s, row, k0, t, p, inv_cap, st.raw_max);
    } else if (fold) {
      Logits<true, false, false>(s, row, k0, t, p, inv_cap, st.raw_max);
    } else {
      Logits<true, false, true>(s, row, k0, t, p, inv_cap, st.raw_max);
    }
  } else {
    if (p.cap > 0) {
      Logits<false, true, true>(s, row, k0, t, p, inv_cap, st.raw_max);
    } else if (fold) {
      Logits<false, false, false>(s, row, k0, t, p, inv_cap, st.raw_max);
    } else {
      Logits<false, false, true>(s, row, k0, t, p, inv_cap, st.raw_max);
    }
  }
  uint32_t pa[kM][kTile / 16][4];  // P's A fragments: C of key tiles 2kk, 2kk + 1, in bf16
#pragma unroll
  for (int m = 0; m < kM; ++m) {
    float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int n = 0; n < kKeyTiles; ++n) {
      tile_max[0] = fmaxf(tile_max[0], fmaxf(s[m][n][0], s[m][n][1]));
      tile_max[1] = fmaxf(tile_max[1], fmaxf(s[m][n][2], s[m][n][3]));
    }
    // exp(c·(x − max)) as exp2(x·to_log2 − max·to_log2): one FMA and one ex2 an element.
    float alpha[2], base[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 1));
      tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 2));
      const float m_new = fmaxf(st.m_run[m][r], tile_max[r]);
      base[r] = m_new == -INFINITY ? 0.0f : m_new * to_log2;     // nothing unmasked yet: 0
      alpha[r] = Exp2(fmaf(st.m_run[m][r], to_log2, -base[r]));  // 0 on the row's first tile
      st.m_run[m][r] = m_new;
      st.l_run[m][r] *= alpha[r];
    }
#pragma unroll
    for (int n = 0; n < kVTiles; ++n) {
      st.o[m][n][0] *= alpha[0], st.o[m][n][1] *= alpha[0];
      st.o[m][n][2] *= alpha[1], st.o[m][n][3] *= alpha[1];
    }
    // P = exp2(x·to_log2 − base), summed in fp32 (per lane until the end) and packed to bf16.
#pragma unroll
    for (int kk = 0; kk < kTile / 16; ++kk) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const float* c = s[m][2 * kk + half];
        const float e0 = Exp2(fmaf(c[0], to_log2, -base[0]));
        const float e1 = Exp2(fmaf(c[1], to_log2, -base[0]));
        const float e2 = Exp2(fmaf(c[2], to_log2, -base[1]));
        const float e3 = Exp2(fmaf(c[3], to_log2, -base[1]));
        st.l_run[m][0] += e0 + e1, st.l_run[m][1] += e2 + e3;
        pa[m][kk][2 * half] = mma::PackBf16x2(e0, e1);
        pa[m][kk][2 * half + 1] = mma::PackBf16x2(e2, e3);
      }
    }
  }
  // O += P·V: B[k][n] = V[key k][dim n], by ldmatrix.trans from V's rows: matrices
  // (keys 0–7 | 8–15 of the k-step) × (dims of n-tile n | n + 1).
#pragma unroll
  for (int kk = 0; kk < kTile / 16; ++kk) {
#pragma unroll
    for (int n = 0; n < kVTiles; n += 2) {
      uint32_t vb[4];
      LdMatrixX4<true>(vb,
                       sv + (kk * 16 + (mat & 1) * 8 + mrow) * Ld16(DV) + n * 8 + (mat >> 1) * 8);
#pragma unroll
      for (int m = 0; m < kM; ++m) {
        mma::MmaBf16(st.o[m][n], pa[m][kk], vb);
        mma::MmaBf16(st.o[m][n + 1], pa[m][kk], vb + 2);
      }
    }
  }
}

// The K and V rows [k0, k0 + 64·kPasses) into a buffer (sk, sv), as kPasses 64-row tiles issued
// by cp.async where they can be (bf16 without RoPE); rows past the end zero.
template <int DQK, int DV, int kPasses, bool kRope, typename T>
__device__ __forceinline__ void LoadKeyTile(bf16* sk, bf16* sv, const T* K, const T* V,
                                            const Params& p, int k0, const RopeArgs& rope) {
#pragma unroll
  for (int pass = 0; pass < kPasses; ++pass) {
    const int r0 = k0 + pass * kTile;
    LoadQkTile<DQK, kRope>(sk + pass * kTile * Ld16(DQK), K + long(r0) * p.ldk, p.ldk, p.seq - r0,
                           rope, r0);
    LoadTileAsync<DV>(sv + pass * kTile * Ld16(DV), V + long(r0) * p.ldv, p.ldv, p.seq - r0);
  }
}

// grid (B·H, ⌈S / (64·kM)⌉ query tiles), heaviest (last) first; kThreads threads. kRope: q and
// k are rotated by RoPE (tables in rope) as their tiles load (flash_rope.cuh). kTuned: the tuned
// kernel (attention_kernel "mma": 128-key tiles at head dims ≤ 64, the scale folded into exp2's
// multiplier where there is no soft-cap); false: the first mma kernel ("mma64"), kept to compare.
template <typename T, int DQK, int DV, bool kRope = false, bool kTuned = false>
__global__ void __launch_bounds__(kThreads)
    FlashForwardMmaKernel(Params p, const T* __restrict__ q, const T* __restrict__ k,
                          const T* __restrict__ v, T* __restrict__ out, float* __restrict__ lse,
                          float* __restrict__ pair_max, RopeArgs rope = {}) {
  constexpr int kM = MmaRowBlocks(DQK, DV), kPasses = MmaKeyPasses(kTuned, DQK, DV);
  using L = FwdMmaSmem<DQK, DV, kM, kPasses>;
  constexpr int kQTile = kTile * kM, kWarpRows = 16 * kM, kKeyTile = kTile * kPasses;
  constexpr int kQSteps = DQK / 16, kVTiles = DV / 8;
  constexpr float kLog2e = 1.4426950408889634f;
  MOELAB_FLASH_SMEM(smem);
  bf16* sq = reinterpret_cast<bf16*>(smem + L::kQ);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  // The lane's place in every fragment (mma.cuh): group g holds rows g and g + 8 of each 16-row
  // block, thread t the columns 2t, 2t + 1 of each 8-wide n-tile. ldmatrix: lane l addresses row
  // l % 8 of matrix l / 8.
  const int g = lane >> 2, t = lane & 3, mrow = lane & 7, mat = lane >> 3;

  const int S = p.seq, pair = blockIdx.x, b = pair / p.heads, h = pair % p.heads;
  const int kvh = h / (p.heads / p.kv_heads);
  const int q0 = (gridDim.y - 1 - blockIdx.y) * kQTile;
  const T* Q = q + long(b) * S * p.ldq + long(h) * DQK;
  const T* K = k + long(b) * S * p.ldk + long(kvh) * DQK;
  const T* V = v + long(b) * S * p.ldv + long(kvh) * DV;
  const int w0 = q0 + warp * kWarpRows;  // the warp's first query row
  const bool warp_active = w0 < S;
  const int warp_last = min(w0 + kWarpRows - 1, S - 1);
  int row[kM][2];  // the lane's query rows: block m, half r
#pragma unroll
  for (int m = 0; m < kM; ++m) row[m][0] = w0 + 16 * m + g, row[m][1] = w0 + 16 * m + 8 + g;

  // Two groups of copies in flight: Q, then the first K and V tile.
  const int kv_end = min(q0 + kQTile, S);
#pragma unroll
  for (int m = 0; m < kM; ++m) {
    LoadQkTile<DQK, kRope>(sq + m * kTile * Ld16(DQK), Q + long(q0 + m * kTile) * p.ldq, p.ldq,
                           S - q0 - m * kTile, rope, q0 + m * kTile);
  }
  CpAsyncCommit();
  LoadKeyTile<DQK, DV, kPasses, kRope>(reinterpret_cast<bf16*>(smem + L::kK),
                                       reinterpret_cast<bf16*>(smem + L::kV), K, V, p, 0, rope);
  CpAsyncCommit();
  CpAsyncWait<1>();
  __syncthreads();
  // Q's A fragments: matrices (rows 0–7 | 8–15) × (k 0–7 | 8–15) of each 16-wide k-step.
  uint32_t qa[kM][kQSteps][4];
#pragma unroll
  for (int m = 0; m < kM; ++m) {
#pragma unroll
    for (int kk = 0; kk < kQSteps; ++kk) {
      LdMatrixX4<false>(
          qa[m][kk], sq + (warp * kWarpRows + 16 * m + (mat & 1) * 8 + mrow) * Ld16(DQK) + kk * 16 +
                         (mat >> 1) * 8);
    }
  }

  FwdRows<DV, kM> st;
  st.raw_max = -INFINITY;
#pragma unroll
  for (int m = 0; m < kM; ++m) {
#pragma unroll
    for (int n = 0; n < kVTiles; ++n) {
      st.o[m][n][0] = st.o[m][n][1] = st.o[m][n][2] = st.o[m][n][3] = 0.0f;
    }
    st.m_run[m][0] = st.m_run[m][1] = -INFINITY;
    st.l_run[m][0] = st.l_run[m][1] = 0.0f;
  }
  const float inv_cap = p.cap > 0 ? 1.0f / p.cap : 0.0f;
  // The tuned kernel without a soft-cap keeps the scores as q·k and folds the scale into the
  // exponent's multiplier: one FMA an element instead of a multiply and an FMA.
  const bool fold = kTuned && !(p.cap > 0) && p.scale > 0;
  const float to_log2 = fold ? p.scale * kLog2e : kLog2e;

  for (int k0 = 0, buf = 0; k0 < kv_end; k0 += kKeyTile, buf ^= 1) {
    CpAsyncWait<0>();  // this thread's copies of this tile (the only group in flight)
    // One barrier a tile: after it, every thread's copies of this tile have landed, and every
    // warp is done with the previous tile, whose buffer the next tile's copies then refill while
    // this one is used.
    __syncthreads();
    if (k0 + kKeyTile < kv_end) {
      const size_t next = (buf ^ 1) * L::kBuf;
      LoadKeyTile<DQK, DV, kPasses, kRope>(reinterpret_cast<bf16*>(smem + L::kK + next),
                                           reinterpret_cast<bf16*>(smem + L::kV + next), K, V, p,
                                           k0 + kKeyTile, rope);
      CpAsyncCommit();
    }
    const bf16* sk = reinterpret_cast<const bf16*>(smem + L::kK + buf * L::kBuf);
    const bf16* sv = reinterpret_cast<const bf16*>(smem + L::kV + buf * L::kBuf);
#pragma unroll 1
    for (int pass = 0; pass < kPasses; ++pass) {
      const int kp = k0 + pass * kTile;
      // Else every key of the pass lies above the warp's rows (or past the end).
      if (warp_active && kp <= warp_last) {
        ForwardKeyPass<DQK, DV, kM>(st, qa, sk + pass * kTile * Ld16(DQK),
                                    sv + pass * kTile * Ld16(DV), row, kp, w0, p, inv_cap, fold,
                                    to_log2);
      }
    }
  }
  if (!warp_active) return;  // no barrier follows

#pragma unroll
  for (int m = 0; m < kM; ++m) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float l = st.l_run[m][r];
      l += __shfl_xor_sync(0xffffffffu, l, 1);
      l += __shfl_xor_sync(0xffffffffu, l, 2);
      if (row[m][r] >= S) continue;
      const float inv = 1.0f / l;
      T* orow = out + (long(b) * S + row[m][r]) * p.ldo + long(h) * DV + 2 * t;
#pragma unroll
      for (int n = 0; n < kVTiles; ++n) {
        StorePair(orow + n * 8, st.o[m][n][2 * r] * inv, st.o[m][n][2 * r + 1] * inv);
      }
      // The row max in natural-log units: scale·max(q·k) where the scale was folded.
      const float m_nat = fold ? st.m_run[m][r] * p.scale : st.m_run[m][r];
      if (t == 0) lse[long(pair) * S + row[m][r]] = m_nat + logf(l);
    }
  }
  float raw_max = detail::WarpMax(st.raw_max);
  if (fold) raw_max *= p.scale;  // max(scale·x) = scale·max(x) for scale > 0, bit for bit
  if (lane == 0) detail::AtomicMaxFloat(pair_max + pair, raw_max);
}

}  // namespace moelab::cuda::flash
