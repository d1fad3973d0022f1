#include "core/model/cuda_backend_kernels.h"

namespace moelab::cudamodel {
namespace {

constexpr int kThreads = 256;

unsigned Blocks(size_t n) {
  const size_t b = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(b < 1 ? 1 : (b > 65535 ? 65535 : b));
}

__global__ void AddKernel(const float* a, const float* b, float* out, size_t n) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    out[i] = __fadd_rn(a[i], b[i]);
  }
}

__global__ void CopyHeadsKernel(const float* src, int lds, int src_stride, int src_off, float* dst,
                                int ldd, int dst_stride, int dst_off, int n, int heads, int width,
                                bool accumulate) {
  const size_t total = static_cast<size_t>(n) * heads * width;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const int j = static_cast<int>(i % width);
    const int h = static_cast<int>((i / width) % heads);
    const size_t r = i / (static_cast<size_t>(width) * heads);
    const float v = src[r * lds + static_cast<size_t>(h) * src_stride + src_off + j];
    float* d = dst + r * ldd + static_cast<size_t>(h) * dst_stride + dst_off + j;
    *d = accumulate ? __fadd_rn(*d, v) : v;
  }
}

__global__ void SumHeadsKernel(const float* src, int lds, int src_stride, int src_off, float* dst,
                               int ldd, int n, int heads, int width) {
  const size_t total = static_cast<size_t>(n) * width;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const int j = static_cast<int>(i % width);
    const size_t r = i / width;
    float s = 0;
    for (int h = 0; h < heads; ++h) {
      s = __fadd_rn(s, src[r * lds + static_cast<size_t>(h) * src_stride + src_off + j]);
    }
    dst[r * ldd + j] = s;
  }
}

__global__ void AxpyKernel(const float* g, float w, bool first, float* acc, size_t n) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    // Separate multiply and add (no FMA contraction), as the CPU accumulator's loop.
    const float v = __fmul_rn(w, g[i]);
    acc[i] = first ? v : __fadd_rn(acc[i], v);
  }
}

__global__ void FinishAxpyKernel(const float* acc, float w, float* g, size_t n) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    g[i] = __fadd_rn(acc[i], __fmul_rn(w, g[i]));
  }
}

}  // namespace

void Axpy(const float* g, float w, bool first, float* acc, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  AxpyKernel<<<Blocks(n), kThreads, 0, stream>>>(g, w, first, acc, n);
}

void FinishAxpy(const float* acc, float w, float* g, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  FinishAxpyKernel<<<Blocks(n), kThreads, 0, stream>>>(acc, w, g, n);
}

void Add(const float* a, const float* b, float* out, size_t n, cudaStream_t stream) {
  if (n) AddKernel<<<Blocks(n), kThreads, 0, stream>>>(a, b, out, n);
}

void CopyHeads(const float* src, int lds, int src_stride, int src_off, float* dst, int ldd,
               int dst_stride, int dst_off, int n, int heads, int width, bool accumulate,
               cudaStream_t stream) {
  const size_t total = static_cast<size_t>(n) * heads * width;
  if (total == 0) return;
  CopyHeadsKernel<<<Blocks(total), kThreads, 0, stream>>>(
      src, lds, src_stride, src_off, dst, ldd, dst_stride, dst_off, n, heads, width, accumulate);
}

void SumHeads(const float* src, int lds, int src_stride, int src_off, float* dst, int ldd, int n,
              int heads, int width, cudaStream_t stream) {
  const size_t total = static_cast<size_t>(n) * width;
  if (total == 0) return;
  SumHeadsKernel<<<Blocks(total), kThreads, 0, stream>>>(src, lds, src_stride, src_off, dst, ldd, n,
                                                         heads, width);
}

}  // namespace moelab::cudamodel
