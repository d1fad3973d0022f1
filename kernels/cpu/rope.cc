#include "kernels/cpu/rope.h"

#include <cmath>
#include <initializer_list>

namespace moelab::cpu {

template <typename T>
void RopeTables(int seq, int rot_dim, double theta, T* cos, T* sin) {
  const int half = rot_dim / 2;
  for (int p = 0; p < seq; ++p) {
    for (int i = 0; i < half; ++i) {
      const double freq = std::pow(theta, -2.0 * i / rot_dim);
      const double a = p * freq;
      cos[static_cast<long>(p) * half + i] = static_cast<T>(std::cos(a));
      sin[static_cast<long>(p) * half + i] = static_cast<T>(std::sin(a));
    }
  }
}

template <typename T>
void RopeApply(T* x, int n, int seq, int ld, int heads, int head_stride, int offset, int rot_dim,
               const T* cos, const T* sin, bool inverse) {
  const int half = rot_dim / 2;
  const T sign = inverse ? T(-1) : T(1);
  const bool par = static_cast<long>(n) * heads * rot_dim > 16384;
#pragma omp parallel for schedule(static) if (par)
  for (int r = 0; r < n; ++r) {
    const T* c = cos + static_cast<long>(r % seq) * half;
    const T* s = sin + static_cast<long>(r % seq) * half;
    for (int h = 0; h < heads; ++h) {
      T* a = x + static_cast<long>(r) * ld + static_cast<long>(h) * head_stride + offset;
      T* b = a + half;
#pragma omp simd
      for (int i = 0; i < half; ++i) {
        const T ai = a[i], bi = b[i], si = sign * s[i];
        a[i] = ai * c[i] - bi * si;
        b[i] = bi * c[i] + ai * si;
      }
    }
  }
}

template <typename T>
void RopeApplyQk(const RopeSlice<T>& q, const RopeSlice<T>& k, int n, int seq, int rot_dim,
                 const T* cos, const T* sin, bool inverse) {
  for (const RopeSlice<T>* s : {&q, &k}) {
    if (s->heads > 0) {
      RopeApply(s->x, n, seq, s->ld, s->heads, s->head_stride, s->offset, rot_dim, cos, sin,
                inverse);
    }
  }
}

template void RopeTables<float>(int, int, double, float*, float*);
template void RopeTables<double>(int, int, double, double*, double*);
template void RopeApply<float>(float*, int, int, int, int, int, int, int, const float*,
                               const float*, bool);
template void RopeApply<double>(double*, int, int, int, int, int, int, int, const double*,
                                const double*, bool);

template void RopeApplyQk<float>(const RopeSlice<float>&, const RopeSlice<float>&, int, int, int,
                                 const float*, const float*, bool);
template void RopeApplyQk<double>(const RopeSlice<double>&, const RopeSlice<double>&, int, int, int,
                                  const double*, const double*, bool);

}  // namespace moelab::cpu
