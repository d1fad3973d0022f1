// The fused attention forward on `mma.sync` register fragments (kernels/cuda/mma.cuh),
// FlashAttention-2 style: what FlashAttentionForward runs when FlashKernelInUse() is kMma (every
// head-dim pair). Same contract as the wmma FlashForwardKernel (flash_attention_kernels.cuh),
// whose Params, tile loader and 64-key tiles it shares; the difference is that only the Q, K and
// V operand tiles go through shared memory, every elementwise step stays in registers:
//   - grid (B·H, query tiles), heaviest (last) tiles first; 4 warps, each owning kM·16 query rows
//     (kM = MmaRowBlocks: 2 for qk_dim ≤ 64, FlashAttention-2's 128-query tile of 4 warps × 32
//     rows, so that every K/V fragment read from shared memory feeds two tensor-core products and
//     every K/V tile loaded serves 128 queries; 1 for larger dims, whose Q fragments and O
//     accumulators would not fit twice in 255 registers). Why not 8 warps × 16 rows: the same
//     tile, but each warp reads the whole K/V tile for 16 rows, twice the shared-memory traffic
//     per product of 4 warps × 32 (ldmatrix bandwidth, not the tensor cores, bounds this loop).
//   - Q tile → shared memory → each warp's A fragments (all qk_dim/16 k-steps) in registers.
//   - per 64-key tile up to the diagonal: K and V tiles in shared memory as bf16 rows,
//     double-buffered by cp.async (the next tile loads during this one; fp32 inputs go through
//     registers to be rounded), rows padded by 16 bytes so that ldmatrix's eight 16-byte rows
//     fall in distinct banks; B fragments by ldmatrix.x4 (K as stored, V with .trans, so P·V
//     needs no transposed copy of V); S = Q·Kᵀ in C registers; scale, raw max (S_max), mask,
//     soft-cap and the online softmax per row in registers (a row lives in the 4 lanes of a
//     group: its max takes two __shfl_xor_sync, its sum stays per lane until the end); P packed
//     from C straight into A fragments; O += P·V in registers.
//   - tiles skipped: above the block's diagonal (the loop ends there), and per warp the tiles
//     whose keys all lie above its rows; mask compares and the soft-cap branch only in the
//     template variants of the elementwise step that need them.
//   - end: O / l written from registers, LSE per row, the warp's raw max by the atomic max on the
//     float's bits.
// Registers (nvcc 13, -Xptxas -v, sm_90, bf16 inputs): kM = 2: 255 at 64/64, 48/32, 32/32 and
// 168 at 16/16; kM = 1: 254 at 128/128, 192/128 and 168 at 96/64. 255 or 254: 2 blocks (8 warps)
// an SM; 168: 3 blocks. fp32 inputs the same or fewer. No spills (sm_80: 8 bytes at bf16 16/16).
// With RoPE fused (kRope, fp32 q/k, qk_dim = v_dim; flash_rope.cuh): 255 at 64/64, 199 at 32/32,
// 168 at 16/16, 188 at 128/128; no spills.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>
#ifdef MOELAB_CUDA_EMULATION
#include <cstring>
#include <vector>
#endif

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/flash_attention_kernels.cuh"
#include "kernels/cuda/flash_rope.cuh"
#include "kernels/cuda/mma.cuh"

namespace moelab::cuda::flash {

// ldmatrix.x4 (b16): lanes 8m..8m+7 give the 16-byte rows of 8×8 matrix m (m = 0..3, row
// addresses 16-byte aligned, in shared memory); lane l receives in r[m] the pair
// (row l/4, columns 2(l%4), 2(l%4)+1) of matrix m, or with kTrans the pair (rows 2(l%4),
// 2(l%4)+1, column l/4), the lower index in the low half either way. The emulation forms the
// same registers from the same per-lane addresses, so it checks the kernel's address arithmetic.
template <bool kTrans>
__device__ __forceinline__ void LdMatrixX4(uint32_t r[4], const bf16* row) {
#ifndef MOELAB_CUDA_EMULATION
  const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(row));
  if constexpr (kTrans) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
  } else {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
  }
#else
  const int lane = threadIdx.x & 31, g = lane / 4, t = lane % 4;
  if (reinterpret_cast<uintptr_t>(row) % 16 != 0) {
    std::fprintf(stderr, "ldmatrix: row address %p is not 16-byte aligned\n",
                 static_cast<const void*>(row));
    std::abort();
  }
  const bf16** rows = reinterpret_cast<const bf16**>(emu::MmaExchange());  // 32 pointers fit
  rows[lane] = row;
  __syncwarp();
  for (int m = 0; m < 4; ++m) {
    if constexpr (kTrans) {
      r[m] = mma::PackBf16x2(rows[8 * m + 2 * t][g], rows[8 * m + 2 * t + 1][g]);
    } else {
      r[m] = mma::PackBf16x2(rows[8 * m + g][2 * t], rows[8 * m + g][2 * t + 1]);
    }
  }
  __syncwarp();  // every lane has read before the exchange buffer is reused
#endif
}

// 16 bytes global → shared without passing through registers (cp.async.cg: cached in L2 only,
// the tiles are read once per block); zero-filled when !valid (src is then not read, but must
// still be a mapped address). Copies land once a later CpAsyncWait<n> leaves at most n of the
// thread's committed groups in flight, and are visible to the other threads after a barrier.
// The emulation queues each thread's copies by group and performs them at the wait, so a read
// before the right wait sees the garbage (NaN) shared memory the emulation starts a block with.
#ifdef MOELAB_CUDA_EMULATION
struct CpAsyncCopy {
  void* dst;
  const void* src;
  bool valid;
};
inline thread_local std::vector<CpAsyncCopy> cp_async_open;
inline thread_local std::vector<std::vector<CpAsyncCopy>> cp_async_groups;
#endif
__device__ __forceinline__ void CpAsync16(void* dst, const void* src, bool valid) {
#ifndef MOELAB_CUDA_EMULATION
  const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src),
               "r"(valid ? 16 : 0));
#else
  cp_async_open.push_back({dst, src, valid});
#endif
}
__device__ __forceinline__ void CpAsyncCommit() {
#ifndef MOELAB_CUDA_EMULATION
  asm volatile("cp.async.commit_group;\n" ::);
#else
  cp_async_groups.push_back(std::move(cp_async_open));
  cp_async_open.clear();
#endif
}
template <int kInFlight>
__device__ __forceinline__ void CpAsyncWait() {
#ifndef MOELAB_CUDA_EMULATION
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kInFlight));
#else
  while (cp_async_groups.size() > size_t(kInFlight)) {
    for (const CpAsyncCopy& c : cp_async_groups.front()) {
      if (c.valid) {
        std::memcpy(c.dst, c.src, 16);
      } else {
        std::memset(c.dst, 0, 16);
      }
    }
    cp_async_groups.erase(cp_async_groups.begin());
  }
#endif
}

// The device check of the two helpers above (mma_check.cu on the GPU, mma_emulation_test.cc on
// the CPU; the expected registers come from the PTX ISA's description, mma_reference.h): one
// warp copies the 32 rows of 8 bf16 of src (global) into stage (shared, rows 32 bytes apart) by
// cp.async, rows ≥ valid zero-filled (src-size 0), and lane l hands row l (matrix l / 8, row
// l % 8) to ldmatrix.x4 and to ldmatrix.x4.trans: out[8l + m] = its plain register m,
// out[8l + 4 + m] = its transposed one.
__device__ __forceinline__ void LdMatrixProbe(const bf16* src, int valid, bf16* stage,
                                              uint32_t* out) {
  constexpr int kLd = 16;  // elements a staged row: 16-byte aligned and padded, as Ld16's are
  const int lane = threadIdx.x & 31;
  CpAsync16(stage + lane * kLd, src + (lane < valid ? lane : 0) * 8, lane < valid);
  CpAsyncCommit();
  CpAsyncWait<0>();
  __syncwarp();  // every lane's copy landed before any lane's ldmatrix reads it
  uint32_t r[4], rt[4];
  LdMatrixX4<false>(r, stage + lane * kLd);
  LdMatrixX4<true>(rt, stage + lane * kLd);
  for (int m = 0; m < 4; ++m) out[8 * lane + m] = r[m], out[8 * lane + 4 + m] = rt[m];
}

// LoadTile (rows ≥ valid zero) issued as cp.async for bf16 sources; fp32 sources are rounded to
// bf16 through registers (LoadTile itself: synchronous, so they gain no overlap).
template <int D, typename T>
__device__ void LoadTileAsync(bf16* dst, const T* src, long ld, int valid) {
  if constexpr (std::is_same_v<T, bf16>) {
    constexpr int kPerRow = D / 8;
    for (int idx = threadIdx.x; idx < kTile * kPerRow; idx += kThreads) {
      const int r = idx / kPerRow, c = (idx % kPerRow) * 8;
      if (valid > 0) {  // rows past the end zero-filled from row 0's (mapped) address
        CpAsync16(dst + r * Ld16(D) + c, src + (r < valid ? r : 0) * ld + c, r < valid);
      } else {  // the whole tile past the end (the second half of a last 128-query tile)
        *reinterpret_cast<uint4*>(dst + r * Ld16(D) + c) = make_uint4(0, 0, 0, 0);
      }
    }
  } else {
    LoadTile<D>(dst, src, ld, valid);
  }
}

// A q or k tile: LoadTileAsync, or with kRope (fp32 sources) rotated at positions pos0 + row as
// it is loaded (flash_rope.cuh; synchronous, like every fp32 load).
template <int D, bool kRope, typename T>
__device__ __forceinline__ void LoadQkTile(bf16* dst, const T* src, long ld, int valid,
                                           const RopeArgs& rope, int pos0) {
  if constexpr (kRope) {
    static_assert(std::is_same_v<T, float>, "RoPE is fused for fp32 q and k only");
    LoadTileRotated<D>(dst, src, ld, valid, rope, pos0);
  } else {
    LoadTileAsync<D>(dst, src, ld, valid);
  }
}

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

// Shared memory of the mma forward: the Q tile (64·kM rows) and two K and V tiles
// (double-buffered: the next key tile loads while this one is used), bf16 rows of Ld16(D); never
// more than the wmma forward's FwdSmem (FlashAttentionSupported checks that size).
template <int DQK, int DV, int kM = MmaRowBlocks(DQK, DV)>
struct FwdMmaSmem {
  static constexpr size_t kQ = 0;
  static constexpr size_t kKBytes = size_t(kTile) * Ld16(DQK) * 2;
  static constexpr size_t kVBytes = size_t(kTile) * Ld16(DV) * 2;
  static constexpr size_t kK = kQ + kM * kKBytes;  // buffer i at kK + i·kBuf
  static constexpr size_t kV = kK + kKBytes;       // buffer i at kV + i·kBuf
  static constexpr size_t kBuf = kKBytes + kVBytes;
  static constexpr size_t kBytes = kK + 2 * kBuf;
  static_assert(kBytes <= FwdSmem<DQK, DV>::kBytes && kKBytes % 128 == 0 && kVBytes % 128 == 0 &&
                DQK % 16 == 0 && DV % 16 == 0 && (kM == 1 || kM == 2));
};

__device__ __forceinline__ void StorePair(float* p, float x, float y) {
  *reinterpret_cast<float2*>(p) = make_float2(x, y);
}
__device__ __forceinline__ void StorePair(bf16* p, float x, float y) {
  *reinterpret_cast<uint32_t*>(p) = mma::PackBf16x2(x, y);
}

// Scale, raw max, mask and soft-cap of a warp's scores in registers, in place: element e of
// s[m][n] is (row[m][e / 2], key k0 + 8n + 2t + e % 2); masked ones (key after the row, row past
// the end) become −∞ and stay out of the raw max. Templated so that the common tile (below the
// diagonal, no cap) carries neither the mask's compares nor the cap's branch.
template <bool kMasked, bool kCap, int kM>
__device__ __forceinline__ void Logits(float (&s)[kM][kTile / 8][4], const int (&row)[kM][2],
                                       int k0, int t, const Params& p, float inv_cap,
                                       float& raw_max) {
#pragma unroll
  for (int m = 0; m < kM; ++m) {
#pragma unroll
    for (int n = 0; n < kTile / 8; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float x = s[m][n][e] * p.scale;
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

// grid (B·H, ⌈S / (64·kM)⌉ query tiles), heaviest (last) first; kThreads threads. kRope: q and
// k are rotated by RoPE (tables in rope) as their tiles load (flash_rope.cuh).
template <typename T, int DQK, int DV, bool kRope = false, int kM = MmaRowBlocks(DQK, DV)>
__global__ void __launch_bounds__(kThreads)
    FlashForwardMmaKernel(Params p, const T* __restrict__ q, const T* __restrict__ k,
                          const T* __restrict__ v, T* __restrict__ out, float* __restrict__ lse,
                          float* __restrict__ pair_max, RopeArgs rope = {}) {
  using L = FwdMmaSmem<DQK, DV, kM>;
  constexpr int kQTile = kTile * kM, kWarpRows = 16 * kM;
  constexpr int kQSteps = DQK / 16, kKeyTiles = kTile / 8, kVTiles = DV / 8;
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

  // Two groups of copies in flight: Q, then the first K and V tiles.
  const int kv_end = min(q0 + kQTile, S);
#pragma unroll
  for (int m = 0; m < kM; ++m) {
    LoadQkTile<DQK, kRope>(sq + m * kTile * Ld16(DQK), Q + long(q0 + m * kTile) * p.ldq, p.ldq,
                           S - q0 - m * kTile, rope, q0 + m * kTile);
  }
  CpAsyncCommit();
  LoadQkTile<DQK, kRope>(reinterpret_cast<bf16*>(smem + L::kK), K, p.ldk, S, rope, 0);
  LoadTileAsync<DV>(reinterpret_cast<bf16*>(smem + L::kV), V, p.ldv, S);
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

  float o[kM][kVTiles][4];
#pragma unroll
  for (int m = 0; m < kM; ++m) {
#pragma unroll
    for (int n = 0; n < kVTiles; ++n) o[m][n][0] = o[m][n][1] = o[m][n][2] = o[m][n][3] = 0.0f;
  }
  // Per row (of the lane's 2·kM): running max of the capped logits and the lane's part of the
  // running sum; per lane the raw (pre-cap) max.
  float m_run[kM][2], l_run[kM][2], raw_max = -INFINITY;
  const float inv_cap = p.cap > 0 ? 1.0f / p.cap : 0.0f;
#pragma unroll
  for (int m = 0; m < kM; ++m) {
    m_run[m][0] = m_run[m][1] = -INFINITY;
    l_run[m][0] = l_run[m][1] = 0.0f;
  }

  for (int k0 = 0, buf = 0; k0 < kv_end; k0 += kTile, buf ^= 1) {
    CpAsyncWait<0>();  // this thread's copies of this tile (the only group in flight)
    // One barrier a tile: after it, every thread's copies of this tile have landed, and every
    // warp is done with the previous tile, whose buffer the next tile's copies then refill while
    // this one is used.
    __syncthreads();
    if (k0 + kTile < kv_end) {
      const size_t next = (buf ^ 1) * L::kBuf;
      LoadQkTile<DQK, kRope>(reinterpret_cast<bf16*>(smem + L::kK + next),
                             K + long(k0 + kTile) * p.ldk, p.ldk, S - k0 - kTile, rope, k0 + kTile);
      LoadTileAsync<DV>(reinterpret_cast<bf16*>(smem + L::kV + next), V + long(k0 + kTile) * p.ldv,
                        p.ldv, S - k0 - kTile);
      CpAsyncCommit();
    }
    const bf16* sk = reinterpret_cast<const bf16*>(smem + L::kK + buf * L::kBuf);
    const bf16* sv = reinterpret_cast<const bf16*>(smem + L::kV + buf * L::kBuf);
    if (warp_active && k0 <= warp_last) {  // else every key of the tile is above the warp's rows
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
          LdMatrixX4<false>(
              kb, sk + (n * 8 + (mat >> 1) * 8 + mrow) * Ld16(DQK) + kk * 16 + (mat & 1) * 8);
#pragma unroll
          for (int m = 0; m < kM; ++m) {
            mma::MmaBf16(s[m][n], qa[m][kk], kb);
            mma::MmaBf16(s[m][n + 1], qa[m][kk], kb + 2);
          }
        }
      }

      // Logits in registers, masked only where the tile reaches past the warp's first row or the
      // warp has rows past the end; the two branches are uniform across the block.
      const bool masked = k0 + kTile - 1 > w0 || w0 + kWarpRows - 1 >= S;
      if (masked) {
        if (p.cap > 0) {
          Logits<true, true>(s, row, k0, t, p, inv_cap, raw_max);
        } else {
          Logits<true, false>(s, row, k0, t, p, inv_cap, raw_max);
        }
      } else {
        if (p.cap > 0) {
          Logits<false, true>(s, row, k0, t, p, inv_cap, raw_max);
        } else {
          Logits<false, false>(s, row, k0, t, p, inv_cap, raw_max);
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
        // exp(x − base) as exp2(x·log2 e − base·log2 e): one FMA and one ex2 an element.
        float alpha[2], base[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 1));
          tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 2));
          const float m_new = fmaxf(m_run[m][r], tile_max[r]);
          base[r] = m_new == -INFINITY ? 0.0f : m_new * kLog2e;  // nothing unmasked yet: 0
          alpha[r] = Exp2(fmaf(m_run[m][r], kLog2e, -base[r]));  // 0 on the row's first tile
          m_run[m][r] = m_new;
          l_run[m][r] *= alpha[r];
        }
#pragma unroll
        for (int n = 0; n < kVTiles; ++n) {
          o[m][n][0] *= alpha[0], o[m][n][1] *= alpha[0];
          o[m][n][2] *= alpha[1], o[m][n][3] *= alpha[1];
        }
        // P = exp2(x − base), summed in fp32 (per lane until the end) and packed to bf16.
#pragma unroll
        for (int kk = 0; kk < kTile / 16; ++kk) {
#pragma unroll
          for (int half = 0; half < 2; ++half) {
            const float* c = s[m][2 * kk + half];
            const float e0 = Exp2(fmaf(c[0], kLog2e, -base[0]));
            const float e1 = Exp2(fmaf(c[1], kLog2e, -base[0]));
            const float e2 = Exp2(fmaf(c[2], kLog2e, -base[1]));
            const float e3 = Exp2(fmaf(c[3], kLog2e, -base[1]));
            l_run[m][0] += e0 + e1, l_run[m][1] += e2 + e3;
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
          LdMatrixX4<true>(
              vb, sv + (kk * 16 + (mat & 1) * 8 + mrow) * Ld16(DV) + n * 8 + (mat >> 1) * 8);
#pragma unroll
          for (int m = 0; m < kM; ++m) {
            mma::MmaBf16(o[m][n], pa[m][kk], vb);
            mma::MmaBf16(o[m][n + 1], pa[m][kk], vb + 2);
          }
        }
      }
    }
  }
  if (!warp_active) return;  // no barrier follows

#pragma unroll
  for (int m = 0; m < kM; ++m) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float l = l_run[m][r];
      l += __shfl_xor_sync(0xffffffffu, l, 1);
      l += __shfl_xor_sync(0xffffffffu, l, 2);
      if (row[m][r] >= S) continue;
      const float inv = 1.0f / l;
      T* orow = out + (long(b) * S + row[m][r]) * p.ldo + long(h) * DV + 2 * t;
#pragma unroll
      for (int n = 0; n < kVTiles; ++n) {
        StorePair(orow + n * 8, o[m][n][2 * r] * inv, o[m][n][2 * r + 1] * inv);
      }
      if (t == 0) lse[long(pair) * S + row[m][r]] = m_run[m][r] + logf(l);
    }
  }
  raw_max = detail::WarpMax(raw_max);
  if (lane == 0) detail::AtomicMaxFloat(pair_max + pair, raw_max);
}

}  // namespace moelab::cuda::flash
