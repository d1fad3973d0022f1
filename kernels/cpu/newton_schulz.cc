#include "kernels/cpu/newton_schulz.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

namespace moelab::cpu {
namespace {

// Below this many elements per matrix one BLAS call on all threads scales worse than giving
// each thread whole matrices (measured in bench/newton_schulz_bench.cc, see docs/optimizers.md).
constexpr size_t kBatchParallelMaxElems = size_t{2048} * 2048;

// Row-major C(upper) [n,n] = alpha·op(A)·op(A)ᵀ + beta·C(upper); op(A) = A [n,k], or Aᵀ for
// A [k,n] when trans.
inline void Syrk(bool trans, int n, int k, float alpha, const float* a, int lda, float beta,
                 float* c, int ldc) {
  cblas_ssyrk(CblasRowMajor, CblasUpper, trans ? CblasTrans : CblasNoTrans, n, k, alpha, a, lda,
              beta, c, ldc);
}
inline void Syrk(bool trans, int n, int k, double alpha, const double* a, int lda, double beta,
                 double* c, int ldc) {
  cblas_dsyrk(CblasRowMajor, CblasUpper, trans ? CblasTrans : CblasNoTrans, n, k, alpha, a, lda,
              beta, c, ldc);
}
// Row-major C [m,n] = alpha·S·B (left) or alpha·B·S (right) + beta·C, S symmetric (upper
// triangle read), S [m,m] on the left, [n,n] on the right.
inline void Symm(bool right, int m, int n, float alpha, const float* s, int lds, const float* b,
                 int ldb, float beta, float* c, int ldc) {
  cblas_ssymm(CblasRowMajor, right ? CblasRight : CblasLeft, CblasUpper, m, n, alpha, s, lds, b,
              ldb, beta, c, ldc);
}
inline void Symm(bool right, int m, int n, double alpha, const double* s, int lds, const double* b,
                 int ldb, double beta, double* c, int ldc) {
  cblas_dsymm(CblasRowMajor, right ? CblasRight : CblasLeft, CblasUpper, m, n, alpha, s, lds, b,
              ldb, beta, c, ldc);
}
inline void Gemm(bool ta, bool tb, int m, int n, int k, float alpha, const float* a, int lda,
                 const float* b, int ldb, float beta, float* c, int ldc) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m, n,
              k, alpha, a, lda, b, ldb, beta, c, ldc);
}
inline void Gemm(bool ta, bool tb, int m, int n, int k, double alpha, const double* a, int lda,
                 const double* b, int ldb, double beta, double* c, int ldc) {
  cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m, n,
              k, alpha, a, lda, b, ldb, beta, c, ldc);
}

// Mirrors the upper triangle of a row-major m×m matrix into the lower one, in tiles so both the
// read (a column of the upper part) and the write stay in cache.
template <typename T>
void FillLowerFromUpper(T* a, int m) {
  constexpr int kTile = 64;
  for (int ib = 0; ib < m; ib += kTile) {
    const int ie = std::min(m, ib + kTile);
    for (int jb = 0; jb <= ib; jb += kTile) {
      const int je = std::min(m, jb + kTile);
      for (int i = ib; i < ie; ++i) {
        const int jend = std::min(je, i);
        for (int j = jb; j < jend; ++j)
          a[static_cast<size_t>(i) * m + j] = a[static_cast<size_t>(j) * m + i];
      }
    }
  }
}

// One matrix; slot holds x, y [m·n] and a, b [m·m] with m = min(rows, cols), n = max.
// A tall X (rows > cols) is iterated as X ← X·(a·I + b·A + c·A²) with the small Gram A = XᵀX:
// exactly the transposed wide iteration, without moving the data twice.
template <typename T>
void NewtonSchulzOne(const T* in, T* out, int rows, int cols, const NewtonSchulzOptions& opt,
                     T* slot) {
  const bool tall = rows > cols;
  const int m = tall ? cols : rows;
  const int n = tall ? rows : cols;
  const size_t mn = static_cast<size_t>(m) * n;
  const size_t mm = static_cast<size_t>(m) * m;
  T* x = slot;
  T* y = x + mn;
  T* a = y + mn;
  T* b = a + mm;

  // The norm is accumulated in double so float inputs of any size normalise the same way.
  double ss = 0;
#pragma omp simd reduction(+ : ss)
  for (size_t i = 0; i < mn; ++i) ss += static_cast<double>(in[i]) * in[i];
  const T inv = static_cast<T>(1.0 / (std::sqrt(ss) + kNsEps));
#pragma omp simd
  for (size_t i = 0; i < mn; ++i) x[i] = inv * in[i];
  if (opt.steps <= 0) {
    std::memcpy(out, x, mn * sizeof(T));
    return;
  }

  const T ca = static_cast<T>(kNsA), cb = static_cast<T>(kNsB), cc = static_cast<T>(kNsC);
  for (int s = 0; s < opt.steps; ++s) {
    // The last step writes the result in place: `in` was consumed by the normalisation above, so
    // out may alias it.
    T* dst = s + 1 == opt.steps ? out : y;
    if (opt.kernel == NsKernel::kGemm) {
      if (tall) {
        Gemm(true, false, m, m, n, T(1), x, m, x, m, T(0), a, m);
      } else {
        Gemm(false, true, m, m, n, T(1), x, n, x, n, T(0), a, m);
      }
      std::memcpy(b, a, mm * sizeof(T));
      Gemm(false, false, m, m, m, cc, a, m, a, m, cb, b, m);
    } else {
      Syrk(tall, m, n, T(1), x, tall ? m : n, T(0), a, m);
      // A·A = A·Aᵀ for symmetric A, so the quintic's square is a second SYRK; it reads whole
      // rows of A, hence the fill. B starts as A (only its upper triangle matters) for beta = b.
      FillLowerFromUpper(a, m);
      std::memcpy(b, a, mm * sizeof(T));
      Syrk(false, m, m, cc, a, m, cb, b, m);
    }
    // a·X + B·X = (B + a·I)·X: folding a into the diagonal saves an m×n pass.
    for (int i = 0; i < m; ++i) b[static_cast<size_t>(i) * m + i] += ca;
    if (opt.kernel == NsKernel::kSyrkSymm) {
      if (tall) {
        Symm(true, n, m, T(1), b, m, x, m, T(0), dst, m);
      } else {
        Symm(false, m, n, T(1), b, m, x, n, T(0), dst, n);
      }
    } else {
      if (opt.kernel == NsKernel::kSyrkFillGemm) FillLowerFromUpper(b, m);
      if (tall) {
        Gemm(false, false, n, m, m, T(1), x, m, b, m, T(0), dst, m);
      } else {
        Gemm(false, false, m, n, m, T(1), b, m, x, n, T(0), dst, n);
      }
    }
    std::swap(x, y);
  }
}

// kGram for one matrix (needs n ≥ 2m: the y half of the slot holds Q and a work matrix).
template <typename T>
void NewtonSchulzGramOne(const T* in, T* out, int rows, int cols, const NewtonSchulzOptions& opt,
                         T* slot) {
  const bool tall = rows > cols;
  const int m = tall ? cols : rows;
  const int n = tall ? rows : cols;
  const size_t mn = static_cast<size_t>(m) * n;
  const size_t mm = static_cast<size_t>(m) * m;
  T* x = slot;
  T* q = x + mn;
  T* w = q + mm;
  T* a = x + 2 * mn;
  T* h = a + mm;

  double ss = 0;
#pragma omp simd reduction(+ : ss)
  for (size_t i = 0; i < mn; ++i) ss += static_cast<double>(in[i]) * in[i];
  const T inv = static_cast<T>(1.0 / (std::sqrt(ss) + kNsEps));
#pragma omp simd
  for (size_t i = 0; i < mn; ++i) x[i] = inv * in[i];

  const T ca = static_cast<T>(kNsA), cb = static_cast<T>(kNsB), cc = static_cast<T>(kNsC);
  Syrk(tall, m, n, T(1), x, tall ? m : n, T(0), a, m);
  FillLowerFromUpper(a, m);
  for (int s = 0; s < opt.steps; ++s) {
    Syrk(false, m, m, T(1), a, m, T(0), w, m);  // A²
    FillLowerFromUpper(w, m);
#pragma omp simd
    for (size_t i = 0; i < mm; ++i) h[i] = cc * w[i] + cb * a[i];
    for (int i = 0; i < m; ++i) h[static_cast<size_t>(i) * m + i] += ca;
    if (s == 0) {
      std::memcpy(q, h, mm * sizeof(T));
    } else {
      Gemm(false, false, m, m, m, T(1), q, m, h, m, T(0), w, m);
      std::swap(q, w);
    }
    if (s + 1 < opt.steps) {
      Syrk(false, m, m, T(1), h, m, T(0), w, m);  // H²
      FillLowerFromUpper(w, m);
      Gemm(false, false, m, m, m, T(1), a, m, w, m, T(0), h, m);  // A ← A·H²
      std::swap(a, h);
    }
  }
  if (opt.steps <= 0) {
    std::memcpy(out, x, mn * sizeof(T));
  } else if (tall) {
    Gemm(false, false, n, m, m, T(1), x, m, q, m, T(0), out, m);
  } else {
    Gemm(false, false, m, n, m, T(1), q, m, x, n, T(0), out, n);
  }
}

template <typename T>
void NewtonSchulzDispatch(const T* in, T* out, int rows, int cols, const NewtonSchulzOptions& opt,
                          T* slot) {
  if (opt.kernel == NsKernel::kGram && std::max(rows, cols) >= 2 * std::min(rows, cols)) {
    NewtonSchulzGramOne(in, out, rows, cols, opt, slot);
  } else if (opt.kernel == NsKernel::kGram) {
    NewtonSchulzOptions plain = opt;
    plain.kernel = NsKernel::kSyrkSymm;
    NewtonSchulzOne(in, out, rows, cols, plain, slot);
  } else {
    NewtonSchulzOne(in, out, rows, cols, opt, slot);
  }
}

}  // namespace

template <typename T>
void NewtonSchulzWorkspace<T>::Reserve(int slots, int rows, int cols) {
  const size_t m = static_cast<size_t>(std::min(rows, cols));
  const size_t n = static_cast<size_t>(std::max(rows, cols));
  per_slot_ = 2 * m * n + 2 * m * m;
  const size_t need = per_slot_ * static_cast<size_t>(slots);
  if (buf_.size() < need) buf_.resize(need);
}

template <typename T>
void NewtonSchulz(const T* in, T* out, int batch, int rows, int cols,
                  const NewtonSchulzOptions& options, NewtonSchulzWorkspace<T>* ws) {
  if (batch <= 0 || rows <= 0 || cols <= 0) return;
  thread_local NewtonSchulzWorkspace<T> cached;
  if (ws == nullptr) ws = &cached;
  const size_t elems = static_cast<size_t>(rows) * cols;
  const int threads = omp_in_parallel() ? 1 : omp_get_max_threads();

  int batch_parallel = 0;  // leading matrices handled one per thread
  if (threads > 1) {
    if (options.threading == NsThreading::kBatch) {
      batch_parallel = batch;
    } else if (options.threading == NsThreading::kAuto && elems <= kBatchParallelMaxElems) {
      batch_parallel = batch / threads * threads;
    }
  }
  if (batch_parallel > 0) {
    const int used = std::min(threads, batch_parallel);
    ws->Reserve(used, rows, cols);
    // OpenBLAS (OpenMP build) runs single-threaded inside a parallel region, which is what we
    // want here: whole matrices per thread, no BLAS-level synchronisation.
#pragma omp parallel for schedule(static) num_threads(used)
    for (int bi = 0; bi < batch_parallel; ++bi) {
      NewtonSchulzDispatch(in + bi * elems, out + bi * elems, rows, cols, options,
                           ws->slot(omp_get_thread_num()));
    }
  }
  if (batch_parallel < batch) {
    ws->Reserve(1, rows, cols);
    for (int bi = batch_parallel; bi < batch; ++bi)
      NewtonSchulzDispatch(in + bi * elems, out + bi * elems, rows, cols, options, ws->slot(0));
  }
}

double NewtonSchulzGemmFlops(int rows, int cols, int steps) {
  const double m = std::min(rows, cols), n = std::max(rows, cols);
  return steps * (4.0 * m * m * n + 2.0 * m * m * m);
}

double NewtonSchulzSyrkFlops(int rows, int cols, int steps) {
  const double m = std::min(rows, cols), n = std::max(rows, cols);
  return steps * (m * m * n + m * m * m + 2.0 * m * m * n);
}

double NewtonSchulzGramFlops(int rows, int cols, int steps) {
  const double m = std::min(rows, cols), n = std::max(rows, cols);
  if (steps <= 0) return 0;
  return 3.0 * m * m * n + (6.0 * steps - 5.0) * m * m * m;
}

template class NewtonSchulzWorkspace<float>;
template class NewtonSchulzWorkspace<double>;
template void NewtonSchulz<float>(const float*, float*, int, int, int, const NewtonSchulzOptions&,
                                  NewtonSchulzWorkspace<float>*);
template void NewtonSchulz<double>(const double*, double*, int, int, int,
                                   const NewtonSchulzOptions&, NewtonSchulzWorkspace<double>*);

}  // namespace moelab::cpu
