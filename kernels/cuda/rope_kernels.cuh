// Device code of RoPE (kernels/cuda/rope.h): one kernel that rotates the heads of two slices, the
// q heads and the k heads of an attention, in one launch (a single slice is the k-less case).
// Internal header, included by elementwise.cu and by tests/cuda_kernels/fused_emulation_test.cc,
// which runs this very kernel on the CPU under tests/cuda_kernels/emulation/cuda_emulation.h.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "kernels/cpu/rope.h"

namespace moelab::cuda::rope {

// One pair (a, b) = (x_i, x_{i + rot_dim/2}) of a head rotated by (c, s) = (cos, ±sin) of its
// position and pair, in place: the CPU's arithmetic (kernels/cpu/rope.h) with every product and
// sum rounded on its own (no FMA contraction). Shared with the attention kernels that rotate q
// and k as they load them (kernels/cuda/flash_rope.cuh): the same bits as this kernel's.
__device__ __forceinline__ void RotatePair(float& a, float& b, float c, float s) {
  const float ai = a, bi = b;
  a = __fsub_rn(__fmul_rn(ai, c), __fmul_rn(bi, s));
  b = __fadd_rn(__fmul_rn(bi, c), __fmul_rn(ai, s));
}

// The element types a head may be stored in: rotated in fp32, stored back rounded (bf16).
__device__ __forceinline__ float Widen(float x) { return x; }
__device__ __forceinline__ float Widen(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ void Store(float* p, float x) { *p = x; }
__device__ __forceinline__ void Store(__nv_bfloat16* p, float x) { *p = __float2bfloat16(x); }

// One thread per (row r, head h of q's then k's heads, pair i); grid-stride over
// n·(q.heads + k.heads)·rot_dim/2. sign −1 is the inverse rotation (the backward). T = float, or
// bf16 heads (widened, rotated in fp32 with the fp32 tables, rounded once when stored).
template <typename T>
__global__ void RopeQkKernel(cpu::RopeSlice<T> q, cpu::RopeSlice<T> k, long n, int seq, int rot_dim,
                             const float* cos, const float* sin, float sign) {
  const int half = rot_dim / 2;
  const int heads = q.heads + k.heads;
  const long total = n * heads * half;
  for (long idx = blockIdx.x * static_cast<long>(blockDim.x) + threadIdx.x; idx < total;
       idx += static_cast<long>(gridDim.x) * blockDim.x) {
    const int i = static_cast<int>(idx % half);
    const long rh = idx / half;
    const int h = static_cast<int>(rh % heads);
    const long r = rh / heads;
    const long p = r % seq;
    const bool in_q = h < q.heads;
    T* a = in_q ? q.x + r * q.ld + static_cast<long>(h) * q.head_stride + q.offset
                : k.x + r * k.ld + static_cast<long>(h - q.heads) * k.head_stride + k.offset;
    T* b = a + half;
    const float c = cos[p * half + i], si = sign * sin[p * half + i];
    float ai = Widen(a[i]), bi = Widen(b[i]);
    RotatePair(ai, bi, c, si);
    Store(a + i, ai), Store(b + i, bi);
  }
}

}  // namespace moelab::cuda::rope
