#include "kernels/cpu/moe_experts.h"

#include <algorithm>

#include "kernels/cpu/swiglu.h"

namespace moelab::cpu {

// Each expert writes only its own rows of h1/h3/act/ye/dxe/scratch and its own weight
// gradients, and (inside a parallel region) OpenBLAS-openmp runs each GEMM single-threaded, so
// an expert's result is the same whichever thread runs it: the dynamic schedule below balances
// uneven expert loads without costing determinism.

template <typename T>
void MoeExpertForward(int e, const T* xe, const int64_t* offsets, int d, int hidden, const T* w1,
                      const T* w3, const T* w2, T* h1, T* h3, T* act, T* ye) {
  const long wsize = static_cast<long>(hidden) * d;
  const int64_t r0 = offsets[e];
  const int rows = static_cast<int>(offsets[e + 1] - r0);
  if (rows == 0) return;
  SwigluForward(xe + r0 * d, rows, d, hidden, w1 + e * wsize, w3 + e * wsize, w2 + e * wsize,
                h1 + r0 * hidden, h3 + r0 * hidden, act + r0 * hidden, ye + r0 * d);
}

template <typename T>
void MoeExpertBackward(int e, const T* xe, const int64_t* offsets, int d, int hidden, const T* w1,
                       const T* w3, const T* w2, const T* h1, const T* h3, const T* act,
                       const T* dye, T* dxe, T* dw1, T* dw3, T* dw2, T* scratch) {
  const long wsize = static_cast<long>(hidden) * d;
  const int64_t r0 = offsets[e];
  const int rows = static_cast<int>(offsets[e + 1] - r0);
  if (rows == 0) {
    // A GEMM with an empty inner dimension is not guaranteed to write C.
    std::fill(dw1 + e * wsize, dw1 + (e + 1) * wsize, T(0));
    std::fill(dw3 + e * wsize, dw3 + (e + 1) * wsize, T(0));
    std::fill(dw2 + e * wsize, dw2 + (e + 1) * wsize, T(0));
    return;
  }
  SwigluBackward(xe + r0 * d, rows, d, hidden, w1 + e * wsize, w3 + e * wsize, w2 + e * wsize,
                 h1 + r0 * hidden, h3 + r0 * hidden, act + r0 * hidden, dye + r0 * d, dxe + r0 * d,
                 dw1 + e * wsize, dw3 + e * wsize, dw2 + e * wsize, scratch + r0 * 2 * hidden);
}

template <typename T>
void MoeExpertsForward(const T* xe, const int64_t* offsets, int experts, int d, int hidden,
                       const T* w1, const T* w3, const T* w2, T* h1, T* h3, T* act, T* ye,
                       MoeExpertSchedule schedule) {
  if (schedule == MoeExpertSchedule::kExpertParallel) {
#pragma omp parallel for schedule(dynamic, 1)
    for (int e = 0; e < experts; ++e) {
      MoeExpertForward(e, xe, offsets, d, hidden, w1, w3, w2, h1, h3, act, ye);
    }
  } else {
    for (int e = 0; e < experts; ++e) {
      MoeExpertForward(e, xe, offsets, d, hidden, w1, w3, w2, h1, h3, act, ye);
    }
  }
}

template <typename T>
void MoeExpertsBackward(const T* xe, const int64_t* offsets, int experts, int d, int hidden,
                        const T* w1, const T* w3, const T* w2, const T* h1, const T* h3,
                        const T* act, const T* dye, T* dxe, T* dw1, T* dw3, T* dw2, T* scratch,
                        MoeExpertSchedule schedule) {
  if (schedule == MoeExpertSchedule::kExpertParallel) {
#pragma omp parallel for schedule(dynamic, 1)
    for (int e = 0; e < experts; ++e) {
      MoeExpertBackward(e, xe, offsets, d, hidden, w1, w3, w2, h1, h3, act, dye, dxe, dw1, dw3, dw2,
                        scratch);
    }
  } else {
    for (int e = 0; e < experts; ++e) {
      MoeExpertBackward(e, xe, offsets, d, hidden, w1, w3, w2, h1, h3, act, dye, dxe, dw1, dw3, dw2,
                        scratch);
    }
  }
}

#define MOELAB_INSTANTIATE(T)                                                                      \
  template void MoeExpertForward<T>(int, const T*, const int64_t*, int, int, const T*, const T*,   \
                                    const T*, T*, T*, T*, T*);                                     \
  template void MoeExpertBackward<T>(int, const T*, const int64_t*, int, int, const T*, const T*,  \
                                     const T*, const T*, const T*, const T*, const T*, T*, T*, T*, \
                                     T*, T*);                                                      \
  template void MoeExpertsForward<T>(const T*, const int64_t*, int, int, int, const T*, const T*,  \
                                     const T*, T*, T*, T*, T*, MoeExpertSchedule);                 \
  template void MoeExpertsBackward<T>(const T*, const int64_t*, int, int, int, const T*, const T*, \
                                      const T*, const T*, const T*, const T*, const T*, T*, T*,    \
                                      T*, T*, T*, MoeExpertSchedule);
MOELAB_INSTANTIATE(float)
MOELAB_INSTANTIATE(double)
#undef MOELAB_INSTANTIATE

}  // namespace moelab::cpu
