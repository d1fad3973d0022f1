#include "kernels/cpu/norm.h"

#include <algorithm>
#include <cmath>

namespace moelab::cpu {

template <typename T>
void RmsNormForward(const T* x, const T* gain, int n, int d, double eps, T* y, T* rstd) {
  const bool par = static_cast<long>(n) * d > 16384;
#pragma omp parallel for schedule(static) if (par)
  for (int i = 0; i < n; ++i) {
    const T* xi = x + static_cast<long>(i) * d;
    T* yi = y + static_cast<long>(i) * d;
    T ss = 0;
#pragma omp simd reduction(+ : ss)
    for (int j = 0; j < d; ++j) ss += xi[j] * xi[j];
    const T r = static_cast<T>(1.0 / std::sqrt(static_cast<double>(ss) / d + eps));
    rstd[i] = r;
#pragma omp simd
    for (int j = 0; j < d; ++j) yi[j] = xi[j] * r * gain[j];
  }
}

template <typename T>
void AddRmsNormForward(const T* a, const T* b, T* sum, const T* gain, int n, int d, double eps,
                       T* y, T* rstd) {
  const long count = static_cast<long>(n) * d;
#pragma omp parallel for simd schedule(static) if (count > 65536)
  for (long i = 0; i < count; ++i) sum[i] = a[i] + b[i];
  RmsNormForward(sum, gain, n, d, eps, y, rstd);
}

template <typename T>
void RmsNormBackward(const T* x, const T* gain, const T* rstd, const T* dy, int n, int d, T* dx,
                     T* dgain, bool accumulate_dx) {
  const bool big = static_cast<long>(n) * d > 16384;
  // dx = r·(g⊙dy − x̂·mean(g⊙dy⊙x̂)) with x̂ = x·r.
#pragma omp parallel for schedule(static) if (big)
  for (int i = 0; i < n; ++i) {
    const T* xi = x + static_cast<long>(i) * d;
    const T* dyi = dy + static_cast<long>(i) * d;
    T* dxi = dx + static_cast<long>(i) * d;
    const T r = rstd[i];
    T dot = 0;
#pragma omp simd reduction(+ : dot)
    for (int j = 0; j < d; ++j) dot += dyi[j] * gain[j] * xi[j];
    const T c = dot * r * r / d;
    if (accumulate_dx) {
#pragma omp simd
      for (int j = 0; j < d; ++j) dxi[j] += r * (dyi[j] * gain[j] - xi[j] * c);
    } else {
#pragma omp simd
      for (int j = 0; j < d; ++j) dxi[j] = r * (dyi[j] * gain[j] - xi[j] * c);
    }
  }
  // dgain[j] = Σ_i dy·x·r: each block of columns is owned by one thread and summed in row
  // order, so there are no per-thread partials and no thread-count dependence.
  constexpr int kBlock = 32;
  const int blocks = (d + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (big)
  for (int b = 0; b < blocks; ++b) {
    const int j0 = b * kBlock, j1 = std::min(d, j0 + kBlock);
    T acc[kBlock] = {};
    for (int i = 0; i < n; ++i) {
      const T* xi = x + static_cast<long>(i) * d;
      const T* dyi = dy + static_cast<long>(i) * d;
      const T r = rstd[i];
#pragma omp simd
      for (int j = j0; j < j1; ++j) acc[j - j0] += dyi[j] * xi[j] * r;
    }
    for (int j = j0; j < j1; ++j) dgain[j] = acc[j - j0];
  }
}

template <typename T>
void RmsNormGroupsForward(const T* x, int ldx, T* y, int ldy, int n, int groups, int d,
                          const T* gain, double eps, T* rstd) {
  const bool par = static_cast<long>(n) * groups * d > 16384;
#pragma omp parallel for schedule(static) if (par)
  for (int i = 0; i < n; ++i) {
    for (int g = 0; g < groups; ++g) {
      const T* xi = x + static_cast<long>(i) * ldx + static_cast<long>(g) * d;
      T* yi = y + static_cast<long>(i) * ldy + static_cast<long>(g) * d;
      T ss = 0;
#pragma omp simd reduction(+ : ss)
      for (int j = 0; j < d; ++j) ss += xi[j] * xi[j];
      const T r = static_cast<T>(1.0 / std::sqrt(static_cast<double>(ss) / d + eps));
      rstd[static_cast<long>(i) * groups + g] = r;
#pragma omp simd
      for (int j = 0; j < d; ++j) yi[j] = xi[j] * r * gain[j];
    }
  }
}

template <typename T>
void RmsNormGroupsBackward(const T* x, int ldx, const T* gain, const T* rstd, const T* dy, int lddy,
                           T* dx, int lddx, int n, int groups, int d, T* dgain) {
  const bool par = static_cast<long>(n) * groups * d > 16384;
  // dgain first: dx may overwrite dy.
  constexpr int kBlock = 32;
  const int blocks = (d + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (par)
  for (int b = 0; b < blocks; ++b) {
    const int j0 = b * kBlock, j1 = std::min(d, j0 + kBlock);
    T acc[kBlock] = {};
    for (int i = 0; i < n; ++i) {
      for (int g = 0; g < groups; ++g) {
        const T* xi = x + static_cast<long>(i) * ldx + static_cast<long>(g) * d;
        const T* dyi = dy + static_cast<long>(i) * lddy + static_cast<long>(g) * d;
        const T r = rstd[static_cast<long>(i) * groups + g];
        for (int j = j0; j < j1; ++j) acc[j - j0] += dyi[j] * xi[j] * r;
      }
    }
    for (int j = j0; j < j1; ++j) dgain[j] = acc[j - j0];
  }
#pragma omp parallel for schedule(static) if (par)
  for (int i = 0; i < n; ++i) {
    for (int g = 0; g < groups; ++g) {
      const T* xi = x + static_cast<long>(i) * ldx + static_cast<long>(g) * d;
      const T* dyi = dy + static_cast<long>(i) * lddy + static_cast<long>(g) * d;
      T* dxi = dx + static_cast<long>(i) * lddx + static_cast<long>(g) * d;
      const T r = rstd[static_cast<long>(i) * groups + g];
      T dot = 0;
#pragma omp simd reduction(+ : dot)
      for (int j = 0; j < d; ++j) dot += dyi[j] * gain[j] * xi[j];
      const T c = dot * r * r / d;
      for (int j = 0; j < d; ++j) dxi[j] = r * (dyi[j] * gain[j] - xi[j] * c);
    }
  }
}

template void RmsNormGroupsForward<float>(const float*, int, float*, int, int, int, int,
                                          const float*, double, float*);
template void RmsNormGroupsForward<double>(const double*, int, double*, int, int, int, int,
                                           const double*, double, double*);
template void RmsNormGroupsBackward<float>(const float*, int, const float*, const float*,
                                           const float*, int, float*, int, int, int, int, float*);
template void RmsNormGroupsBackward<double>(const double*, int, const double*, const double*,
                                            const double*, int, double*, int, int, int, int,
                                            double*);
template void RmsNormForward<float>(const float*, const float*, int, int, double, float*, float*);
template void RmsNormForward<double>(const double*, const double*, int, int, double, double*,
                                     double*);
template void AddRmsNormForward<float>(const float*, const float*, float*, const float*, int, int,
                                       double, float*, float*);
template void AddRmsNormForward<double>(const double*, const double*, double*, const double*, int,
                                        int, double, double*, double*);
template void RmsNormBackward<float>(const float*, const float*, const float*, const float*, int,
                                     int, float*, float*, bool);
template void RmsNormBackward<double>(const double*, const double*, const double*, const double*,
                                      int, int, double*, double*, bool);

}  // namespace moelab::cpu
