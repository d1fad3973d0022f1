#include "kernels/cpu/moe_routing.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/cpu/router_token.h"

namespace moelab::cpu {

namespace {

// Below this much work per loop an OpenMP team costs more than it saves.
constexpr long kParallelMin = 16384;

}  // namespace

template <typename T>
void MoeRoute(const T* logits, int n, int experts, int k, bool sigmoid, const T* bias,
              double route_scale, T* scores, int* topk, T* gates, int64_t* counts) {
  const int E = experts;
#pragma omp parallel for schedule(static) if (1L * n * E > kParallelMin)
  for (int t = 0; t < n; ++t) {
    const T* z = logits + static_cast<long>(t) * E;
    T* s = scores + static_cast<long>(t) * E;
    if (sigmoid) {
      for (int e = 0; e < E; ++e) s[e] = T(1) / (T(1) + std::exp(-z[e]));
    } else {
      T zmax = z[0];
      for (int e = 1; e < E; ++e) zmax = std::max(zmax, z[e]);
      double sum = 0;  // double: the normaliser of a float row should not lose low bits
      for (int e = 0; e < E; ++e) {
        s[e] = std::exp(z[e] - zmax);
        sum += s[e];
      }
      const T inv = static_cast<T>(1.0 / sum);
      for (int e = 0; e < E; ++e) s[e] *= inv;
    }
    int* idx = topk + static_cast<long>(t) * k;
    T* val = gates + static_cast<long>(t) * k;
    InsertTopK(s, bias, E, k, idx, val);     // kernels/cpu/router_token.h, shared with CUDA
    TopKGates(s, idx, k, route_scale, val);  // val becomes the gates
  }
  std::fill(counts, counts + E, int64_t{0});
  const long nk = static_cast<long>(n) * k;
  for (long i = 0; i < nk; ++i) ++counts[topk[i]];
}

template <typename T>
double MoeAuxLoss(const T* scores, const int64_t* counts, int n, int experts, int k, bool sigmoid,
                  double coef) {
  if (n == 0) return 0.0;
  // coef·E·Σ_i f_i·P_i = coef·E/n · Σ_t Σ_i f_i·s̃_{t,i}: summed per token so that no per-expert
  // buffer is needed, serially in token order so that the loss is bit-reproducible.
  const double inv_nk = 1.0 / (static_cast<double>(n) * k);
  double acc = 0;
  for (int t = 0; t < n; ++t) {
    acc += AuxLossTokenTerm(scores + static_cast<long>(t) * experts, counts, experts, sigmoid);
  }
  return coef * experts * inv_nk * acc / n;
}

template <typename T>
void MoeRouteBackward(const T* scores, const int* topk, const T* dgates, const int64_t* counts,
                      int n, int experts, int k, bool sigmoid, double route_scale, double aux_coef,
                      T* dlogits) {
  const int E = experts;
  // dL_aux/ds̃_{t,i} = a_i = coef·E·f_i/n = a_scale·count_i, the same for every token.
  const bool aux = aux_coef != 0.0 && n > 0;
  const double a_scale = aux ? aux_coef * E / (static_cast<double>(n) * k * n) : 0.0;
#pragma omp parallel for schedule(static) if (1L * n * E > kParallelMin)
  for (int t = 0; t < n; ++t) {
    const long row = static_cast<long>(t);
    RouteBackwardToken(scores + row * E, topk + row * k, dgates + row * k, counts, E, k, sigmoid,
                       route_scale, aux, a_scale, dlogits + row * E);  // router_token.h
  }
}

void MoeDispatchPlan(const int* topk, int n, int experts, int k, int64_t* offsets, int* row_token,
                     int* slot_row) {
  std::fill(offsets, offsets + experts + 1, int64_t{0});
  const long nk = static_cast<long>(n) * k;
  for (long i = 0; i < nk; ++i) ++offsets[topk[i] + 1];
  for (int e = 0; e < experts; ++e) offsets[e + 1] += offsets[e];
  // Serial scatter in (token, slot) order makes the sort stable; it is O(n·k) index work,
  // negligible next to the GEMMs. offsets[e] serves as expert e's cursor (no allocation) and
  // ends at the old offsets[e+1], so a shift by one restores the offsets.
  for (long i = 0; i < nk; ++i) {
    const int64_t r = offsets[topk[i]]++;
    row_token[r] = static_cast<int>(i / k);
    slot_row[i] = static_cast<int>(r);
  }
  for (int e = experts; e > 0; --e) offsets[e] = offsets[e - 1];
  offsets[0] = 0;
}

template <typename T>
void MoeGather(const T* x, int d, const int* row_token, int64_t rows, T* xe) {
#pragma omp parallel for schedule(static) if (rows * d > kParallelMin)
  for (int64_t r = 0; r < rows; ++r) {
    std::memcpy(xe + r * d, x + static_cast<int64_t>(row_token[r]) * d, sizeof(T) * d);
  }
}

template <typename T>
void MoeGatherBackward(const T* dxe, const int* slot_row, int n, int k, int d, T* dx,
                       bool accumulate) {
#pragma omp parallel for schedule(static) if (1L * n * k * d > kParallelMin)
  for (int t = 0; t < n; ++t) {
    T* out = dx + static_cast<long>(t) * d;
    if (!accumulate) std::fill(out, out + d, T(0));
    for (int slot = 0; slot < k; ++slot) {
      const T* src = dxe + static_cast<long>(slot_row[static_cast<long>(t) * k + slot]) * d;
      for (int c = 0; c < d; ++c) out[c] += src[c];
    }
  }
}

template <typename T>
void MoeCombine(const T* ye, const int* slot_row, const T* gates, int n, int k, int d, T* y,
                bool accumulate) {
#pragma omp parallel for schedule(static) if (1L * n * k * d > kParallelMin)
  for (int t = 0; t < n; ++t) {
    T* out = y + static_cast<long>(t) * d;
    if (!accumulate) std::fill(out, out + d, T(0));
    for (int slot = 0; slot < k; ++slot) {
      const long i = static_cast<long>(t) * k + slot;
      const T g = gates[i];
      const T* src = ye + static_cast<long>(slot_row[i]) * d;
      for (int c = 0; c < d; ++c) out[c] += g * src[c];
    }
  }
}

template <typename T>
void MoeCombineBackward(const T* dy, const T* ye, const int* slot_row, const T* gates, int n, int k,
                        int d, T* dye, T* dgates) {
#pragma omp parallel for schedule(static) if (1L * n * k * d > kParallelMin)
  for (int t = 0; t < n; ++t) {
    const T* dyt = dy + static_cast<long>(t) * d;
    for (int slot = 0; slot < k; ++slot) {
      const long i = static_cast<long>(t) * k + slot;
      const long r = slot_row[i];
      const T* src = ye + r * d;
      T* dst = dye + r * d;
      double dot = 0;
      for (int c = 0; c < d; ++c) dot += static_cast<double>(dyt[c]) * src[c];
      dgates[i] = static_cast<T>(dot);
      const T g = gates[i];
      for (int c = 0; c < d; ++c) dst[c] = g * dyt[c];
    }
  }
}

#define MOELAB_INSTANTIATE(T)                                                                      \
  template void MoeRoute<T>(const T*, int, int, int, bool, const T*, double, T*, int*, T*,         \
                            int64_t*);                                                             \
  template double MoeAuxLoss<T>(const T*, const int64_t*, int, int, int, bool, double);            \
  template void MoeRouteBackward<T>(const T*, const int*, const T*, const int64_t*, int, int, int, \
                                    bool, double, double, T*);                                     \
  template void MoeGather<T>(const T*, int, const int*, int64_t, T*);                              \
  template void MoeGatherBackward<T>(const T*, const int*, int, int, int, T*, bool);               \
  template void MoeCombine<T>(const T*, const int*, const T*, int, int, int, T*, bool);            \
  template void MoeCombineBackward<T>(const T*, const T*, const int*, const T*, int, int, int, T*, \
                                      T*);
MOELAB_INSTANTIATE(float)
MOELAB_INSTANTIATE(double)
#undef MOELAB_INSTANTIATE

}  // namespace moelab::cpu
