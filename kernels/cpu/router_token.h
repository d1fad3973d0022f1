// The router's arithmetic for one token: its top-k selection, its gates, its term of the aux
// loss and its backward. Shared by the CPU router (kernels/cpu/moe_routing.cc) and the CUDA routing
// kernels (kernels/cuda/moe.cu), so the two choose the same experts and gates by construction.
// Compiled for the host, and for the device where nvcc includes it.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define MOELAB_HOST_DEVICE __host__ __device__
#else
#define MOELAB_HOST_DEVICE
#endif

namespace moelab::cpu {

// One pass of insertion into a sorted list of the k best (value, expert): O(E) when most
// experts fail the first comparison (k = 8 of 256 is cheap). The strict '>' over ascending
// expert indices keeps the lower index ahead on ties; every expert is inserted at most once, so
// the k are distinct even with NaN scores. s [E] the scores, bias [E] or null (added for the
// choice only); writes idx [k] and val [k] (the biased values), best first.
template <typename T>
MOELAB_HOST_DEVICE inline void InsertTopK(const T* s, const T* bias, int E, int k, int* idx,
                                          T* val) {
  int filled = 0;
  for (int e = 0; e < E; ++e) {
    const T v = bias ? s[e] + bias[e] : s[e];
    if (filled == k && !(v > val[k - 1])) continue;
    int j = filled < k ? filled++ : k - 1;
    for (; j > 0 && v > val[j - 1]; --j) {
      val[j] = val[j - 1];
      idx[j] = idx[j - 1];
    }
    val[j] = v;
    idx[j] = e;
  }
}

// The gates of one token: its top-k scores (s [E], idx [k]) renormalised to sum to route_scale,
// written to g [k]. Only sigmoid scores can all underflow to 0 (logits below about -88 in
// float): the gate is then split evenly instead of producing 0/0 (the backward then treats the
// gates as constant).
template <typename T>
MOELAB_HOST_DEVICE inline void TopKGates(const T* s, const int* idx, int k, double route_scale,
                                         T* g) {
  double sum = 0;
  for (int slot = 0; slot < k; ++slot) sum += s[idx[slot]];
  for (int slot = 0; slot < k; ++slot) {
    g[slot] = sum > 0 ? static_cast<T>(s[idx[slot]] * (route_scale / sum))
                      : static_cast<T>(route_scale / k);
  }
}

// One token's term of the Switch aux loss, Σ_e counts_e·s̃_e with s̃ its normalised scores
// (softmax: the scores; sigmoid: s_e/Σ_j s_j, 0 where every score underflowed), in double. The
// callers sum it over tokens in a fixed order (serially on the CPU, a fixed tree on CUDA).
template <typename T>
MOELAB_HOST_DEVICE inline double AuxLossTokenTerm(const T* s, const int64_t* counts, int E,
                                                  bool sigmoid) {
  double row = 0, sum = 0;
  for (int e = 0; e < E; ++e) {
    row += static_cast<double>(counts[e]) * s[e];
    sum += s[e];
  }
  return sigmoid ? (sum > 0 ? row / sum : 0.0) : row;
}

// The router's backward for one token: dz [E] = dL/dz from the gates' gradient dg [k] (through
// g_j = r·u_j/U over the chosen set: dL/du_j = (r/U)·(dg_j − Σ_i dg_i·u_i/U); nothing where the
// forward split the gates evenly), plus, with aux, the aux loss's dL/ds̃_e = a_scale·counts_e
// (sigmoid: through s̃_e = s_e/S, none where every score underflowed), then through the softmax
// or sigmoid. s [E] the scores, idx [k] the chosen experts.
template <typename T>
MOELAB_HOST_DEVICE inline void RouteBackwardToken(const T* s, const int* idx, const T* dg,
                                                  const int64_t* counts, int E, int k, bool sigmoid,
                                                  double route_scale, bool aux, double a_scale,
                                                  T* dz) {
  // dz accumulates dL/ds first, then is turned into dL/dz in place.
  for (int e = 0; e < E; ++e) dz[e] = T(0);
  double u_sum = 0, dot = 0;
  for (int slot = 0; slot < k; ++slot) u_sum += s[idx[slot]];
  if (u_sum > 0) {
    for (int slot = 0; slot < k; ++slot) dot += static_cast<double>(dg[slot]) * s[idx[slot]];
    dot /= u_sum;
    const double r_over_u = route_scale / u_sum;
    for (int slot = 0; slot < k; ++slot) {
      dz[idx[slot]] += static_cast<T>(r_over_u * (dg[slot] - dot));
    }
  }
  if (aux && sigmoid) {
    // dL/ds_j = (a_j − Σ_i a_i·s̃_i)/S.
    double S = 0, as = 0;
    for (int e = 0; e < E; ++e) S += s[e];
    if (S > 0) {
      for (int e = 0; e < E; ++e) as += a_scale * static_cast<double>(counts[e]) * s[e];
      as /= S;
      for (int e = 0; e < E; ++e) {
        dz[e] += static_cast<T>((a_scale * static_cast<double>(counts[e]) - as) / S);
      }
    }
  } else if (aux) {
    for (int e = 0; e < E; ++e) dz[e] += static_cast<T>(a_scale * static_cast<double>(counts[e]));
  }
  if (sigmoid) {
    for (int e = 0; e < E; ++e) dz[e] = dz[e] * s[e] * (T(1) - s[e]);
  } else {
    double sd = 0;
    for (int e = 0; e < E; ++e) sd += static_cast<double>(dz[e]) * s[e];
    for (int e = 0; e < E; ++e) dz[e] = s[e] * static_cast<T>(dz[e] - sd);
  }
}

}  // namespace moelab::cpu

#undef MOELAB_HOST_DEVICE
