// The CUDA Newton–Schulz: the iteration of newton_schulz_kernels.cuh on cuBLAS (strided-batched
// GEMMs for the full products, pointer-array batched GEMMs for the symmetric tiles).
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/newton_schulz.h"
#include "kernels/cuda/newton_schulz_kernels.cuh"

namespace moelab::cuda {
namespace {

constexpr int kThreads = 256;

template <typename T>
constexpr cudaDataType_t DataType() {
  return std::is_same_v<T, float> ? CUDA_R_32F : CUDA_R_16BF;
}

unsigned GridFor(int64_t n) {
  return static_cast<unsigned>(std::clamp<int64_t>((n + kThreads - 1) / kThreads, 1, 4096));
}

// Launches on `stream`; everything stream-ordered, nothing synchronises the host.
template <typename T>
struct CudaExec {
  cudaStream_t stream;

  void Normalize(const T* in, T* x, const ns::Plan& p, double eps) {
    ns::NormalizeKernel<<<p.batch, kThreads, 0, stream>>>(in, x, p.mn, eps);
    CheckLaunch("NewtonSchulz normalise");
  }
  // Stream-ordered thread scratch (kernels/cuda/device.h): no allocation per call once grown.
  void** Pointers(int64_t count) {
    return static_cast<void**>(ThreadScratch(sizeof(void*) * count));
  }
  void TilePointers(const ns::TileJob& job, const ns::Plan& p, void** a, void** b, void** c) {
    ns::TilePointersKernel<T>
        <<<GridFor(p.count()), kThreads, 0, stream>>>(job, p.pairs, p.count(), a, b, c);
    CheckLaunch("NewtonSchulz tile pointers");
  }
  void Mirror(T* a, const ns::Plan& p) {
    const int64_t total = p.batch * p.mm;
    ns::MirrorKernel<<<GridFor(total), kThreads, 0, stream>>>(a, p.m, p.tile, total);
    CheckLaunch("NewtonSchulz mirror");
  }
  void Combine(T* q, const T* a, const ns::Plan& p, float ca, float cb) {
    const int64_t total = p.batch * p.mm;
    ns::CombineKernel<<<GridFor(total), kThreads, 0, stream>>>(q, a, p.m, p.tile, total, ca, cb);
    CheckLaunch("NewtonSchulz combine");
  }
  void GemmStrided(bool ta, bool tb, int m, int n, int k, float alpha, const T* a, int lda,
                   int64_t sa, const T* b, int ldb, int64_t sb, float beta, T* c, int ldc,
                   int64_t sc, int batch) {
    GemmStridedBatched(ta, tb, m, n, k, alpha, a, lda, sa, b, ldb, sb, beta, c, ldc, sc, batch,
                       stream);
  }
  // Row-major C = op(A)·op(B) as column-major Cᵀ = op(B)ᵀ·op(A)ᵀ (gemm.h's convention), true
  // fp32 for float (the handle's default math mode: no TF32), fp32 accumulation for bf16.
  void GemmTiles(bool ta, bool tb, int m, int n, int k, float alpha, void** a, int lda, void** b,
                 int ldb, void** c, int ldc, int64_t count) {
    const float beta = 0.0f;
    MOELAB_CUBLAS_CHECK(cublasGemmBatchedEx(
        Cublas(stream), tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N, n, m, k,
        &alpha, b, DataType<T>(), ldb, a, DataType<T>(), lda, &beta, c, DataType<T>(), ldc,
        static_cast<int>(count), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  }
};

}  // namespace

size_t NewtonSchulzWorkspaceSize(int batch, int rows, int cols) {
  const size_t m = std::min(rows, cols), n = std::max(rows, cols);
  return static_cast<size_t>(batch) * (m * n + 2 * m * m);
}

template <typename T>
void NewtonSchulz(const T* in, T* out, int batch, int rows, int cols, int steps, T* workspace,
                  cudaStream_t stream, int min_tile) {
  if (batch <= 0 || rows <= 0 || cols <= 0) return;
  CudaExec<T> exec{stream};
  ns::NewtonSchulzSteps(exec, in, out, ns::MakePlan(batch, rows, cols, min_tile), steps, workspace,
                        cpu::kNsEps, static_cast<float>(cpu::kNsA), static_cast<float>(cpu::kNsB),
                        static_cast<float>(cpu::kNsC));
}

template void NewtonSchulz<float>(const float*, float*, int, int, int, int, float*, cudaStream_t,
                                  int);
template void NewtonSchulz<bf16>(const bf16*, bf16*, int, int, int, int, bf16*, cudaStream_t, int);

}  // namespace moelab::cuda
