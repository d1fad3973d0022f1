// Device optimizer kernels: AdamW, Muon's momentum/update and per-matrix normalisation, QK-Clip
// row scaling, the gradient-norm reduction. The elementwise formulas are those of adamw.cc and
// muon.cc, in fp32.
#include <cuda_bf16.h>

#include "core/optim/cuda_optimizer_kernels.h"

namespace moelab::cudaopt {
namespace {

constexpr int kThreads = 256;

inline unsigned BlocksFor(uint64_t n, unsigned cap = 4096) {
  const uint64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(b < 1 ? 1 : (b > cap ? cap : b));
}

__global__ void AdamWKernel(const AdamSegment* segs, float* w_all, const float* g_all, float* m_all,
                            float* v_all, float b1, float b2, float step_size, float inv_sqrt_c2,
                            float eps, float decay) {
  const AdamSegment s = segs[blockIdx.y];
  float* w = w_all + s.offset;
  const float* g = g_all + s.offset;
  float* m = m_all + s.state_offset;
  float* v = v_all + s.state_offset;
  const float d = s.decay ? decay : 1.0f;
  for (uint64_t i = blockIdx.x * blockDim.x + threadIdx.x; i < s.size;
       i += static_cast<uint64_t>(gridDim.x) * blockDim.x) {
    const float gi = g[i];
    const float mi = b1 * m[i] + (1.0f - b1) * gi;
    const float vi = b2 * v[i] + (1.0f - b2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    const float denom = sqrtf(vi) * inv_sqrt_c2 + eps;
    w[i] = w[i] * d - step_size * mi / denom;
  }
}

template <typename B>
__device__ inline void Store(B* p, uint64_t i, float x);
template <>
__device__ inline void Store<float>(float* p, uint64_t i, float x) {
  p[i] = x;
}
template <>
__device__ inline void Store<__nv_bfloat16>(__nv_bfloat16* p, uint64_t i, float x) {
  p[i] = __float2bfloat16(x);
}
__device__ inline float Load(const float* p, uint64_t i) { return p[i]; }
__device__ inline float Load(const __nv_bfloat16* p, uint64_t i) { return __bfloat162float(p[i]); }

template <typename B>
__global__ void MuonMomentumKernel(const MuonTensor* ts, const float* g_all, float* m_all, B* bank,
                                   float mu, bool nesterov) {
  const MuonTensor t = ts[blockIdx.y];
  const float* g = g_all + t.offset;
  float* m = m_all + t.momentum_offset;
  for (uint64_t i = blockIdx.x * blockDim.x + threadIdx.x; i < t.size;
       i += static_cast<uint64_t>(gridDim.x) * blockDim.x) {
    const float mi = mu * m[i] + g[i];
    m[i] = mi;
    Store(bank, t.bank_offset + i, nesterov ? g[i] + mu * mi : mi);
  }
}

template <typename B>
__global__ void MuonUpdateKernel(const MuonTensor* ts, float* w_all, const B* bank, float lr,
                                 float decay) {
  const MuonTensor t = ts[blockIdx.y];
  float* w = w_all + t.offset;
  const float step = lr * t.scale;
  for (uint64_t i = blockIdx.x * blockDim.x + threadIdx.x; i < t.size;
       i += static_cast<uint64_t>(gridDim.x) * blockDim.x) {
    w[i] = w[i] * decay - step * Load(bank, t.bank_offset + i);
  }
}

template <typename B>
__global__ void NormalizeKernel(B* x_all, uint64_t elems, float eps) {
  B* x = x_all + blockIdx.x * elems;
  __shared__ double part[kThreads];
  double s = 0;
  for (uint64_t i = threadIdx.x; i < elems; i += blockDim.x) {
    const double v = Load(x, i);
    s += v * v;
  }
  part[threadIdx.x] = s;
  __syncthreads();
  for (int w = kThreads / 2; w > 0; w /= 2) {
    if (threadIdx.x < w) part[threadIdx.x] += part[threadIdx.x + w];
    __syncthreads();
  }
  const float inv = static_cast<float>(1.0 / (sqrt(part[0]) + eps));
  for (uint64_t i = threadIdx.x; i < elems; i += blockDim.x) Store(x, i, Load(x, i) * inv);
}

__global__ void ScaleRangesKernel(const ScaleRange* rs, float* arena) {
  const ScaleRange r = rs[blockIdx.y];
  float* p = arena + r.offset;
  for (uint64_t i = blockIdx.x * blockDim.x + threadIdx.x; i < r.count;
       i += static_cast<uint64_t>(gridDim.x) * blockDim.x) {
    p[i] *= r.factor;
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

__global__ void ToBf16Kernel(const float* in, __nv_bfloat16* out, uint64_t n) {
  for (uint64_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += static_cast<uint64_t>(gridDim.x) * blockDim.x) {
    out[i] = __float2bfloat16(in[i]);
  }
}

}  // namespace

void LaunchAdamW(const AdamSegment* segments, int num_segments, uint64_t max_size, float* params,
                 const float* grads, float* m, float* v, float b1, float b2, float step_size,
                 float inv_sqrt_c2, float eps, float decay, cudaStream_t stream) {
  if (num_segments == 0) return;
  const dim3 grid(BlocksFor(max_size, 1024), num_segments);
  AdamWKernel<<<grid, kThreads, 0, stream>>>(segments, params, grads, m, v, b1, b2, step_size,
                                             inv_sqrt_c2, eps, decay);
}

void LaunchMuonMomentum(const MuonTensor* tensors, int num_tensors, uint64_t max_size,
                        const float* grads, float* momentum, void* bank, bool bank_bf16, float mu,
                        bool nesterov, cudaStream_t stream) {
  if (num_tensors == 0) return;
  const dim3 grid(BlocksFor(max_size, 1024), num_tensors);
  if (bank_bf16) {
    MuonMomentumKernel<<<grid, kThreads, 0, stream>>>(
        tensors, grads, momentum, static_cast<__nv_bfloat16*>(bank), mu, nesterov);
  } else {
    MuonMomentumKernel<<<grid, kThreads, 0, stream>>>(tensors, grads, momentum,
                                                      static_cast<float*>(bank), mu, nesterov);
  }
}

void LaunchMuonUpdate(const MuonTensor* tensors, int num_tensors, uint64_t max_size, float* params,
                      const void* bank, bool bank_bf16, float lr, float decay,
                      cudaStream_t stream) {
  if (num_tensors == 0) return;
  const dim3 grid(BlocksFor(max_size, 1024), num_tensors);
  if (bank_bf16) {
    MuonUpdateKernel<<<grid, kThreads, 0, stream>>>(
        tensors, params, static_cast<const __nv_bfloat16*>(bank), lr, decay);
  } else {
    MuonUpdateKernel<<<grid, kThreads, 0, stream>>>(tensors, params,
                                                    static_cast<const float*>(bank), lr, decay);
  }
}

void LaunchNormalizeMatrices(void* x, bool bf16, int batch, uint64_t elems, float eps,
                             cudaStream_t stream) {
  if (batch == 0) return;
  if (bf16) {
    NormalizeKernel<<<batch, kThreads, 0, stream>>>(static_cast<__nv_bfloat16*>(x), elems, eps);
  } else {
    NormalizeKernel<<<batch, kThreads, 0, stream>>>(static_cast<float*>(x), elems, eps);
  }
}

void LaunchScaleRanges(const ScaleRange* ranges, int num_ranges, uint64_t max_count, float* arena,
                       cudaStream_t stream) {
  if (num_ranges == 0) return;
  const dim3 grid(BlocksFor(max_count, 256), num_ranges);
  ScaleRangesKernel<<<grid, kThreads, 0, stream>>>(ranges, arena);
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

void LaunchToBf16(const float* in, void* out, uint64_t n, cudaStream_t stream) {
  ToBf16Kernel<<<BlocksFor(n), kThreads, 0, stream>>>(in, static_cast<__nv_bfloat16*>(out), n);
}

}  // namespace moelab::cudaopt
