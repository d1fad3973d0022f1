// Row-major GEMM on OpenBLAS for float and double, and the linear-layer helpers built on it.
// A linear layer stores W as [out, in] and computes y = x·Wᵀ.
#pragma once

#include <cblas.h>

namespace moelab::cpu {

// C[m,n] = alpha·op(A)·op(B) + beta·C, all row-major.
inline void Gemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a,
                 int lda, const float* b, int ldb, float beta, float* c, int ldc) {
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
              trans_b ? CblasTrans : CblasNoTrans, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}
inline void Gemm(bool trans_a, bool trans_b, int m, int n, int k, double alpha, const double* a,
                 int lda, const double* b, int ldb, double beta, double* c, int ldc) {
  cblas_dgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
              trans_b ? CblasTrans : CblasNoTrans, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

// y[n,out] = x[n,in]·W[out,in]ᵀ (+ y if accumulate).
template <typename T>
void LinearForward(const T* x, const T* w, int n, int in, int out, T* y, bool accumulate = false) {
  Gemm(false, true, n, out, in, T(1), x, in, w, in, accumulate ? T(1) : T(0), y, out);
}

// dx[n,in] (= or +=) dy[n,out]·W[out,in]; dW[out,in] (= or +=) dy[n,out]ᵀ·x[n,in].
// Either output may be null to skip it.
template <typename T>
void LinearBackward(const T* x, const T* w, const T* dy, int n, int in, int out, T* dx, T* dw,
                    bool accumulate_dx = false, bool accumulate_dw = false) {
  if (dx) Gemm(false, false, n, in, out, T(1), dy, out, w, in, accumulate_dx ? T(1) : T(0), dx, in);
  if (dw) Gemm(true, false, out, in, n, T(1), dy, out, x, in, accumulate_dw ? T(1) : T(0), dw, in);
}

}  // namespace moelab::cpu
