// Device code of the SwiGLU activation (kernels/cuda/swiglu.h): act = silu(h1)·h3 and its
// backward, over contiguous [count] arrays or over rows whose h1, h3 halves sit side by side in
// one [rows, 2·hidden] buffer (the fused gate-and-up GEMM's output, GatedFfnForwardBf16). One
// elementwise body for both layouts. Internal header, included by elementwise.cu and by
// tests/cuda_kernels/swiglu_emulation_test.cc, which runs these kernels on the CPU under
// tests/cuda_kernels/emulation/cuda_emulation.h.
#pragma once

#include <cuda_runtime.h>

#include "kernels/cuda/common.cuh"

namespace moelab::cuda::swiglu {

__device__ __forceinline__ float Sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

// Element (r, j) of a [rows, cols] view with row stride ld (a contiguous array is one row).
struct RowsView {
  long rows, cols, ld_h, ld_act;  // h1/h3 row stride; act/dact/dh row stride
};

// act = silu(h1)·h3, in fp32 from the stored values, rounded to T once.
template <typename T>
__global__ void ActKernel(const T* h1, const T* h3, RowsView v, T* act) {
  const long total = v.rows * v.cols;
  for (long i = blockIdx.x * long(blockDim.x) + threadIdx.x; i < total;
       i += long(gridDim.x) * blockDim.x) {
    const long r = i / v.cols, j = i - r * v.cols;
    const float a = detail::ToFloat(h1[r * v.ld_h + j]);
    act[r * v.ld_act + j] =
        detail::FromFloat<T>(a * Sigmoid(a) * detail::ToFloat(h3[r * v.ld_h + j]));
  }
}

// dh3 = dact·silu(h1); dh1 = dact·h3·s·(1 + h1·(1 − s)). dact, dh1 and dh3 share the row stride
// ld_act; dh1 may alias dact (each element is read before it is written, by the same thread).
template <typename T>
__global__ void ActBackwardKernel(const T* h1, const T* h3, const T* dact, RowsView v, T* dh1,
                                  T* dh3) {
  const long total = v.rows * v.cols;
  for (long i = blockIdx.x * long(blockDim.x) + threadIdx.x; i < total;
       i += long(gridDim.x) * blockDim.x) {
    const long r = i / v.cols, j = i - r * v.cols, h = r * v.ld_h + j, o = r * v.ld_act + j;
    const float a = detail::ToFloat(h1[h]), g = detail::ToFloat(dact[o]);
    const float s = Sigmoid(a);
    const float b = detail::ToFloat(h3[h]);
    dh3[o] = detail::FromFloat<T>(g * (a * s));
    dh1[o] = detail::FromFloat<T>(g * b * (s * (1.0f + a * (1.0f - s))));
  }
}

}  // namespace moelab::cuda::swiglu
