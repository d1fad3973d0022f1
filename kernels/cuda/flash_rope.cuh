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

// 8 fp32 values rounded to 8 bf16 in one 16-byte word (nearest even, as Load8 rounds them).
__device__ __forceinline__ uint4 PackBf16x8(const float (&x)[8]) {
  uint32_t w[4];
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const __nv_bfloat162 b = __floats2bfloat162_rn(x[2 * e], x[2 * e + 1]);
    w[e] = reinterpret_cast<const uint32_t&>(b);
  }
  return make_uint4(w[0], w[1], w[2], w[3]);
}

// Columns c..c+7 (lo) and c+D/2..c+D/2+7 (hi) of one fp32 row, rotated at the position whose
// table rows are cs, sn (pairs c..c+7), rounded to bf16. c a multiple of 8 below D/2. (All 8
// pairs loaded first: packing each 4 as soon as rotated spilled more at 128/128, 12 bytes.)
template <int D>
__device__ __forceinline__ void Load8Rotated(const float* row, int c, const float* cs,
                                             const float* sn, uint4* lo, uint4* hi) {
  float a[8], b[8], co[8], si[8];
#pragma unroll
  for (int h = 0; h < 2; ++h) {  // 16-byte loads: rows and tables are 16-byte aligned
    const float4 av = reinterpret_cast<const float4*>(row + c)[h];
    const float4 bv = reinterpret_cast<const float4*>(row + c + D / 2)[h];
    const float4 cv = reinterpret_cast<const float4*>(cs + c)[h];
    const float4 sv = reinterpret_cast<const float4*>(sn + c)[h];
    a[4 * h] = av.x, a[4 * h + 1] = av.y, a[4 * h + 2] = av.z, a[4 * h + 3] = av.w;
    b[4 * h] = bv.x, b[4 * h + 1] = bv.y, b[4 * h + 2] = bv.z, b[4 * h + 3] = bv.w;
    co[4 * h] = cv.x, co[4 * h + 1] = cv.y, co[4 * h + 2] = cv.z, co[4 * h + 3] = cv.w;
    si[4 * h] = sv.x, si[4 * h + 1] = sv.y, si[4 * h + 2] = sv.z, si[4 * h + 3] = sv.w;
  }
#pragma unroll
  for (int e = 0; e < 8; ++e) rope::RotatePair(a[e], b[e], co[e], si[e]);
  *lo = PackBf16x8(a);
  *hi = PackBf16x8(b);
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
