// Device code of the SwiGLU activation (kernels/cuda/swiglu.h): act = silu(h1)·h3 and its
// backward, over contiguous [count] arrays or over rows whose h1, h3 halves sit side by side in
// one [rows, 2·hidden] buffer (the fused gate-and-up GEMM's output, GatedFfnForwardBf16). One
// elementwise body for both layouts; the row kernels walk rows by block and columns by thread, so
// no element index is ever divided. Internal header, included by elementwise.cu and by
// tests/cuda_kernels/swiglu_emulation_test.cc, which runs these kernels on the CPU under
// tests/cuda_kernels/emulation/cuda_emulation.h.
#pragma once

#include <cuda_runtime.h>

#include "kernels/cuda/common.cuh"

namespace moelab::cuda::swiglu {

__device__ __forceinline__ float Sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

// act[o] = silu(h1[h])·h3[h], in fp32 from the stored values, rounded to T once.
template <typename T>
__device__ __forceinline__ void ActAt(const T* h1, const T* h3, T* act, long h, long o) {
  const float a = detail::ToFloat(h1[h]);
  act[o] = detail::FromFloat<T>(a * Sigmoid(a) * detail::ToFloat(h3[h]));
}

// dh3 = dact·silu(h1); dh1 = dact·h3·s·(1 + h1·(1 − s)), at h (h1, h3) and o (dact, dh1, dh3).
// dh1 may alias dact: the element is read before it is written, by the same thread.
template <typename T>
__device__ __forceinline__ void ActBackwardAt(const T* h1, const T* h3, const T* dact, T* dh1,
                                              T* dh3, long h, long o) {
  const float a = detail::ToFloat(h1[h]), g = detail::ToFloat(dact[o]);
  const float s = Sigmoid(a);
  const float b = detail::ToFloat(h3[h]);
  dh3[o] = detail::FromFloat<T>(g * (a * s));
  dh1[o] = detail::FromFloat<T>(g * b * (s * (1.0f + a * (1.0f - s))));
}

// Contiguous arrays of count elements: a grid-stride loop.
template <typename T>
__global__ void ActKernel(const T* h1, const T* h3, long count, T* act) {
  for (long i = blockIdx.x * long(blockDim.x) + threadIdx.x; i < count;
       i += long(gridDim.x) * blockDim.x) {
    ActAt(h1, h3, act, i, i);
  }
}
template <typename T>
__global__ void ActBackwardKernel(const T* h1, const T* h3, const T* dact, long count, T* dh1,
                                  T* dh3) {
  for (long i = blockIdx.x * long(blockDim.x) + threadIdx.x; i < count;
       i += long(gridDim.x) * blockDim.x) {
    ActBackwardAt(h1, h3, dact, dh1, dh3, i, i);
  }
}

// rows × cols elements, h1 and h3 with row stride ld_h, act (dact, dh1, dh3) with ld_out.
struct Rows {
  long rows;
  int cols;
  long ld_h, ld_out;
};

template <typename T>
__global__ void ActRowsKernel(const T* h1, const T* h3, Rows v, T* act) {
  for (long r = blockIdx.x; r < v.rows; r += gridDim.x) {
    for (int j = threadIdx.x; j < v.cols; j += blockDim.x) {
      ActAt(h1, h3, act, r * v.ld_h + j, r * v.ld_out + j);
    }
  }
}
template <typename T>
__global__ void ActBackwardRowsKernel(const T* h1, const T* h3, const T* dact, Rows v, T* dh1,
                                      T* dh3) {
  for (long r = blockIdx.x; r < v.rows; r += gridDim.x) {
    for (int j = threadIdx.x; j < v.cols; j += blockDim.x) {
      ActBackwardAt(h1, h3, dact, dh1, dh3, r * v.ld_h + j, r * v.ld_out + j);
    }
  }
}

}  // namespace moelab::cuda::swiglu
