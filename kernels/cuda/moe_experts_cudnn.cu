#include <cuda_runtime.h>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/moe_experts.h"
#include "kernels/cuda/moe_experts_cudnn.h"
#include "kernels/cuda/swiglu.h"

namespace moelab::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void FirstRowsKernel(const int64_t* offsets, int experts, int32_t* first_row) {
  const int e = blockIdx.x * blockDim.x + threadIdx.x;
  if (e < experts) first_row[e] = static_cast<int32_t>(offsets[e]);
}

__global__ void AddBf16Kernel(const bf16* add, bf16* sum, size_t n) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    sum[i] = __float2bfloat16(__bfloat162float(sum[i]) + __bfloat162float(add[i]));
  }
}

GroupedMatmulShape Shape(int experts, int64_t rows, int k, int n, bool out_by_in) {
  return {experts, rows, k, n, out_by_in};
}

}  // namespace

void MoeFirstRows(const int64_t* offsets, int experts, int32_t* first_row, cudaStream_t stream) {
  if (experts <= 0) return;
  FirstRowsKernel<<<detail::Blocks(experts, kThreads), kThreads, 0, stream>>>(offsets, experts,
                                                                              first_row);
  CheckLaunch("MoeFirstRows");
}

void AddBf16(const bf16* add, bf16* sum, size_t n, cudaStream_t stream) {
  if (!n) return;
  AddBf16Kernel<<<detail::Blocks(n, kThreads), kThreads, 0, stream>>>(add, sum, n);
  CheckLaunch("AddBf16");
}

MoeExpertsCudnn::MoeExpertsCudnn(int experts, int64_t rows, int d, int hidden)
    : experts_(experts),
      rows_(rows),
      d_(d),
      hidden_(hidden),
      up_(Shape(experts, rows, d, hidden, true)),            // h1, h3 = xe·W1ᵀ, xe·W3ᵀ
      down_(Shape(experts, rows, hidden, d, true)),          // ye = act·W2ᵀ
      back_up_(Shape(experts, rows, hidden, d, false)),      // dxe = dh1·W1 + dh3·W3
      back_down_(Shape(experts, rows, d, hidden, false)) {}  // dact = dye·W2

void MoeExpertsCudnn::Forward(const bf16* xe, const int32_t* first_row, const bf16* w1,
                              const bf16* w3, const bf16* w2, bf16* h1, bf16* h3, bf16* act,
                              bf16* ye, cudaStream_t stream) {
  up_.Run(xe, w1, first_row, h1, stream);
  up_.Run(xe, w3, first_row, h3, stream);
  SwigluActivation(h1, h3, static_cast<size_t>(rows_) * hidden_, act, stream);
  down_.Run(act, w2, first_row, ye, stream);
}

void MoeExpertsCudnn::Backward(const bf16* xe, const int32_t* first_row,
                               const int64_t* host_offsets, const bf16* w1, const bf16* w3,
                               const bf16* w2, const bf16* h1, const bf16* h3, const bf16* act,
                               bf16* dye, bf16* dxe, float* dw1, float* dw3, float* dw2,
                               bf16* scratch, cudaStream_t stream) {
  const size_t rh = static_cast<size_t>(rows_) * hidden_;
  bf16* dact = scratch;  // becomes dh1
  bf16* dh3 = scratch + rh;
  back_down_.Run(dye, w2, first_row, dact, stream);
  SwigluActivationBackward(h1, h3, dact, rh, dact, dh3, stream);
  back_up_.Run(dact, w1, first_row, dxe, stream);
  // The weight gradients read dye last; then it holds dh3·W3 (the grouped matmul cannot add).
  MoeExpertsWeightGrads(xe, host_offsets, experts_, d_, hidden_, act, dye, dact, dh3, dw1, dw3, dw2,
                        stream);
  back_up_.Run(dh3, w3, first_row, dye, stream);
  AddBf16(dye, dxe, static_cast<size_t>(rows_) * d_, stream);
}

}  // namespace moelab::cuda
