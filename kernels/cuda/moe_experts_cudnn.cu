#include <cuda_runtime.h>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/moe_experts_cudnn.h"
#include "kernels/cuda/swiglu.h"

namespace moelab::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void FirstRowsKernel(const int64_t* offsets, int experts, int32_t* first_row) {
  const int e = blockIdx.x * blockDim.x + threadIdx.x;
  if (e < experts) first_row[e] = static_cast<int32_t>(offsets[e]);
}

}  // namespace

void MoeFirstRows(const int64_t* offsets, int experts, int32_t* first_row, cudaStream_t stream) {
  if (experts <= 0) return;
  FirstRowsKernel<<<detail::Blocks(experts, kThreads), kThreads, 0, stream>>>(offsets, experts,
                                                                              first_row);
  CheckLaunch("MoeFirstRows");
}

MoeExpertsCudnn::MoeExpertsCudnn(int experts, int64_t rows, int d, int hidden)
    : rows_(rows),
      hidden_(hidden),
      up_({experts, rows, d, hidden}),      // h1, h3 = xe·W1ᵀ, xe·W3ᵀ
      down_({experts, rows, hidden, d}) {}  // ye = act·W2ᵀ

void MoeExpertsCudnn::Forward(const bf16* xe, const int32_t* first_row, const bf16* w1,
                              const bf16* w3, const bf16* w2, bf16* h1, bf16* h3, bf16* act,
                              bf16* ye, cudaStream_t stream) {
  up_.Run(xe, w1, first_row, h1, stream);
  up_.Run(xe, w3, first_row, h3, stream);
  SwigluActivation(h1, h3, static_cast<size_t>(rows_) * hidden_, act, stream);
  down_.Run(act, w2, first_row, ye, stream);
}

}  // namespace moelab::cuda
