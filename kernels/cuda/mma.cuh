// Warp-level bf16 tensor-core products with the fragments in registers (PTX `mma.sync`
// m16n8k16), for kernels that keep their accumulators in registers instead of going through
// shared memory as `nvcuda::wmma` requires (its fragment layout is opaque; this one is not).
//
// Fragment layout (PTX ISA, "Matrix fragments for mma.m16n8k16" with .bf16), per lane with
// g = lane / 4 (the group) and t = lane % 4 (the thread in the group). Each uint32_t holds two
// bf16, the lower column/k index in the low 16 bits (PackBf16x2):
//   A (16×16, row-major):  a[0] = A[g][2t, 2t+1]     a[1] = A[g+8][2t, 2t+1]
//                          a[2] = A[g][2t+8, 2t+9]   a[3] = A[g+8][2t+8, 2t+9]
//   B (16×8, k × n):       b[0] = B[2t, 2t+1][g]     b[1] = B[2t+8, 2t+9][g]
//   C, D (16×8, fp32):     c[0], c[1] = C[g][2t, 2t+1]   c[2], c[3] = C[g+8][2t, 2t+1]
// Two useful consequences: C of S = Q·Kᵀ over two adjacent n-tiles (keys 0–7 and 8–15), packed
// to bf16 pairwise, is exactly the A fragment of P for P·V (FlashAttention-2's register reuse);
// and row r of a C tile lives in the four lanes of one group, so a row reduction is two
// __shfl_xor_sync (offsets 1 and 2).
//
// Under the CPU emulation (tests/cuda_kernels/emulation/cuda_emulation.h) the product is formed
// from the same per-lane fragments exchanged through a per-warp buffer, each output a sequential fp32
// sum of bf16 products; so the emulation checks every kernel's fragment indexing against these
// documented layouts, not the hardware's rounding.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>

namespace moelab::cuda::mma {

// Two floats rounded to bf16 (nearest even), `lo` in the low half.
__device__ __forceinline__ uint32_t PackBf16x2(float lo, float hi) {
  const __nv_bfloat16 l = __float2bfloat16(lo), h = __float2bfloat16(hi);
  uint16_t lb, hb;
  memcpy(&lb, &l, 2);
  memcpy(&hb, &h, 2);
  return static_cast<uint32_t>(lb) | (static_cast<uint32_t>(hb) << 16);
}
// Two bf16 already in memory, `lo` in the low half.
__device__ __forceinline__ uint32_t PackBf16x2(__nv_bfloat16 lo, __nv_bfloat16 hi) {
  uint16_t lb, hb;
  memcpy(&lb, &lo, 2);
  memcpy(&hb, &hi, 2);
  return static_cast<uint32_t>(lb) | (static_cast<uint32_t>(hb) << 16);
}
__device__ __forceinline__ float LowBf16(uint32_t x) {
  const uint16_t b = static_cast<uint16_t>(x & 0xffffu);
  __nv_bfloat16 v;
  memcpy(&v, &b, 2);
  return __bfloat162float(v);
}
__device__ __forceinline__ float HighBf16(uint32_t x) {
  const uint16_t b = static_cast<uint16_t>(x >> 16);
  __nv_bfloat16 v;
  memcpy(&v, &b, 2);
  return __bfloat162float(v);
}

// c += A·B for one 16×8×16 tile, fragments as above. All 32 lanes of the warp must call it.
__device__ __forceinline__ void MmaBf16(float c[4], const uint32_t a[4], const uint32_t b[2]) {
#ifndef MOELAB_CUDA_EMULATION
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#else
  // Every lane publishes its six fragment registers, then forms its own outputs (rows g and
  // g+8, columns 2t and 2t+1): A[r][k] for k = 2j+e (+8) sits in lane 4·(r%8)+j, register
  // (r≥8) + 2·(k≥8); B[k][n] in lane 4n+j, register (k≥8).
  const int lane = threadIdx.x & 31, g = lane / 4, t = lane % 4;
  uint32_t* x = emu::MmaExchange();
  for (int i = 0; i < 4; ++i) x[lane * 6 + i] = a[i];
  for (int i = 0; i < 2; ++i) x[lane * 6 + 4 + i] = b[i];
  __syncwarp();
  float arow[2][16], bcol[2][16];
  for (int j = 0; j < 4; ++j) {
    for (int reg = 0; reg < 4; ++reg) {
      const uint32_t v = x[(4 * g + j) * 6 + reg];
      const int r = reg & 1, k = 2 * j + (reg >= 2 ? 8 : 0);
      arow[r][k] = LowBf16(v);
      arow[r][k + 1] = HighBf16(v);
    }
    for (int n = 0; n < 2; ++n)
      for (int reg = 0; reg < 2; ++reg) {
        const uint32_t v = x[(4 * (2 * t + n) + j) * 6 + 4 + reg];
        const int k = 2 * j + 8 * reg;
        bcol[n][k] = LowBf16(v);
        bcol[n][k + 1] = HighBf16(v);
      }
  }
  __syncwarp();  // all lanes have read before any lane's next product overwrites
  for (int r = 0; r < 2; ++r)
    for (int n = 0; n < 2; ++n) {
      float s = c[2 * r + n];
      for (int k = 0; k < 16; ++k) s += arow[r][k] * bcol[n][k];
      c[2 * r + n] = s;
    }
#endif
}

// One warp forms C = A·B from memory through the fragments above: A 16×16 row-major, B 16×8
// (k × n) row-major, C 16×8 row-major fp32. The fragment layout's own check (mma_check.cu on the
// GPU, mma_emulation_test.cc on the CPU); kernels load their fragments the same way.
__device__ __forceinline__ void TileProduct(const __nv_bfloat16* A, const __nv_bfloat16* B,
                                            float* C) {
  const int lane = threadIdx.x & 31, g = lane / 4, t = lane % 4;
  uint32_t a[4], b[2];
  a[0] = PackBf16x2(A[g * 16 + 2 * t], A[g * 16 + 2 * t + 1]);
  a[1] = PackBf16x2(A[(g + 8) * 16 + 2 * t], A[(g + 8) * 16 + 2 * t + 1]);
  a[2] = PackBf16x2(A[g * 16 + 2 * t + 8], A[g * 16 + 2 * t + 9]);
  a[3] = PackBf16x2(A[(g + 8) * 16 + 2 * t + 8], A[(g + 8) * 16 + 2 * t + 9]);
  b[0] = PackBf16x2(B[(2 * t) * 8 + g], B[(2 * t + 1) * 8 + g]);
  b[1] = PackBf16x2(B[(2 * t + 8) * 8 + g], B[(2 * t + 9) * 8 + g]);
  float c[4] = {0, 0, 0, 0};
  MmaBf16(c, a, b);
  C[g * 8 + 2 * t] = c[0];
  C[g * 8 + 2 * t + 1] = c[1];
  C[(g + 8) * 8 + 2 * t] = c[2];
  C[(g + 8) * 8 + 2 * t + 1] = c[3];
}

}  // namespace moelab::cuda::mma
