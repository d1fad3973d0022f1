#include "kernels/cpu/cross_entropy.h"

#include <algorithm>
#include <cmath>

#include "kernels/cpu/vecmath.h"

namespace moelab::cpu {

template <typename T>
CrossEntropyResult CrossEntropy(T* logits, const int32_t* targets, int n, int vocab, double z_coef,
                                bool backward, double* row_scratch) {
  double* ce_rows = row_scratch;       // [n] CE_i
  double* lse_rows = row_scratch + n;  // [n] logsumexp_i (for the z-loss)
  const T inv_n = T(1) / T(n);
  double ce_sum = 0, z_sum = 0;
  const bool par = static_cast<long>(n) * vocab > 16384;
#pragma omp parallel for schedule(static) if (par)
  for (int i = 0; i < n; ++i) {
    T* x = logits + static_cast<long>(i) * vocab;
    const int t = targets[i];
    const double xt = static_cast<double>(x[t]);
    T m = x[0];
#pragma omp simd reduction(max : m)
    for (int j = 1; j < vocab; ++j) m = std::max(m, x[j]);
    // Exponentials are written in place when the gradient is wanted (they become softmax).
    T sum = 0;
    if (backward) {
#pragma omp simd reduction(+ : sum)
      for (int j = 0; j < vocab; ++j) {
        x[j] = Exp<T>(x[j] - m);
        sum += x[j];
      }
    } else {
#pragma omp simd reduction(+ : sum)
      for (int j = 0; j < vocab; ++j) sum += Exp<T>(x[j] - m);
    }
    const double lse = static_cast<double>(m) + std::log(static_cast<double>(sum));
    ce_rows[i] = lse - xt;
    lse_rows[i] = lse;
    if (backward) {
      const T inv = T(1) / sum;
      const T coef = static_cast<T>((1.0 + 2.0 * z_coef * lse)) * inv_n * inv;
#pragma omp simd
      for (int j = 0; j < vocab; ++j) x[j] *= coef;
      x[t] -= inv_n;
    }
  }
  for (int i = 0; i < n; ++i) ce_sum += ce_rows[i];
  if (z_coef != 0)
    for (int i = 0; i < n; ++i) z_sum += lse_rows[i] * lse_rows[i];
  return {ce_sum / n, z_coef * z_sum / n};
}

template CrossEntropyResult CrossEntropy<float>(float*, const int32_t*, int, int, double, bool,
                                                double*);
template CrossEntropyResult CrossEntropy<double>(double*, const int32_t*, int, int, double, bool,
                                                 double*);

}  // namespace moelab::cpu
