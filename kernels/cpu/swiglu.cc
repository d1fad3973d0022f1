#include "kernels/cpu/swiglu.h"

#include <cmath>

#include "kernels/cpu/gemm.h"
#include "kernels/cpu/vecmath.h"

namespace moelab::cpu {

template <typename T>
void SwigluForward(const T* x, int n, int d, int hidden, const T* w1, const T* w3, const T* w2,
                   T* h1, T* h3, T* act, T* y) {
  LinearForward(x, w1, n, d, hidden, h1);
  LinearForward(x, w3, n, d, hidden, h3);
  const long total = static_cast<long>(n) * hidden;
#pragma omp parallel for simd schedule(static) if (total > 32768)
  for (long i = 0; i < total; ++i) act[i] = h1[i] * Sigmoid<T>(h1[i]) * h3[i];
  LinearForward(act, w2, n, hidden, d, y);
}

template <typename T>
void SwigluBackward(const T* x, int n, int d, int hidden, const T* w1, const T* w3, const T* w2,
                    const T* h1, const T* h3, const T* act, const T* dy, T* dx, T* dw1, T* dw3,
                    T* dw2, T* scratch, bool accumulate_dx, bool accumulate_dw) {
  T* dact = scratch;  // reused in place as dh1
  T* dh3 = scratch + static_cast<long>(n) * hidden;
  LinearBackward(act, w2, dy, n, hidden, d, dact, dw2, false, accumulate_dw);
  const long total = static_cast<long>(n) * hidden;
#pragma omp parallel for simd schedule(static) if (total > 32768)
  for (long i = 0; i < total; ++i) {
    const T s = Sigmoid<T>(h1[i]);
    const T silu = h1[i] * s;
    dh3[i] = dact[i] * silu;
    dact[i] = dact[i] * h3[i] * (s * (T(1) + h1[i] * (T(1) - s)));
  }
  LinearBackward(x, w1, dact, n, d, hidden, dx, dw1, accumulate_dx, accumulate_dw);
  LinearBackward(x, w3, dh3, n, d, hidden, dx, dw3, true, accumulate_dw);
}

template void SwigluForward<float>(const float*, int, int, int, const float*, const float*,
                                   const float*, float*, float*, float*, float*);
template void SwigluForward<double>(const double*, int, int, int, const double*, const double*,
                                    const double*, double*, double*, double*, double*);
template void SwigluBackward<float>(const float*, int, int, int, const float*, const float*,
                                    const float*, const float*, const float*, const float*,
                                    const float*, float*, float*, float*, float*, float*, bool,
                                    bool);
template void SwigluBackward<double>(const double*, int, int, int, const double*, const double*,
                                     const double*, const double*, const double*, const double*,
                                     const double*, double*, double*, double*, double*, double*,
                                     bool, bool);

}  // namespace moelab::cpu
