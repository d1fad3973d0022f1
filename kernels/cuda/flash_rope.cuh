// RoPE fused into the mma attention kernels (flash_forward_mma.cuh, flash_backward_mma.cuh;
// FlashAttentionForward / Backward with a FlashRope): q and k arrive un-rotated in fp32 and are
// rotated as their tiles are loaded, with the rope kernel's own arithmetic (rope::RotatePair) in
// fp32 and then rounded to bf16, so that the tiles hold the bits that RopeApplyQk followed by
// the plain load would have put there; the backward's dq and dk leave through the inverse
// rotation (−sin), again RotatePair on the fp32 values the plain kernels would have written.
// Rotate-half convention, rot_dim = the qk head dim D (non-MLA attention): pair i of a head is
// (x_i, x_{i + D/2}); the position of row i of a sequence is i; tables [seq, D/2] in fp32.
// Internal header of kernels/cuda/flash_attention.cu and the emulation tests.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/flash_attention_kernels.cuh"
#include "kernels/cuda/rope_kernels.cuh"

namespace moelab::cuda::flash {

// The kernels' rope argument: null tables in the kernels instantiated without rope.
struct RopeArgs {
  const float* cos = nullptr;  // [seq, D/2]
  const float* sin = nullptr;
};

// Two fp32 values rounded to bf16 (nearest even, as Load8 rounds them), x in the low half.
__device__ __forceinline__ uint32_t Bf16x2Bits(float x, float y) {
  const __nv_bfloat162 b = __floats2bfloat162_rn(x, y);
  return reinterpret_cast<const uint32_t&>(b);
}

// Columns c..c+7 (lo) and c+D/2..c+D/2+7 (hi) of one fp32 row, rotated at the position whose
// table rows are cs, sn (pairs c..c+7), rounded to bf16. c a multiple of 8 below D/2. Four pairs
// at a time, packed as soon as rotated: fewer live registers inside the backward's loops.
template <int D>
__device__ __forceinline__ void Load8Rotated(const float* row, int c, const float* cs,
                                             const float* sn, uint4* lo, uint4* hi) {
  uint32_t wl[4], wh[4];
#pragma unroll
  for (int h = 0; h < 2; ++h) {  // 16-byte loads: rows and tables are 16-byte aligned
    const float4 av = reinterpret_cast<const float4*>(row + c)[h];
    const float4 bv = reinterpret_cast<const float4*>(row + c + D / 2)[h];
    const float4 cv = reinterpret_cast<const float4*>(cs + c)[h];
    const float4 sv = reinterpret_cast<const float4*>(sn + c)[h];
    float a[4] = {av.x, av.y, av.z, av.w}, b[4] = {bv.x, bv.y, bv.z, bv.w};
    const float co[4] = {cv.x, cv.y, cv.z, cv.w}, si[4] = {sv.x, sv.y, sv.z, sv.w};
#pragma unroll
    for (int e = 0; e < 4; ++e) rope::RotatePair(a[e], b[e], co[e], si[e]);
    wl[2 * h] = Bf16x2Bits(a[0], a[1]), wl[2 * h + 1] = Bf16x2Bits(a[2], a[3]);
    wh[2 * h] = Bf16x2Bits(b[0], b[1]), wh[2 * h + 1] = Bf16x2Bits(b[2], b[3]);
  }
  *lo = make_uint4(wl[0], wl[1], wl[2], wl[3]);
  *hi = make_uint4(wh[0], wh[1], wh[2], wh[3]);
}

// Rows r, r + 1 (x[0], x[1]) of an fp32 q or k tile, each rotated at its position pos0 + row,
// chunks c (x[.][0]) and c + D/2 (x[.][1]) in bf16; rows ≥ valid zero. A thread that takes both
// chunks of a pair reads every value from global memory once.
template <int D>
__device__ __forceinline__ void LoadRowPairRotated(const float* src, long ld, int valid,
                                                   const RopeArgs& rope, int pos0, int r, int c,
                                                   uint4 (&x)[2][2]) {
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    if (r + i < valid) {
      const long pos = pos0 + r + i;
      Load8Rotated<D>(src + (r + i) * ld, c, rope.cos + pos * (D / 2), rope.sin + pos * (D / 2),
                      &x[i][0], &x[i][1]);
    } else {
      x[i][0] = x[i][1] = make_uint4(0, 0, 0, 0);
    }
  }
}

// LoadTile (flash_attention_kernels.cuh) of an fp32 q or k tile, row r rotated at position
// pos0 + r: rows [0, kTile) × columns [0, D) into dst (stride Ld16(D)), rows ≥ valid zero.
// Thread → (row, chunk pair), the chunks fastest: a warp reads whole rows.
template <int D>
__device__ void LoadTileRotated(bf16* dst, const float* src, long ld, int valid,
                                const RopeArgs& rope, int pos0) {
  static_assert(D % 16 == 0, "pairs of 8-column chunks");
  constexpr int kPairs = D / 16;
  for (int idx = threadIdx.x; idx < kTile * kPairs; idx += kThreads) {
    const int r = idx / kPairs, c = (idx % kPairs) * 8;
    uint4 lo = make_uint4(0, 0, 0, 0), hi = lo;
    if (r < valid) {
      const long pos = pos0 + r;
      Load8Rotated<D>(src + r * ld, c, rope.cos + pos * (D / 2), rope.sin + pos * (D / 2), &lo,
                      &hi);
    }
    *reinterpret_cast<uint4*>(dst + r * Ld16(D) + c) = lo;
    *reinterpret_cast<uint4*>(dst + r * Ld16(D) + c + D / 2) = hi;
  }
}

// One row of a warp's fp32 gradient accumulators leaving through the inverse rotation: acc[n][e]
// an m16n8 C fragment set over D columns (n-tile n, element e: column 8n + 2t + (e odd), row
// half e / 2); the row of half `half`, at position pos, is written to dst[0, D) as R⁻¹ of mul·acc
// (the values the plain kernel writes, then the rope kernel's inverse, bit for bit). Column i
// and its partner i + D/2 sit in the same lane and element, n-tiles D/16 apart: no shuffles.
template <int D>
__device__ __forceinline__ void StoreRowInverseRotated(float* dst, const float (&acc)[D / 8][4],
                                                       int half, float mul, const RopeArgs& rope,
                                                       int pos, int t) {
  constexpr int kHalfTiles = D / 16;
  const float* cs = rope.cos + long(pos) * (D / 2);
  const float* sn = rope.sin + long(pos) * (D / 2);
#pragma unroll
  for (int n = 0; n < kHalfTiles; ++n) {
    const int i = 8 * n + 2 * t;
    const float2 c = *reinterpret_cast<const float2*>(cs + i);
    const float2 s = *reinterpret_cast<const float2*>(sn + i);
    float a0 = mul * acc[n][2 * half], b0 = mul * acc[n + kHalfTiles][2 * half];
    float a1 = mul * acc[n][2 * half + 1], b1 = mul * acc[n + kHalfTiles][2 * half + 1];
    rope::RotatePair(a0, b0, c.x, -s.x);
    rope::RotatePair(a1, b1, c.y, -s.y);
    dst[i] = a0, dst[i + 1] = a1;
    dst[i + D / 2] = b0, dst[i + D / 2 + 1] = b1;
  }
}

}  // namespace moelab::cuda::flash
