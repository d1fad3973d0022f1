// Device code of the MoE layer's row moves (kernels/cuda/moe_routing.h): gather by token, the
// chunked layout's gather and un-chunk, combine with the gates and their backward passes. One
// block per row (or token); each thread moves kVec consecutive elements at a time (T, TE: float or
// bf16): kVec = 1 is the element-per-thread form that ran on the H200, kVec = 8 moves 16 bytes of
// bf16 (two 16-byte halves of fp32) per access, for rows whose width is a multiple of 8 (and
// 16-byte aligned bases: cudaMalloc's). Every element sees the same arithmetic in the same order
// for either kVec, so the results are the same bits, except dgates, whose double dot product sums
// per-thread partials of a different split. Internal header, included by moe.cu and by
// tests/cuda_kernels/moe_rows_emulation_test.cc, which runs it on the CPU under
// tests/cuda_kernels/emulation/cuda_emulation.h.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>

#include "kernels/cuda/common.cuh"

namespace moelab::cuda::moe_rows {

// 16 bytes at p (16-byte aligned) as one access. Under the CPU emulation through memcpy: the
// host compiler's strict aliasing would otherwise let it drop or reorder the reinterpretation.
__device__ __forceinline__ uint4 Load16(const void* p) {
#ifdef MOELAB_CUDA_EMULATION
  uint4 u;
  std::memcpy(&u, p, 16);
  return u;
#else
  return *reinterpret_cast<const uint4*>(p);
#endif
}
__device__ __forceinline__ void Store16(void* p, uint4 u) {
#ifdef MOELAB_CUDA_EMULATION
  std::memcpy(p, &u, 16);
#else
  *reinterpret_cast<uint4*>(p) = u;
#endif
}

// kVec elements of p widened to fp32 (kVec = 8: one 16-byte load of bf16, or two of fp32).
template <int kVec, typename T>
__device__ __forceinline__ void Load(const T* p, float* f) {
  if constexpr (kVec == 8) {
    constexpr int kWords = 8 * sizeof(T) / 16;
    uint4 u[kWords];
#pragma unroll
    for (int q = 0; q < kWords; ++q) u[q] = Load16(p + q * (16 / sizeof(T)));
    T h[8];
    std::memcpy(h, u, sizeof h);  // registers to registers: no memory traffic on the device
#pragma unroll
    for (int j = 0; j < 8; ++j) f[j] = detail::ToFloat(h[j]);
  } else {
#pragma unroll
    for (int j = 0; j < kVec; ++j) f[j] = detail::ToFloat(p[j]);
  }
}

// kVec fp32 values rounded to T (round to nearest even for bf16) and stored.
template <int kVec, typename T>
__device__ __forceinline__ void Store(T* p, const float* f) {
  if constexpr (kVec == 8) {
    constexpr int kWords = 8 * sizeof(T) / 16;
    T h[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) h[j] = detail::FromFloat<T>(f[j]);
    uint4 u[kWords];
    std::memcpy(u, h, sizeof h);
#pragma unroll
    for (int q = 0; q < kWords; ++q) Store16(p + q * (16 / sizeof(T)), u[q]);
  } else {
#pragma unroll
    for (int j = 0; j < kVec; ++j) p[j] = detail::FromFloat<T>(f[j]);
  }
}

// Load, or zeros when !load (an accumulator that starts empty).
template <int kVec, typename T>
__device__ __forceinline__ void LoadOrZero(const T* p, bool load, float* f) {
  if (load) {
    Load<kVec>(p, f);
  } else {
#pragma unroll
    for (int j = 0; j < kVec; ++j) f[j] = 0.0f;
  }
}

// Copies row src to row dst (d elements) bit for bit, kVec elements at a time; zeros when src is
// null.
template <int kVec, typename T>
__device__ __forceinline__ void CopyRow(const T* src, T* dst, int d) {
  static_assert(kVec == 1 || kVec * sizeof(T) % 16 == 0, "16-byte moves");
  for (int c = threadIdx.x * kVec; c < d; c += blockDim.x * kVec) {
    if constexpr (kVec == 1) {
      dst[c] = src ? src[c] : T(0.0f);
    } else {
#pragma unroll
      for (int q = 0; q < int(kVec * sizeof(T) / 16); ++q) {
        const int at = c + q * int(16 / sizeof(T));
        Store16(dst + at, src ? Load16(src + at) : make_uint4(0, 0, 0, 0));
      }
    }
  }
}

template <int kVec, typename T>
__global__ void GatherKernel(const T* x, int d, const int* row_token, T* xe) {
  const long r = blockIdx.x;
  CopyRow<kVec>(x + static_cast<long>(row_token[r]) * d, xe + r * d, d);
}

// Chunked expert layout (MoeChunks): block p is row j = p % rows of chunk b = p / rows, compact
// row r = table[b] + j when r < table[B + b] (its expert's end), else a zero row.
template <int kVec, typename T>
__global__ void GatherChunkedKernel(const T* x, int d, const int* row_token, const int64_t* table,
                                    int chunks, int rows, T* chunked) {
  const long p = blockIdx.x;
  const int b = static_cast<int>(p / rows);
  const int64_t r = table[b] + p % rows;
  const bool real = r < table[chunks + b];
  CopyRow<kVec>(real ? x + static_cast<long>(row_token ? row_token[r] : r) * d : nullptr,
                chunked + p * d, d);
}

// The inverse for the real rows: compact row r ← chunked row p.
template <int kVec, typename T>
__global__ void UnchunkKernel(const T* chunked, const int64_t* table, int chunks, int rows, int d,
                              T* compact) {
  const long p = blockIdx.x;
  const int b = static_cast<int>(p / rows);
  const int64_t r = table[b] + p % rows;
  if (r >= table[chunks + b]) return;
  CopyRow<kVec>(chunked + p * d, compact + r * d, d);
}

// Each token's row t = Σ over its k slots of g·rows[slot_row] (+ the row already there when
// accumulating): the combine (rows = ye, g = the gates) and the gather's backward (rows = dxe,
// gates null: g = 1, and g·v = v exactly, so the unweighted sum's bits). T: the token side (x, y,
// gates: fp32); TE: the expert rows (xe, ye and their gradients: fp32, or bf16 in bf16 mode). Sums
// run in fp32 either way, so TE = float is the fp32 twin unchanged.
template <int kVec, typename T, typename TE>
__global__ void SumSlotsKernel(const TE* rows, const int* slot_row, const T* gates, int k, int d,
                               T* out_rows, bool accumulate) {
  const long t = blockIdx.x;
  T* out = out_rows + t * d;
  float acc[kVec], v[kVec];
  for (int c = threadIdx.x * kVec; c < d; c += blockDim.x * kVec) {
    LoadOrZero<kVec>(out + c, accumulate, acc);
    for (int slot = 0; slot < k; ++slot) {
      const long i = t * k + slot;
      const float g = gates ? static_cast<float>(gates[i]) : 1.0f;
      Load<kVec>(rows + static_cast<long>(slot_row[i]) * d + c, v);
#pragma unroll
      for (int j = 0; j < kVec; ++j) acc[j] = __fadd_rn(acc[j], __fmul_rn(g, v[j]));
    }
    Store<kVec>(out + c, acc);
  }
}

// dgates[i] = dy_t · ye_r (double sum: per thread over its elements in order, then the block's
// fixed tree), then dye_r = g·dy_t rounded to TE. dye may alias ye: the whole row is read (the
// block sum synchronises) before any of it is written.
template <int kVec, typename T, typename TE>
__global__ void CombineBackwardKernel(const T* dy, const TE* ye, const int* slot_row,
                                      const T* gates, int k, int d, TE* dye, T* dgates) {
  __shared__ double shared[32];
  const long t = blockIdx.x;
  const T* dyt = dy + t * d;
  float a[kVec], v[kVec];
  for (int slot = 0; slot < k; ++slot) {
    const long i = t * k + slot;
    const long r = slot_row[i];
    const TE* src = ye + r * d;
    TE* dst = dye + r * d;
    double dot = 0;
    for (int c = threadIdx.x * kVec; c < d; c += blockDim.x * kVec) {
      Load<kVec>(dyt + c, a);
      Load<kVec>(src + c, v);
#pragma unroll
      for (int j = 0; j < kVec; ++j) dot += static_cast<double>(a[j]) * static_cast<double>(v[j]);
    }
    dot = detail::BlockSum(dot, shared);
    if (threadIdx.x == 0) dgates[i] = static_cast<T>(dot);
    const float g = gates[i];
    for (int c = threadIdx.x * kVec; c < d; c += blockDim.x * kVec) {
      Load<kVec>(dyt + c, a);
#pragma unroll
      for (int j = 0; j < kVec; ++j) a[j] = __fmul_rn(g, a[j]);
      Store<kVec>(dst + c, a);
    }
  }
}

}  // namespace moelab::cuda::moe_rows
