// Internal helpers shared by the .cu files of kernels/cuda (not a public header).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/device.h"

namespace moelab::cuda::detail {

inline int Blocks(size_t n, int threads) {
  const size_t b = (n + threads - 1) / threads;
  return static_cast<int>(b < 65535u * 16u ? b : 65535u * 16u);  // grid-stride loops cover the rest
}

__device__ __forceinline__ float ToFloat(float x) { return x; }
__device__ __forceinline__ float ToFloat(__nv_bfloat16 x) { return __bfloat162float(x); }
template <typename T>
__device__ __forceinline__ T FromFloat(float x);
template <>
__device__ __forceinline__ float FromFloat<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ __nv_bfloat16 FromFloat<__nv_bfloat16>(float x) {
  return __float2bfloat16(x);
}

// Warp and block reductions (blockDim.x a multiple of 32, at most 1024). The block versions use
// `shared` [32] and return the total to every thread; the order of the sums is fixed by the
// launch shape, so a result is reproducible for a given blockDim.
template <typename T>
__device__ __forceinline__ T WarpSum(T v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
template <typename T>
__device__ __forceinline__ T WarpMax(T v) {
  for (int o = 16; o > 0; o >>= 1) {
    const T other = __shfl_xor_sync(0xffffffffu, v, o);
    v = other > v ? other : v;
  }
  return v;
}
template <typename T>
__device__ T BlockSum(T v, T* shared) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = (blockDim.x + 31) >> 5;
  v = WarpSum(v);
  __syncthreads();  // shared may be reused by consecutive calls
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = lane < warps ? shared[lane] : T(0);
  return WarpSum(v);
}
template <typename T>
__device__ T BlockMax(T v, T* shared, T lowest) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = (blockDim.x + 31) >> 5;
  v = WarpMax(v);
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = lane < warps ? shared[lane] : lowest;
  return WarpMax(v);
}

// Float atomic max through the integer order of IEEE floats (NaN-free inputs): non-negative
// floats order like signed ints, negative ones (sign bit set, -0.0 included) reversed like
// unsigned ints.
__device__ __forceinline__ void AtomicMaxFloat(float* addr, float v) {
  if (!signbit(v)) {
    atomicMax(reinterpret_cast<int*>(addr), __float_as_int(v));
  } else {
    atomicMin(reinterpret_cast<unsigned int*>(addr), __float_as_uint(v));
  }
}

}  // namespace moelab::cuda::detail
