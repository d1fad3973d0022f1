// Device code of the cross-entropy kernels (kernels/cuda/cross_entropy.h), templated on the
// logits type: fp32 logits (fp32 mode), or bf16 logits with their bf16 dlogits written in place
// (the LM head of the bf16 mode). Internal header, included by elementwise.cu and by
// tests/cuda_kernels/ce_emulation_test.cc, which runs these very kernels on the CPU under
// tests/cuda_kernels/emulation/cuda_emulation.h. The kernels are static so that the emulation's
// and the GPU build's versions never meet at link time.
#pragma once

#include <cuda_runtime.h>
#include <math.h>

#include "kernels/cuda/common.cuh"

namespace moelab::cuda::ce {

constexpr int kCeThreads = 512;

// One block per row of `vocab` logits of type TL. The arithmetic is fp32 whatever TL is: the row
// max, Σ exp(x − max) (strided partials, then the block's fixed tree), the log-sum-exp in double.
// With backward the row becomes d(loss + z_loss)/d logits times `weight`:
//   g_j = exp(x_j − max)·coef − [j = t]·inv_n·weight, coef = (1 + 2·z·lse)·inv_n·weight / Σ,
// recomputing the exponential (three passes: two reads, one read-write; no value is stored and
// read back, so a bf16 gradient is rounded once, from fp32). The products go through __fmul_rn
// and the target's subtraction through __fsub_rn, so nvcc cannot contract them into an FMA: with
// fp32 logits and weight 1 each g_j has the bits of the former kernel (exponentials stored, then
// scaled, then the target's inv_n subtracted).
template <typename TL>
static __global__ void CrossEntropyRowKernel(TL* logits, const int32_t* targets, int vocab,
                                             double z_coef, bool backward, float inv_n,
                                             float weight, double* ce_rows, double* lse_rows) {
  __shared__ float shared[32];
  const long i = blockIdx.x;
  TL* x = logits + i * vocab;
  const int t = targets[i];
  const double xt = static_cast<double>(detail::ToFloat(x[t]));
  float m = -INFINITY;
  for (int j = threadIdx.x; j < vocab; j += blockDim.x) m = fmaxf(m, detail::ToFloat(x[j]));
  m = detail::BlockMax(m, shared, -INFINITY);
  float sum = 0;
  for (int j = threadIdx.x; j < vocab; j += blockDim.x) sum += expf(detail::ToFloat(x[j]) - m);
  sum = detail::BlockSum(sum, shared);
  const double lse = static_cast<double>(m) + log(static_cast<double>(sum));
  if (threadIdx.x == 0) {
    ce_rows[i] = lse - xt;
    lse_rows[i] = lse;
  }
  if (backward) {
    // BlockSum's barriers: every thread has read x[t] and finished its reads of the row.
    const float coef = __fmul_rn(
        __fmul_rn(__fmul_rn(static_cast<float>(1.0 + 2.0 * z_coef * lse), inv_n), 1.0f / sum),
        weight);
    const float target_step = __fmul_rn(inv_n, weight);
    for (int j = threadIdx.x; j < vocab; j += blockDim.x) {
      float g = __fmul_rn(expf(detail::ToFloat(x[j]) - m), coef);
      if (j == t) g = __fsub_rn(g, target_step);
      x[j] = detail::FromFloat<TL>(g);
    }
  }
}

// One block of 1024 threads: fixed-shape tree sums of the per-row values (reproducible).
static __global__ void CrossEntropyReduceKernel(const double* ce_rows, const double* lse_rows,
                                                int n, double z_coef, double* result) {
  __shared__ double shared[32];
  double ce = 0, z = 0;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    ce += ce_rows[i];
    z += lse_rows[i] * lse_rows[i];
  }
  ce = detail::BlockSum(ce, shared);
  z = detail::BlockSum(z, shared);
  if (threadIdx.x == 0) {
    result[0] = n > 0 ? ce / n : 0.0;
    result[1] = n > 0 ? z_coef * z / n : 0.0;
  }
}

}  // namespace moelab::cuda::ce
