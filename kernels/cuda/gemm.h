// Row-major GEMMs on cuBLAS: the twins of kernels/cpu/gemm.h (fp32, true fp32: no TF32), plus
// the bf16 paths of the bf16 mode (bf16 inputs, fp32 accumulation, fp32 or bf16 output) through
// cublasGemmEx, strided-batched variants, and the bf16 GEMM rate probe of `bench --device cuda`.
// A row-major C = op(A)·op(B) is issued as the column-major Cᵀ = op(B)ᵀ·op(A)ᵀ, so no data
// moves. A linear layer stores W as [out, in] and computes y = x·Wᵀ.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/cuda/device.h"

namespace moelab::cuda {

// C[m,n] = alpha·op(A)·op(B) + beta·C.
void Gemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a, int lda,
          const float* b, int ldb, float beta, float* c, int ldc, cudaStream_t stream = nullptr);
// bf16 A and B, fp32 accumulation, fp32 C.
void Gemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const bf16* a, int lda,
          const bf16* b, int ldb, float beta, float* c, int ldc, cudaStream_t stream = nullptr);
// bf16 A and B, fp32 accumulation, bf16 C.
void Gemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const bf16* a, int lda,
          const bf16* b, int ldb, float beta, bf16* c, int ldc, cudaStream_t stream = nullptr);

// batch products C_i = alpha·op(A_i)·op(B_i) + beta·C_i with A_i = a + i·stride_a etc. (a stride
// of 0 broadcasts the operand).
void GemmStridedBatched(bool trans_a, bool trans_b, int m, int n, int k, float alpha,
                        const float* a, int lda, int64_t stride_a, const float* b, int ldb,
                        int64_t stride_b, float beta, float* c, int ldc, int64_t stride_c,
                        int batch, cudaStream_t stream = nullptr);
void GemmStridedBatched(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const bf16* a,
                        int lda, int64_t stride_a, const bf16* b, int ldb, int64_t stride_b,
                        float beta, float* c, int ldc, int64_t stride_c, int batch,
                        cudaStream_t stream = nullptr);
void GemmStridedBatched(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const bf16* a,
                        int lda, int64_t stride_a, const bf16* b, int ldb, int64_t stride_b,
                        float beta, bf16* c, int ldc, int64_t stride_c, int batch,
                        cudaStream_t stream = nullptr);

// y[n,out] = x[n,in]·W[out,in]ᵀ (+ y if accumulate). T = float, or bf16 x/w with fp32 y.
template <typename T>
void LinearForward(const T* x, const T* w, int n, int in, int out, float* y,
                   bool accumulate = false, cudaStream_t stream = nullptr);

// dx[n,in] (= or +=) dy[n,out]·W[out,in]; dW[out,in] (= or +=) dy[n,out]ᵀ·x[n,in]. Either output
// may be null. T = float, or bf16 x/w/dy with fp32 dx/dW (fp32 master gradients).
template <typename T>
void LinearBackward(const T* x, const T* w, const T* dy, int n, int in, int out, float* dx,
                    float* dw, bool accumulate_dx = false, bool accumulate_dw = false,
                    cudaStream_t stream = nullptr);

// One product of a grouped GEMM: C[m,n] = alpha·op(A)·op(B) + beta·C (row-major, as Gemm).
// Groups with m, n or k of 0 are skipped (k = 0 with beta != 1 still scales C: not supported,
// the caller zeroes such outputs itself).
template <typename TA, typename TC>
struct GemmGroup {
  int m = 0, n = 0, k = 0;
  const TA* a = nullptr;
  int lda = 0;
  const TA* b = nullptr;
  int ldb = 0;
  TC* c = nullptr;
  int ldc = 0;
};

// All groups in one cublasGemmGroupedBatchedEx call when the toolkit has it (CUDA >= 12.5) and
// the types allow it (fp32/fp32 or bf16/bf16), else one cublasGemmEx per group. Used for the
// MoE experts' variable-size row blocks. TA/TC: float/float, bf16/float, bf16/bf16.
template <typename TA, typename TC>
void GemmGrouped(bool trans_a, bool trans_b, float alpha, float beta,
                 const std::vector<GemmGroup<TA, TC>>& groups, cudaStream_t stream = nullptr);

// batch products of one shape, C_i = alpha·op(A_i)·op(B_i) + beta·C_i, the operands anywhere
// (host arrays of device pointers, copied to the device here; cublasGemmBatchedEx). The chunked
// expert layout's products: every chunk the same rows, its expert's weights. TA/TC: bf16/bf16,
// bf16/float.
template <typename TA, typename TC>
void GemmPointerBatched(bool trans_a, bool trans_b, int m, int n, int k, float alpha,
                        const std::vector<const TA*>& a, int lda, const std::vector<const TA*>& b,
                        int ldb, float beta, const std::vector<TC*>& c, int ldc,
                        cudaStream_t stream = nullptr);

// Measures cuBLAS's bf16 GEMM rate (bf16 in, fp32 accumulate, bf16 out) on an n×n×n product:
// allocates the operands, warms up, times `iters` products with CUDA events, frees. Returns
// FLOP/s (2n³·iters / seconds). Synchronises. Throws when no device is usable.
struct GemmRate {
  double flops_per_s = 0;
  double seconds_per_gemm = 0;
  int n = 0, iters = 0;
  std::string device_name;
};
GemmRate ProbeBf16GemmRate(int n = 8192, int iters = 20, int warmup = 3);

}  // namespace moelab::cuda
