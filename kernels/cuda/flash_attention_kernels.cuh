// Device code of the fused attention (kernels/cuda/flash_attention.h): the forward, the
// backward's D = rowsum(dO ∘ O), dK/dV and dQ kernels. Internal header, included by
// flash_attention.cu and by tests/cuda_kernels/flash_emulation_test.cc, which runs these very
// kernels on the CPU under tests/cuda_kernels/emulation/cuda_emulation.h.
//
// Why wmma and not raw mma.sync / wgmma: the fragments' element layout is opaque, so every
// elementwise step (masking, soft-cap, online softmax, dS) goes through a per-warp fp32 tile in
// shared memory whose layout we own. That costs shared-memory traffic but leaves no hand-derived
// register layout to get wrong on a machine where nothing can be run (see docs/cuda.md).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <mma.h>

#include <cstdint>

#include "kernels/cuda/attention.h"
#include "kernels/cuda/common.cuh"

// The block's dynamic shared memory (the emulation defines its own before including this).
#ifndef MOELAB_FLASH_SMEM
#define MOELAB_FLASH_SMEM(name) extern __shared__ __align__(128) unsigned char name[]
#endif

namespace moelab::cuda::flash {

using bf16 = __nv_bfloat16;
namespace wmma = nvcuda::wmma;

constexpr int kTile = 64;  // query rows and key columns per tile
constexpr int kWarps = 4;  // each warp owns 16 rows of the tile
constexpr int kThreads = kWarps * 32;
constexpr int kLdScore = kTile + 4;          // fp32 score tiles: rows of 68 floats
constexpr int kLdProb = kTile + 8;           // bf16 P / dS tiles: rows of 72 bf16
constexpr int Ld16(int d) { return d + 8; }  // bf16 operand tiles: 16-byte row padding

using FragA = wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major>;
using FragBRow = wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major>;
using FragBCol = wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major>;
using FragC = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;

struct Params {
  int batch, seq, heads, kv_heads;
  long ldq, ldk, ldv, ldo;
  float scale, cap;  // cap 0: no soft-cap
};

inline Params MakeParams(const AttentionDims& a) {
  Params p;
  p.batch = a.batch, p.seq = a.seq, p.heads = a.heads, p.kv_heads = a.kv_heads;
  p.ldq = a.ldq, p.ldk = a.ldk, p.ldv = a.ldv, p.ldo = a.ldo;
  p.scale = static_cast<float>(a.scale), p.cap = static_cast<float>(a.softcap);
  return p;
}

// 8 consecutive elements as 8 bf16 in one 16-byte word (fp32 rounded to nearest even).
__device__ __forceinline__ uint4 Load8(const bf16* p) { return *reinterpret_cast<const uint4*>(p); }
__device__ __forceinline__ uint4 Load8(const float* p) {
  const float4 lo = reinterpret_cast<const float4*>(p)[0];
  const float4 hi = reinterpret_cast<const float4*>(p)[1];
  const __nv_bfloat162 b[4] = {__floats2bfloat162_rn(lo.x, lo.y), __floats2bfloat162_rn(lo.z, lo.w),
                               __floats2bfloat162_rn(hi.x, hi.y),
                               __floats2bfloat162_rn(hi.z, hi.w)};
  uint4 r;
  r.x = reinterpret_cast<const unsigned&>(b[0]);
  r.y = reinterpret_cast<const unsigned&>(b[1]);
  r.z = reinterpret_cast<const unsigned&>(b[2]);
  r.w = reinterpret_cast<const unsigned&>(b[3]);
  return r;
}

// Rows [0, kTile) × columns [0, D) of src (row stride ld) into a bf16 shared tile of row stride
// Ld16(D); rows ≥ valid are zero (a garbage row could hold Inf/NaN, and 0·NaN is NaN).
template <int D, typename T>
__device__ void LoadTile(bf16* dst, const T* src, long ld, int valid) {
  constexpr int kPerRow = D / 8;
  for (int idx = threadIdx.x; idx < kTile * kPerRow; idx += kThreads) {
    const int r = idx / kPerRow, c = (idx % kPerRow) * 8;
    const uint4 x = r < valid ? Load8(src + r * ld + c) : make_uint4(0, 0, 0, 0);
    *reinterpret_cast<uint4*>(dst + r * Ld16(D) + c) = x;
  }
}

// 64 floats of a per-row vector (lse or D) for rows row0.. of a pair; 0 past the sequence.
__device__ inline void LoadRowVec(float* dst, const float* src, int valid) {
  for (int r = threadIdx.x; r < kTile; r += kThreads) dst[r] = r < valid ? src[r] : 0.0f;
}

// Scores of one warp: C[16, 64] = A[16, D] · B[64, D]ᵀ, A and B row-major bf16 tiles with stride
// Ld16(D), stored row-major into c (stride kLdScore). Returns nothing live: the fragments die here.
template <int D>
__device__ void ScoresTile(const bf16* a, const bf16* b, float* c) {
  FragC acc[kTile / 16];
#pragma unroll
  for (int n = 0; n < kTile / 16; ++n) wmma::fill_fragment(acc[n], 0.0f);
#pragma unroll
  for (int kk = 0; kk < D; kk += 16) {
    FragA fa;
    wmma::load_matrix_sync(fa, a + kk, Ld16(D));
#pragma unroll
    for (int n = 0; n < kTile / 16; ++n) {
      FragBCol fb;  // Bᵀ as a column-major [D, 64] operand is B row-major
      wmma::load_matrix_sync(fb, b + n * 16 * Ld16(D) + kk, Ld16(D));
      wmma::mma_sync(acc[n], fa, fb, acc[n]);
    }
  }
#pragma unroll
  for (int n = 0; n < kTile / 16; ++n) {
    wmma::store_matrix_sync(c + n * 16, acc[n], kLdScore, wmma::mem_row_major);
  }
}

// acc[N] (a [16, 16·N] tile) += A[16, 64] (bf16, stride kLdProb) · B[64, 16·N] (bf16 row-major,
// stride ldb).
template <int N>
__device__ void AccumulateTile(FragC (&acc)[N], const bf16* a, const bf16* b, int ldb) {
#pragma unroll
  for (int kk = 0; kk < kTile; kk += 16) {
    FragA fa;
    wmma::load_matrix_sync(fa, a + kk, kLdProb);
#pragma unroll
    for (int n = 0; n < N; ++n) {
      FragBRow fb;
      wmma::load_matrix_sync(fb, b + kk * ldb + n * 16, ldb);
      wmma::mma_sync(acc[n], fa, fb, acc[n]);
    }
  }
}

// Writes mul·acc (a warp's [16, 16·N] tile) to rows row0.. (those < seq) of dst (stride ld),
// through the warp's fp32 staging tile (16 × kLdScore), 4 fragments at a time.
template <int N>
__device__ void StoreRows(FragC (&acc)[N], float mul, float* stage, float* dst, long ld, int row0,
                          int seq) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int n0 = 0; n0 < N; n0 += 4) {
#pragma unroll
    for (int n = n0; n < n0 + 4 && n < N; ++n) {
#pragma unroll
      for (int t = 0; t < acc[n].num_elements; ++t) acc[n].x[t] *= mul;
      wmma::store_matrix_sync(stage + (n - n0) * 16, acc[n], kLdScore, wmma::mem_row_major);
    }
    __syncwarp();
    const int cols = (N - n0 < 4 ? N - n0 : 4) * 16;
    for (int idx = lane; idx < 16 * cols; idx += 32) {
      const int r = idx / cols, c = idx % cols;
      if (row0 + r < seq) dst[(row0 + r) * ld + n0 * 16 + c] = stage[r * kLdScore + c];
    }
    __syncwarp();
  }
}

__device__ __forceinline__ void StoreOut(float* p, float x) { *p = x; }
__device__ __forceinline__ void StoreOut(bf16* p, float x) { *p = __float2bfloat16(x); }

// Shared-memory layout of the forward block (byte offsets; every region 128-byte aligned).
template <int DQK, int DV>
struct FwdSmem {
  static constexpr size_t kQ = 0;
  static constexpr size_t kK = kQ + size_t(kTile) * Ld16(DQK) * 2;
  static constexpr size_t kV = kK + size_t(kTile) * Ld16(DQK) * 2;
  static constexpr size_t kS = kV + size_t(kTile) * Ld16(DV) * 2;  // per warp [16, kLdScore] f32
  static constexpr size_t kP = kS + size_t(kWarps) * 16 * kLdScore * 4;  // [16, kLdProb] bf16
  static constexpr size_t kO = kP + size_t(kWarps) * 16 * kLdProb * 2;   // [16, DV + 4] f32
  static constexpr size_t kBytes = kO + size_t(kWarps) * 16 * (DV + 4) * 4;
  // wmma needs 32-byte aligned tile pointers: every region and per-warp slice starts on one.
  static_assert(kK % 128 == 0 && kV % 128 == 0 && kS % 128 == 0 && kP % 128 == 0 && kO % 128 == 0 &&
                (16 * (DV + 4) * 4) % 32 == 0 && DQK % 16 == 0 && DV % 16 == 0);
};

// grid (B·H, query tiles), heaviest tiles (the last, with the most keys) first.
template <typename T, int DQK, int DV>
__global__ void __launch_bounds__(kThreads)
    FlashForwardKernel(Params p, const T* __restrict__ q, const T* __restrict__ k,
                       const T* __restrict__ v, T* __restrict__ out, float* __restrict__ lse,
                       float* __restrict__ pair_max) {
  using L = FwdSmem<DQK, DV>;
  constexpr int kLdO = DV + 4;
  MOELAB_FLASH_SMEM(smem);
  bf16* sq = reinterpret_cast<bf16*>(smem + L::kQ);
  bf16* sk = reinterpret_cast<bf16*>(smem + L::kK);
  bf16* sv = reinterpret_cast<bf16*>(smem + L::kV);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  float* ss = reinterpret_cast<float*>(smem + L::kS) + warp * 16 * kLdScore;
  bf16* sp = reinterpret_cast<bf16*>(smem + L::kP) + warp * 16 * kLdProb;
  float* so = reinterpret_cast<float*>(smem + L::kO) + warp * 16 * kLdO;

  const int S = p.seq, pair = blockIdx.x, b = pair / p.heads, h = pair % p.heads;
  const int g = h / (p.heads / p.kv_heads);
  const int q0 = (gridDim.y - 1 - blockIdx.y) * kTile;
  const T* Q = q + long(b) * S * p.ldq + long(h) * DQK;
  const T* K = k + long(b) * S * p.ldk + long(g) * DQK;
  const T* V = v + long(b) * S * p.ldv + long(g) * DV;

  LoadTile<DQK>(sq, Q + q0 * p.ldq, p.ldq, S - q0);
  for (int idx = lane; idx < 16 * DV; idx += 32) so[(idx / DV) * kLdO + idx % DV] = 0.0f;

  // Lane layout of the elementwise steps: row r = lane / 2 of the warp's 16, columns
  // half·32 .. half·32 + 31 of the key tile (and half·DV/2.. of the output).
  const int r = lane >> 1, half = lane & 1;
  const int w0 = q0 + warp * 16, i = w0 + r;  // the lane's query row
  const bool warp_active = w0 < S;
  const int warp_last = min(w0 + 15, S - 1);
  float m_run = -INFINITY, l_run = 0.0f, raw_max = -INFINITY;

  const int kv_end = min(q0 + kTile, S);
  for (int k0 = 0; k0 < kv_end; k0 += kTile) {
    __syncthreads();  // the previous tile's K/V (and, first time, nothing) are no longer read
    LoadTile<DQK>(sk, K + k0 * p.ldk, p.ldk, S - k0);
    LoadTile<DV>(sv, V + k0 * p.ldv, p.ldv, S - k0);
    __syncthreads();
    if (!warp_active || k0 > warp_last) continue;  // every key of the tile is masked for this warp

    ScoresTile<DQK>(sq + warp * 16 * Ld16(DQK), sk, ss);
    __syncwarp();
    float* srow = ss + r * kLdScore + half * 32;
    float tile_max = -INFINITY;
#pragma unroll 8
    for (int c = 0; c < 32; ++c) {
      const int j = k0 + half * 32 + c;
      float s = srow[c] * p.scale;
      if (j <= i && j < S && i < S) {
        raw_max = fmaxf(raw_max, s);
        if (p.cap > 0) s = p.cap * tanhf(s / p.cap);
        tile_max = fmaxf(tile_max, s);
      } else {
        s = -INFINITY;
      }
      srow[c] = s;
    }
    tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
    const float m_new = fmaxf(m_run, tile_max);
    const float base = m_new == -INFINITY ? 0.0f : m_new;  // a row with nothing unmasked yet
    const float alpha = __expf(m_run - base);              // 0 on the first tile
    float sum = 0.0f;
    bf16* prow = sp + r * kLdProb + half * 32;
#pragma unroll 8
    for (int c = 0; c < 32; ++c) {
      const float e = __expf(srow[c] - base);  // masked: exp(−inf) = 0
      sum += e;
      prow[c] = __float2bfloat16(e);
    }
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    l_run = l_run * alpha + sum;
    m_run = m_new;
    for (int c = half * (DV / 2); c < (half + 1) * (DV / 2); ++c) so[r * kLdO + c] *= alpha;
    __syncwarp();
#pragma unroll
    for (int n = 0; n < DV / 16; ++n) {
      FragC o[1];
      wmma::load_matrix_sync(o[0], so + n * 16, kLdO, wmma::mem_row_major);
      AccumulateTile<1>(o, sp, sv + n * 16, Ld16(DV));
      wmma::store_matrix_sync(so + n * 16, o[0], kLdO, wmma::mem_row_major);
    }
    __syncwarp();
  }
  if (!warp_active) return;
  if (i < S) {
    const float inv = 1.0f / l_run;
    T* orow = out + (long(b) * S + i) * p.ldo + long(h) * DV;
    for (int c = half * (DV / 2); c < (half + 1) * (DV / 2); ++c) {
      StoreOut(orow + c, so[r * kLdO + c] * inv);
    }
    if (half == 0) lse[long(pair) * S + i] = m_run + logf(l_run);
  }
  raw_max = detail::WarpMax(raw_max);
  if (lane == 0) detail::AtomicMaxFloat(pair_max + pair, raw_max);
}

// P and dS of one warp's [16, 64] tile (row-major in ss and sdp, fp32), for the elementwise
// layout: the tile's row of this lane is `row`, its columns col0 .. col0 + 31. The tile's (row, c)
// is the logit of query i(row, c) and key j(row, c), given by the caller as (i0 + di·c, j0 + dj·c)
// so that the same code serves the dK/dV kernel (rows are keys) and the dQ kernel (rows are
// queries). lse_d: the query's (lse, D) by its index in the query tile.
__device__ __forceinline__ void ProbsAndGrads(const Params& p, const float* srow,
                                              const float* dprow, bf16* prow, bf16* dsrow, int i0,
                                              int di, int j0, int dj, int q_base, const float* slse,
                                              const float* sd) {
#pragma unroll 4
  for (int c = 0; c < 32; ++c) {
    const int i = i0 + di * c, j = j0 + dj * c;
    float pr = 0.0f, ds = 0.0f;
    if (j <= i && i < p.seq) {  // j ≤ i < seq implies j < seq
      float s = srow[c] * p.scale, dcap = 1.0f;
      if (p.cap > 0) {
        const float t = tanhf(s / p.cap);
        s = p.cap * t;
        dcap = 1.0f - t * t;
      }
      pr = __expf(s - slse[i - q_base]);
      ds = pr * (dprow[c] - sd[i - q_base]) * dcap;
    }
    if (prow) prow[c] = __float2bfloat16(pr);
    dsrow[c] = __float2bfloat16(ds);
  }
}

// Shared memory of both backward kernels: the four operand tiles, lse and D of the query tile,
// and per warp the fp32 S and dP tiles and the bf16 P and dS tiles.
template <int DQK, int DV>
struct BwdSmem {
  static constexpr size_t kQ = 0;
  static constexpr size_t kDo = kQ + size_t(kTile) * Ld16(DQK) * 2;
  static constexpr size_t kK = kDo + size_t(kTile) * Ld16(DV) * 2;
  static constexpr size_t kV = kK + size_t(kTile) * Ld16(DQK) * 2;
  static constexpr size_t kLse = kV + size_t(kTile) * Ld16(DV) * 2;
  static constexpr size_t kD = kLse + kTile * 4;
  static constexpr size_t kS = kD + kTile * 4;
  static constexpr size_t kDp = kS + size_t(kWarps) * 16 * kLdScore * 4;
  static constexpr size_t kP = kDp + size_t(kWarps) * 16 * kLdScore * 4;
  static constexpr size_t kDs = kP + size_t(kWarps) * 16 * kLdProb * 2;
  static constexpr size_t kBytes = kDs + size_t(kWarps) * 16 * kLdProb * 2;
  static_assert(kDo % 128 == 0 && kK % 128 == 0 && kV % 128 == 0 && kLse % 128 == 0 &&
                kS % 128 == 0 && kDp % 128 == 0 && kP % 128 == 0 && kDs % 128 == 0);
};

// Pointers into the backward kernels' shared memory (BwdSmem): the block's Q, dO, K, V tiles and
// its lse and D rows, and warp `warp`'s own S, dP, P and dS tiles.
template <int DQK, int DV>
struct BwdTiles {
  using L = BwdSmem<DQK, DV>;
  __device__ __forceinline__ BwdTiles(unsigned char* smem, int warp)
      : sq(reinterpret_cast<bf16*>(smem + L::kQ)),
        sdo(reinterpret_cast<bf16*>(smem + L::kDo)),
        sk(reinterpret_cast<bf16*>(smem + L::kK)),
        sv(reinterpret_cast<bf16*>(smem + L::kV)),
        slse(reinterpret_cast<float*>(smem + L::kLse)),
        sd(reinterpret_cast<float*>(smem + L::kD)),
        ss(reinterpret_cast<float*>(smem + L::kS) + warp * 16 * kLdScore),
        sdp(reinterpret_cast<float*>(smem + L::kDp) + warp * 16 * kLdScore),
        sp(reinterpret_cast<bf16*>(smem + L::kP) + warp * 16 * kLdProb),
        sds(reinterpret_cast<bf16*>(smem + L::kDs) + warp * 16 * kLdProb) {}
  bf16 *const sq, *const sdo, *const sk, *const sv;
  float *const slse, *const sd, *const ss, *const sdp;
  bf16 *const sp, *const sds;
};

// D[pair·S + i] = Σ_c dO[b, i, h·DV + c]·O[b, i, h·DV + c]; one warp per (pair, i).
template <typename T>
__global__ void RowDotKernel(Params p, int dv, const T* __restrict__ out,
                             const T* __restrict__ dout, float* __restrict__ d) {
  const long row = (long(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (row >= long(p.batch) * p.heads * p.seq) return;
  const int i = static_cast<int>(row % p.seq);
  const long pair = row / p.seq;
  const int b = static_cast<int>(pair / p.heads), h = static_cast<int>(pair % p.heads);
  const long at = (long(b) * p.seq + i) * p.ldo + long(h) * dv;
  float acc = 0.0f;
  for (int c = lane; c < dv; c += 32) {
    acc += detail::ToFloat(out[at + c]) * detail::ToFloat(dout[at + c]);
  }
  acc = detail::WarpSum(acc);
  if (lane == 0) d[row] = acc;
}

// dK, dV of one 64-key tile of one kv head: grid (B·kv_heads, key tiles). Warp w owns keys
// k0 + 16w ..; its fragments accumulate over the group's query heads (in head order) and the
// query tiles from the diagonal on, so the sums have a fixed order.
template <typename T, int DQK, int DV>
__global__ void __launch_bounds__(kThreads)
    FlashBackwardKvKernel(Params p, const T* __restrict__ q, const T* __restrict__ k,
                          const T* __restrict__ v, const float* __restrict__ lse,
                          const float* __restrict__ dvec, const T* __restrict__ dout,
                          float* __restrict__ dk, float* __restrict__ dv) {
  MOELAB_FLASH_SMEM(smem);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const auto [sq, sdo, sk, sv, slse, sd, ss, sdp, sp, sds] = BwdTiles<DQK, DV>(smem, warp);

  const int S = p.seq, group = p.heads / p.kv_heads;
  const int b = blockIdx.x / p.kv_heads, g = blockIdx.x % p.kv_heads;
  const int k0 = blockIdx.y * kTile;  // tile 0 has the most query tiles: scheduled first
  LoadTile<DQK>(sk, k + (long(b) * S + k0) * p.ldk + long(g) * DQK, p.ldk, S - k0);
  LoadTile<DV>(sv, v + (long(b) * S + k0) * p.ldv + long(g) * DV, p.ldv, S - k0);

  FragC dk_acc[DQK / 16], dv_acc[DV / 16];
#pragma unroll
  for (int n = 0; n < DQK / 16; ++n) wmma::fill_fragment(dk_acc[n], 0.0f);
#pragma unroll
  for (int n = 0; n < DV / 16; ++n) wmma::fill_fragment(dv_acc[n], 0.0f);

  const int r = lane >> 1, half = lane & 1;
  const int w0 = k0 + warp * 16;  // the warp's first key
  const bool warp_active = w0 < S;
  for (int h = g * group; h < (g + 1) * group; ++h) {
    const long pair = long(b) * p.heads + h;
    for (int q0 = k0; q0 < S; q0 += kTile) {
      __syncthreads();  // the previous query tile is no longer read
      LoadTile<DQK>(sq, q + (long(b) * S + q0) * p.ldq + long(h) * DQK, p.ldq, S - q0);
      LoadTile<DV>(sdo, dout + (long(b) * S + q0) * p.ldo + long(h) * DV, p.ldo, S - q0);
      LoadRowVec(slse, lse + pair * S + q0, S - q0);
      LoadRowVec(sd, dvec + pair * S + q0, S - q0);
      __syncthreads();
      if (!warp_active) continue;
      // Sᵀ = K_w·Qᵀ and dPᵀ = V_w·dOᵀ: rows are the warp's keys, columns the tile's queries.
      ScoresTile<DQK>(sk + warp * 16 * Ld16(DQK), sq, ss);
      ScoresTile<DV>(sv + warp * 16 * Ld16(DV), sdo, sdp);
      __syncwarp();
      const int col0 = half * 32;
      ProbsAndGrads(p, ss + r * kLdScore + col0, sdp + r * kLdScore + col0, sp + r * kLdProb + col0,
                    sds + r * kLdProb + col0, q0 + col0, 1, w0 + r, 0, q0, slse, sd);
      __syncwarp();
      AccumulateTile<DV / 16>(dv_acc, sp, sdo, Ld16(DV));    // dV += Pᵀ·dO
      AccumulateTile<DQK / 16>(dk_acc, sds, sq, Ld16(DQK));  // dK += dSᵀ·Q
    }
  }
  if (!warp_active) return;
  StoreRows<DQK / 16>(dk_acc, p.scale, ss, dk + long(b) * S * p.ldk + long(g) * DQK, p.ldk, w0, S);
  StoreRows<DV / 16>(dv_acc, 1.0f, ss, dv + long(b) * S * p.ldv + long(g) * DV, p.ldv, w0, S);
}

// dQ of one 64-query tile of one head: grid (B·H, query tiles), heaviest first. Warp w owns
// queries q0 + 16w ..; its fragments accumulate over the key tiles up to the diagonal in order.
template <typename T, int DQK, int DV>
__global__ void __launch_bounds__(kThreads)
    FlashBackwardQKernel(Params p, const T* __restrict__ q, const T* __restrict__ k,
                         const T* __restrict__ v, const float* __restrict__ lse,
                         const float* __restrict__ dvec, const T* __restrict__ dout,
                         float* __restrict__ dq) {
  MOELAB_FLASH_SMEM(smem);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  // No P tile here: dQ needs dS only.
  [[maybe_unused]] const auto [sq, sdo, sk, sv, slse, sd, ss, sdp, sp, sds] =
      BwdTiles<DQK, DV>(smem, warp);

  const int S = p.seq, pair = blockIdx.x, b = pair / p.heads, h = pair % p.heads;
  const int g = h / (p.heads / p.kv_heads);
  const int q0 = (gridDim.y - 1 - blockIdx.y) * kTile;
  LoadTile<DQK>(sq, q + (long(b) * S + q0) * p.ldq + long(h) * DQK, p.ldq, S - q0);
  LoadTile<DV>(sdo, dout + (long(b) * S + q0) * p.ldo + long(h) * DV, p.ldo, S - q0);
  LoadRowVec(slse, lse + long(pair) * S + q0, S - q0);
  LoadRowVec(sd, dvec + long(pair) * S + q0, S - q0);

  FragC dq_acc[DQK / 16];
#pragma unroll
  for (int n = 0; n < DQK / 16; ++n) wmma::fill_fragment(dq_acc[n], 0.0f);
  const int r = lane >> 1, half = lane & 1;
  const int w0 = q0 + warp * 16;
  const bool warp_active = w0 < S;
  const int warp_last = min(w0 + 15, S - 1);
  const int kv_end = min(q0 + kTile, S);
  for (int k0 = 0; k0 < kv_end; k0 += kTile) {
    __syncthreads();
    LoadTile<DQK>(sk, k + (long(b) * S + k0) * p.ldk + long(g) * DQK, p.ldk, S - k0);
    LoadTile<DV>(sv, v + (long(b) * S + k0) * p.ldv + long(g) * DV, p.ldv, S - k0);
    __syncthreads();
    if (!warp_active || k0 > warp_last) continue;
    ScoresTile<DQK>(sq + warp * 16 * Ld16(DQK), sk, ss);
    ScoresTile<DV>(sdo + warp * 16 * Ld16(DV), sv, sdp);
    __syncwarp();
    const int col0 = half * 32;
    ProbsAndGrads(p, ss + r * kLdScore + col0, sdp + r * kLdScore + col0, nullptr,
                  sds + r * kLdProb + col0, w0 + r, 0, k0 + col0, 1, q0, slse, sd);
    __syncwarp();
    AccumulateTile<DQK / 16>(dq_acc, sds, sk, Ld16(DQK));  // dQ += dS·K
  }
  if (!warp_active) return;
  StoreRows<DQK / 16>(dq_acc, p.scale, ss, dq + long(b) * S * p.ldq + long(h) * DQK, p.ldq, w0, S);
}

}  // namespace moelab::cuda::flash
