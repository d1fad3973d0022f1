// Device kernels of core/optim/cuda_optimizer.h besides the optimizer arithmetic (which is
// kernels/cuda/optim_kernels.cuh): QK-Clip's range scaling, the gradient-norm reduction, scaling.
#include <cuda_bf16.h>

#include "core/optim/cuda_optimizer_kernels.h"

namespace moelab::cudaopt {
namespace {

constexpr int kThreads = 256;

inline unsigned BlocksFor(uint64_t n, unsigned cap = 4096) {
  const uint64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(b < 1 ? 1 : (b > cap ? cap : b));
}

__global__ void ScaleRangesKernel(const ScaleRange* rs, float* arena, __nv_bfloat16* copy) {
  const ScaleRange r = rs[blockIdx.y];
  float* p = arena + r.offset;
  __nv_bfloat16* c = copy ? copy + r.offset : nullptr;
  for (uint64_t i = blockIdx.x * blockDim.x + threadIdx.x; i < r.count;
       i += static_cast<uint64_t>(gridDim.x) * blockDim.x) {
    p[i] *= r.factor;
    if (c) c[i] = __float2bfloat16(p[i]);
  }
}

__global__ void SumSquaresKernel(const float* x, uint64_t n, double* partial) {
  __shared__ double part[kThreads];
  double s = 0;
  for (uint64_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += static_cast<uint64_t>(gridDim.x) * blockDim.x) {
    const double v = x[i];
    s += v * v;
  }
  part[threadIdx.x] = s;
  __syncthreads();
  for (int w = kThreads / 2; w > 0; w /= 2) {
    if (threadIdx.x < w) part[threadIdx.x] += part[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x == 0) partial[blockIdx.x] = part[0];
}

__global__ void ScaleKernel(float* x, uint64_t n, float s) {
  for (uint64_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += static_cast<uint64_t>(gridDim.x) * blockDim.x) {
    x[i] *= s;
  }
}

}  // namespace

void LaunchScaleRanges(const ScaleRange* ranges, int num_ranges, uint64_t max_count, float* arena,
                       void* copy, cudaStream_t stream) {
  if (num_ranges == 0) return;
  const dim3 grid(BlocksFor(max_count, 256), num_ranges);
  ScaleRangesKernel<<<grid, kThreads, 0, stream>>>(ranges, arena,
                                                   static_cast<__nv_bfloat16*>(copy));
}

int LaunchSumSquares(const float* x, uint64_t n, double* partial, int max_blocks,
                     cudaStream_t stream) {
  const int blocks = static_cast<int>(BlocksFor(n, static_cast<unsigned>(max_blocks)));
  SumSquaresKernel<<<blocks, kThreads, 0, stream>>>(x, n, partial);
  return blocks;
}

void LaunchScale(float* x, uint64_t n, float s, cudaStream_t stream) {
  ScaleKernel<<<BlocksFor(n), kThreads, 0, stream>>>(x, n, s);
}

}  // namespace moelab::cudaopt
