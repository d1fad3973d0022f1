// Device code of the RMSNorm forward kernels (kernels/cuda/norm.h): the plain/grouped one and the
// residual add fused with it, each with an optional bf16 copy of its output. Internal header,
// included by elementwise.cu and by tests/cuda_kernels/fused_emulation_test.cc and
// norm_bf16_emulation_test.cc, which run these very kernels on the CPU under
// tests/cuda_kernels/emulation/cuda_emulation.h.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "kernels/cuda/common.cuh"

namespace moelab::cuda::norm {

// Threads per row (block) for a row of d values.
inline int NormThreads(int d) { return d >= 512 ? 256 : (d >= 128 ? 128 : 32); }

// Vector v = i·groups + g (i < n rows, g < groups) starts at x + i·ldx + g·d. One block per
// vector. yb (nullable, laid out as y): each y value rounded to bf16 (round to nearest even, the
// bits a cast of y gives), written by the thread that writes it to y: the GEMM operand of bf16
// mode without a cast kernel over y.
template <typename T>
__global__ void RmsNormForwardKernel(const T* x, int ldx, T* y, int ldy, int groups, int d,
                                     const T* gain, double eps, T* rstd,
                                     __nv_bfloat16* yb = nullptr) {
  __shared__ float shared[32];
  const long v = blockIdx.x;
  const long i = v / groups, g = v % groups;
  const T* xi = x + i * ldx + g * d;
  T* yi = y + i * ldy + g * d;
  float ss = 0;
  for (int j = threadIdx.x; j < d; j += blockDim.x) ss += xi[j] * xi[j];
  ss = detail::BlockSum(ss, shared);
  const T r = static_cast<T>(1.0 / sqrt(static_cast<double>(ss) / d + eps));
  if (threadIdx.x == 0) rstd[v] = r;
  if (yb == nullptr) {
    for (int j = threadIdx.x; j < d; j += blockDim.x)
      yi[j] = __fmul_rn(__fmul_rn(xi[j], r), gain[j]);
    return;
  }
  __nv_bfloat16* ybi = yb + i * ldy + g * d;
  for (int j = threadIdx.x; j < d; j += blockDim.x) {
    const T out = __fmul_rn(__fmul_rn(xi[j], r), gain[j]);
    yi[j] = out;
    ybi[j] = __float2bfloat16(static_cast<float>(out));
  }
}

// sum = a + b, y = RMSNorm(sum), one block per row of d: a and b are read once, sum and y written
// once. The second pass reads back the sum values this same thread wrote in the first (program
// order makes them visible to it without a barrier; they come from L1/L2, not DRAM). Each thread
// touches the same j as RmsNormForwardKernel's threads and sums its squares in the same order, so
// with the same launch shape the result is that of the add then RmsNormForwardKernel, bit for
// bit. sum may alias a or b (each element is read before it is written, by one thread). yb
// (nullable): y rounded to bf16, as in RmsNormForwardKernel.
template <typename T>
__global__ void AddRmsNormKernel(const T* a, const T* b, T* sum, const T* gain, int d, double eps,
                                 T* y, T* rstd, __nv_bfloat16* yb = nullptr) {
  __shared__ float shared[32];
  const long i = blockIdx.x;
  const T* ai = a + i * d;
  const T* bi = b + i * d;
  T* si = sum + i * d;
  T* yi = y + i * d;
  float ss = 0;
  for (int j = threadIdx.x; j < d; j += blockDim.x) {
    const T s = ai[j] + bi[j];
    si[j] = s;
    ss += s * s;
  }
  ss = detail::BlockSum(ss, shared);
  const T r = static_cast<T>(1.0 / sqrt(static_cast<double>(ss) / d + eps));
  if (threadIdx.x == 0) rstd[i] = r;
  if (yb == nullptr) {
    for (int j = threadIdx.x; j < d; j += blockDim.x)
      yi[j] = __fmul_rn(__fmul_rn(si[j], r), gain[j]);
    return;
  }
  __nv_bfloat16* ybi = yb + i * d;
  for (int j = threadIdx.x; j < d; j += blockDim.x) {
    const T out = __fmul_rn(__fmul_rn(si[j], r), gain[j]);
    yi[j] = out;
    ybi[j] = __float2bfloat16(static_cast<float>(out));
  }
}

}  // namespace moelab::cuda::norm
