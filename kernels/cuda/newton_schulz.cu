#include <cuda_runtime.h>

#include <cmath>
#include <utility>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/newton_schulz.h"

namespace moelab::cuda {
namespace {

// x = in / (‖in‖_F + eps) per matrix; one block per matrix, the sum of squares in double.
template <typename T>
__global__ void NormalizeKernel(const T* in, T* x, size_t mn, double eps) {
  __shared__ double shared[32];
  const T* src = in + blockIdx.x * mn;
  T* dst = x + blockIdx.x * mn;
  double ss = 0;
  for (size_t i = threadIdx.x; i < mn; i += blockDim.x) {
    const double v = detail::ToFloat(src[i]);
    ss += v * v;
  }
  ss = detail::BlockSum(ss, shared);
  const float inv = static_cast<float>(1.0 / (sqrt(ss) + eps));
  for (size_t i = threadIdx.x; i < mn; i += blockDim.x) {
    dst[i] = detail::FromFloat<T>(inv * detail::ToFloat(src[i]));
  }
}

// b[i,i] += a for every matrix of the batch.
template <typename T>
__global__ void AddDiagonalKernel(T* b, int m, int batch, float a) {
  const long idx = blockIdx.x * long(blockDim.x) + threadIdx.x;
  if (idx >= long(m) * batch) return;
  const long mat = idx / m, i = idx % m;
  T* p = b + mat * long(m) * m + i * m + i;
  *p = detail::FromFloat<T>(detail::ToFloat(*p) + a);
}

}  // namespace

size_t NewtonSchulzWorkspaceSize(int batch, int rows, int cols) {
  const size_t m = std::min(rows, cols), n = std::max(rows, cols);
  return static_cast<size_t>(batch) * (2 * m * n + 2 * m * m);
}

template <typename T>
void NewtonSchulz(const T* in, T* out, int batch, int rows, int cols, int steps, T* workspace,
                  cudaStream_t stream) {
  if (batch <= 0 || rows <= 0 || cols <= 0) return;
  const bool tall = rows > cols;
  const int m = tall ? cols : rows;
  const int n = tall ? rows : cols;
  const int64_t mn = static_cast<int64_t>(m) * n, mm = static_cast<int64_t>(m) * m;
  T* x = workspace;
  T* y = x + batch * mn;
  T* a = y + batch * mn;
  T* b = a + batch * mm;
  NormalizeKernel<<<batch, 256, 0, stream>>>(in, x, static_cast<size_t>(mn), cpu::kNsEps);
  CheckLaunch("NewtonSchulz normalise");
  if (steps <= 0) {
    MOELAB_CUDA_CHECK(
        cudaMemcpyAsync(out, x, sizeof(T) * batch * mn, cudaMemcpyDeviceToDevice, stream));
    return;
  }
  const float ca = static_cast<float>(cpu::kNsA), cb = static_cast<float>(cpu::kNsB),
              cc = static_cast<float>(cpu::kNsC);
  for (int s = 0; s < steps; ++s) {
    T* dst = s + 1 == steps ? out : y;
    // A = X·Xᵀ (wide, X [m,n]) or XᵀX (tall, X [n,m]): the small m×m Gram matrix.
    if (tall) {
      GemmStridedBatched(true, false, m, m, n, 1.0f, x, m, mn, x, m, mn, 0.0f, a, m, mm, batch,
                         stream);
    } else {
      GemmStridedBatched(false, true, m, m, n, 1.0f, x, n, mn, x, n, mn, 0.0f, a, m, mm, batch,
                         stream);
    }
    // B = b·A + c·A·A + a·I.
    MOELAB_CUDA_CHECK(
        cudaMemcpyAsync(b, a, sizeof(T) * batch * mm, cudaMemcpyDeviceToDevice, stream));
    GemmStridedBatched(false, false, m, m, m, cc, a, m, mm, a, m, mm, cb, b, m, mm, batch, stream);
    const long diag = static_cast<long>(m) * batch;
    AddDiagonalKernel<<<(diag + 255) / 256, 256, 0, stream>>>(b, m, batch, ca);
    CheckLaunch("NewtonSchulz diagonal");
    // X ← B·X (wide) or X·B (tall).
    if (tall) {
      GemmStridedBatched(false, false, n, m, m, 1.0f, x, m, mn, b, m, mm, 0.0f, dst, m, mn, batch,
                         stream);
    } else {
      GemmStridedBatched(false, false, m, n, m, 1.0f, b, m, mm, x, n, mn, 0.0f, dst, n, mn, batch,
                         stream);
    }
    std::swap(x, y);
  }
}

template void NewtonSchulz<float>(const float*, float*, int, int, int, int, float*, cudaStream_t);
template void NewtonSchulz<bf16>(const bf16*, bf16*, int, int, int, int, bf16*, cudaStream_t);

}  // namespace moelab::cuda
