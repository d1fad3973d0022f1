#include <cublas_api.h>
#include <cuda_runtime.h>

#include <stdexcept>
#include <vector>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/gemm.h"

namespace moelab::cuda {
namespace {

cublasOperation_t Op(bool trans) { return trans ? CUBLAS_OP_T : CUBLAS_OP_N; }

template <typename T>
constexpr cudaDataType_t DataType();
template <>
constexpr cudaDataType_t DataType<float>() {
  return CUDA_R_32F;
}
template <>
constexpr cudaDataType_t DataType<bf16>() {
  return CUDA_R_16BF;
}

// Row-major C = op(A)·op(B) as column-major Cᵀ = op(B)ᵀ·op(A)ᵀ: swap the operands and m/n.
template <typename TA, typename TC>
void GemmEx(bool ta, bool tb, int m, int n, int k, float alpha, const TA* a, int lda, const TA* b,
            int ldb, float beta, TC* c, int ldc, cudaStream_t stream) {
  if (m <= 0 || n <= 0) return;
  cublasHandle_t h = Cublas(stream);
  if constexpr (std::is_same_v<TA, float> && std::is_same_v<TC, float>) {
    MOELAB_CUBLAS_CHECK(
        cublasSgemm(h, Op(tb), Op(ta), n, m, k, &alpha, b, ldb, a, lda, &beta, c, ldc));
  } else {
    MOELAB_CUBLAS_CHECK(cublasGemmEx(h, Op(tb), Op(ta), n, m, k, &alpha, b, DataType<TA>(), ldb, a,
                                     DataType<TA>(), lda, &beta, c, DataType<TC>(), ldc,
                                     CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  }
}

template <typename TA, typename TC>
void GemmBatchedEx(bool ta, bool tb, int m, int n, int k, float alpha, const TA* a, int lda,
                   int64_t sa, const TA* b, int ldb, int64_t sb, float beta, TC* c, int ldc,
                   int64_t sc, int batch, cudaStream_t stream) {
  if (m <= 0 || n <= 0 || batch <= 0) return;
  cublasHandle_t h = Cublas(stream);
  if constexpr (std::is_same_v<TA, float> && std::is_same_v<TC, float>) {
    MOELAB_CUBLAS_CHECK(cublasSgemmStridedBatched(h, Op(tb), Op(ta), n, m, k, &alpha, b, ldb, sb, a,
                                                  lda, sa, &beta, c, ldc, sc, batch));
  } else {
    MOELAB_CUBLAS_CHECK(cublasGemmStridedBatchedEx(
        h, Op(tb), Op(ta), n, m, k, &alpha, b, DataType<TA>(), ldb, sb, a, DataType<TA>(), lda, sa,
        &beta, c, DataType<TC>(), ldc, sc, batch, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  }
}

}  // namespace

void Gemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a, int lda,
          const float* b, int ldb, float beta, float* c, int ldc, cudaStream_t stream) {
  GemmEx(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, stream);
}
void Gemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const bf16* a, int lda,
          const bf16* b, int ldb, float beta, float* c, int ldc, cudaStream_t stream) {
  GemmEx(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, stream);
}
void Gemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const bf16* a, int lda,
          const bf16* b, int ldb, float beta, bf16* c, int ldc, cudaStream_t stream) {
  GemmEx(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, stream);
}

void GemmStridedBatched(bool trans_a, bool trans_b, int m, int n, int k, float alpha,
                        const float* a, int lda, int64_t stride_a, const float* b, int ldb,
                        int64_t stride_b, float beta, float* c, int ldc, int64_t stride_c,
                        int batch, cudaStream_t stream) {
  GemmBatchedEx(trans_a, trans_b, m, n, k, alpha, a, lda, stride_a, b, ldb, stride_b, beta, c, ldc,
                stride_c, batch, stream);
}
void GemmStridedBatched(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const bf16* a,
                        int lda, int64_t stride_a, const bf16* b, int ldb, int64_t stride_b,
                        float beta, float* c, int ldc, int64_t stride_c, int batch,
                        cudaStream_t stream) {
  GemmBatchedEx(trans_a, trans_b, m, n, k, alpha, a, lda, stride_a, b, ldb, stride_b, beta, c, ldc,
                stride_c, batch, stream);
}
void GemmStridedBatched(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const bf16* a,
                        int lda, int64_t stride_a, const bf16* b, int ldb, int64_t stride_b,
                        float beta, bf16* c, int ldc, int64_t stride_c, int batch,
                        cudaStream_t stream) {
  GemmBatchedEx(trans_a, trans_b, m, n, k, alpha, a, lda, stride_a, b, ldb, stride_b, beta, c, ldc,
                stride_c, batch, stream);
}

template <typename T>
void LinearForward(const T* x, const T* w, int n, int in, int out, float* y, bool accumulate,
                   cudaStream_t stream) {
  GemmEx(false, true, n, out, in, 1.0f, x, in, w, in, accumulate ? 1.0f : 0.0f, y, out, stream);
}

template <typename T>
void LinearBackward(const T* x, const T* w, const T* dy, int n, int in, int out, float* dx,
                    float* dw, bool accumulate_dx, bool accumulate_dw, cudaStream_t stream) {
  if (dx) {
    GemmEx(false, false, n, in, out, 1.0f, dy, out, w, in, accumulate_dx ? 1.0f : 0.0f, dx, in,
           stream);
  }
  if (dw) {
    GemmEx(true, false, out, in, n, 1.0f, dy, out, x, in, accumulate_dw ? 1.0f : 0.0f, dw, in,
           stream);
  }
}

template void LinearForward<float>(const float*, const float*, int, int, int, float*, bool,
                                   cudaStream_t);
template void LinearForward<bf16>(const bf16*, const bf16*, int, int, int, float*, bool,
                                  cudaStream_t);
template void LinearBackward<float>(const float*, const float*, const float*, int, int, int, float*,
                                    float*, bool, bool, cudaStream_t);
template void LinearBackward<bf16>(const bf16*, const bf16*, const bf16*, int, int, int, float*,
                                   float*, bool, bool, cudaStream_t);

template <typename TA, typename TC>
void GemmGrouped(bool trans_a, bool trans_b, float alpha, float beta,
                 const std::vector<GemmGroup<TA, TC>>& groups, cudaStream_t stream) {
  std::vector<const GemmGroup<TA, TC>*> live;
  for (const auto& g : groups) {
    if (g.m > 0 && g.n > 0 && g.k > 0) live.push_back(&g);
  }
  if (live.empty()) return;
  bool done = false;
#if defined(CUBLAS_VER_MAJOR) && \
    (CUBLAS_VER_MAJOR > 12 || (CUBLAS_VER_MAJOR == 12 && CUBLAS_VER_MINOR >= 5))
  // A toolkit/GPU combination that refuses the grouped call (CUBLAS_STATUS_NOT_SUPPORTED) is
  // remembered and served by the per-group loop from then on.
  static thread_local bool grouped_refused = false;
  if (std::is_same_v<TA, TC> && !grouped_refused) {
    const int count = static_cast<int>(live.size());
    // Column-major view: each group is Cᵀ[n,m] = op(B)ᵀ·op(A)ᵀ (operands swapped).
    std::vector<cublasOperation_t> op_first(count, Op(trans_b)), op_second(count, Op(trans_a));
    std::vector<int> m(count), n(count), k(count), lda(count), ldb(count), ldc(count),
        size(count, 1);
    std::vector<float> alphas(count, alpha), betas(count, beta);
    std::vector<const void*> ptrs(3 * static_cast<size_t>(count));
    for (int i = 0; i < count; ++i) {
      const auto& g = *live[i];
      m[i] = g.n, n[i] = g.m, k[i] = g.k;
      lda[i] = g.ldb, ldb[i] = g.lda, ldc[i] = g.ldc;
      ptrs[i] = g.b;
      ptrs[count + i] = g.a;
      ptrs[2 * count + i] = g.c;
    }
    void* dev = ThreadScratch(ptrs.size() * sizeof(void*));
    MOELAB_CUDA_CHECK(cudaMemcpyAsync(dev, ptrs.data(), ptrs.size() * sizeof(void*),
                                      cudaMemcpyHostToDevice, stream));
    void** d_ptrs = static_cast<void**>(dev);
    const void* const* d_first = d_ptrs;
    const void* const* d_second = d_ptrs + count;
    void* const* d_c = d_ptrs + 2 * count;
    const cublasStatus_t status = cublasGemmGroupedBatchedEx(
        Cublas(stream), op_first.data(), op_second.data(), m.data(), n.data(), k.data(),
        alphas.data(), d_first, DataType<TA>(), lda.data(), d_second, DataType<TA>(), ldb.data(),
        betas.data(), d_c, DataType<TC>(), ldc.data(), count, size.data(), CUBLAS_COMPUTE_32F);
    if (status == CUBLAS_STATUS_NOT_SUPPORTED) {
      grouped_refused = true;
    } else {
      CheckCublas(status, "cublasGemmGroupedBatchedEx");
      done = true;
    }
    // The host arrays above are consumed by the call; the pointer copy was staged before
    // cudaMemcpyAsync returned (pageable source), so nothing outlives this scope.
  }
#endif
  if (!done) {
    for (const auto* g : live) {
      GemmEx(trans_a, trans_b, g->m, g->n, g->k, alpha, g->a, g->lda, g->b, g->ldb, beta, g->c,
             g->ldc, stream);
    }
  }
}

template <typename TA, typename TC>
void GemmPointerBatched(bool trans_a, bool trans_b, int m, int n, int k, float alpha,
                        const std::vector<const TA*>& a, int lda, const std::vector<const TA*>& b,
                        int ldb, float beta, const std::vector<TC*>& c, int ldc,
                        cudaStream_t stream) {
  const int batch = static_cast<int>(a.size());
  if (b.size() != a.size() || c.size() != a.size()) {
    throw std::invalid_argument("GemmPointerBatched: a, b and c differ in length");
  }
  if (m <= 0 || n <= 0 || batch == 0) return;
  // Column-major view (as GemmEx): Cᵀ = op(B)ᵀ·op(A)ᵀ, so B's pointers go first.
  std::vector<const void*> ptrs(3 * static_cast<size_t>(batch));
  for (int i = 0; i < batch; ++i) {
    ptrs[i] = b[i];
    ptrs[batch + i] = a[i];
    ptrs[2 * batch + i] = c[i];
  }
  // Stream-ordered reuse of the thread's scratch, as GemmGrouped: the pageable copy is staged
  // before cudaMemcpyAsync returns, and the next caller's copy queues behind this GEMM.
  void** d = static_cast<void**>(ThreadScratch(ptrs.size() * sizeof(void*)));
  MOELAB_CUDA_CHECK(
      cudaMemcpyAsync(d, ptrs.data(), ptrs.size() * sizeof(void*), cudaMemcpyHostToDevice, stream));
  MOELAB_CUBLAS_CHECK(cublasGemmBatchedEx(Cublas(stream), Op(trans_b), Op(trans_a), n, m, k, &alpha,
                                          d, DataType<TA>(), ldb, d + batch, DataType<TA>(), lda,
                                          &beta, d + 2 * batch, DataType<TC>(), ldc, batch,
                                          CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

template void GemmPointerBatched<bf16, bf16>(bool, bool, int, int, int, float,
                                             const std::vector<const bf16*>&, int,
                                             const std::vector<const bf16*>&, int, float,
                                             const std::vector<bf16*>&, int, cudaStream_t);
template void GemmPointerBatched<bf16, float>(bool, bool, int, int, int, float,
                                              const std::vector<const bf16*>&, int,
                                              const std::vector<const bf16*>&, int, float,
                                              const std::vector<float*>&, int, cudaStream_t);

template void GemmGrouped<float, float>(bool, bool, float, float,
                                        const std::vector<GemmGroup<float, float>>&, cudaStream_t);
template void GemmGrouped<bf16, float>(bool, bool, float, float,
                                       const std::vector<GemmGroup<bf16, float>>&, cudaStream_t);
template void GemmGrouped<bf16, bf16>(bool, bool, float, float,
                                      const std::vector<GemmGroup<bf16, bf16>>&, cudaStream_t);

namespace {
// Deterministic pseudo-random values in [-1, 1) (an integer hash), so the probe multiplies
// realistic data rather than zeros (power draw, and so the rate, depends on it).
__global__ void HashFillBf16(bf16* x, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ seed;
    h ^= h >> 16;
    h *= 0x7feb352du;
    h ^= h >> 15;
    x[i] = __float2bfloat16(static_cast<float>(h & 0xffffff) / 8388608.0f - 1.0f);
  }
}
}  // namespace

GemmRate ProbeBf16GemmRate(int n, int iters, int warmup) {
  std::string reason;
  if (!CudaAvailable(&reason)) throw std::runtime_error(reason);
  GemmRate rate;
  rate.n = n;
  rate.iters = iters;
  int device = 0;
  MOELAB_CUDA_CHECK(cudaGetDevice(&device));
  cudaDeviceProp prop{};
  MOELAB_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  rate.device_name = prop.name;
  const size_t elems = static_cast<size_t>(n) * n;
  DeviceBuffer<bf16> a(elems), b(elems), c(elems);
  HashFillBf16<<<detail::Blocks(elems, 256), 256>>>(a.data(), elems, 1u);
  HashFillBf16<<<detail::Blocks(elems, 256), 256>>>(b.data(), elems, 2u);
  CheckLaunch("HashFillBf16");
  const float scale = 1.0f / n;
  for (int i = 0; i < warmup; ++i) {
    Gemm(false, false, n, n, n, scale, a.data(), n, b.data(), n, 0.0f, c.data(), n);
  }
  EventTimer timer;
  timer.Start();
  for (int i = 0; i < iters; ++i) {
    Gemm(false, false, n, n, n, scale, a.data(), n, b.data(), n, 0.0f, c.data(), n);
  }
  timer.Stop();
  rate.seconds_per_gemm = timer.Seconds() / iters;
  rate.flops_per_s = 2.0 * n * double(n) * n / rate.seconds_per_gemm;
  return rate;
}

}  // namespace moelab::cuda
