#include "kernels/cpu/attention.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "kernels/cpu/gemm.h"
#include "kernels/cpu/vecmath.h"

namespace moelab::cpu {

namespace {
// Row tile of the causal blocking: big enough for efficient GEMMs, small enough that the
// diagonal tiles waste little (S=256: 56 % of the full square instead of the ideal 50 %).
constexpr int kTile = 32;

// C[m,n] = alpha·op(A)·op(B), overwriting C. OpenBLAS implements beta = 0 with a separate
// pass of its `beta` kernel, which on these small strided tiles cost ~15 % of the attention
// time; zeroing the rows with memset and accumulating (beta = 1) is cheaper.
template <typename T>
void GemmOverwrite(bool trans_a, bool trans_b, int m, int n, int k, T alpha, const T* a, int lda,
                   const T* b, int ldb, T* c, int ldc) {
  for (int i = 0; i < m; ++i) std::memset(c + static_cast<long>(i) * ldc, 0, sizeof(T) * n);
  Gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, T(1), c, ldc);
}
}  // namespace

size_t AttentionScratchSize(const AttentionDims& a, int threads) {
  return static_cast<size_t>(threads) * a.seq * a.seq;
}

template <typename T>
void AttentionForward(const AttentionDims& a, const T* q, const T* k, const T* v, T* probs,
                      T* capped, T* out, T* pair_max) {
  const int S = a.seq, H = a.heads, group = a.heads / a.kv_heads;
  const T scale = static_cast<T>(a.scale);
  const T cap = static_cast<T>(a.softcap);
  const int pairs = a.batch * H;
  // Tiny problems (tests) run serially: a parallel region costs more than the work.
  const bool par = static_cast<long>(pairs) * S * S * a.qk_dim > 200000;
#pragma omp parallel for schedule(static) if (par)
  for (int pair = 0; pair < pairs; ++pair) {
    const int b = pair / H, h = pair % H, g = h / group;
    const T* Q = q + static_cast<long>(b) * S * a.ldq + static_cast<long>(h) * a.qk_dim;
    const T* K = k + static_cast<long>(b) * S * a.ldk + static_cast<long>(g) * a.qk_dim;
    const T* V = v + static_cast<long>(b) * S * a.ldv + static_cast<long>(g) * a.v_dim;
    T* O = out + static_cast<long>(b) * S * a.ldo + static_cast<long>(h) * a.v_dim;
    T* P = probs + static_cast<long>(pair) * S * S;
    T* C = cap > 0 ? capped + static_cast<long>(pair) * S * S : nullptr;
    T pmax = -std::numeric_limits<T>::infinity();
    for (int r0 = 0; r0 < S; r0 += kTile) {
      const int rows = std::min(kTile, S - r0), cols = r0 + rows;
      GemmOverwrite(false, true, rows, cols, a.qk_dim, scale, Q + static_cast<long>(r0) * a.ldq,
                    a.ldq, K, a.ldk, P + static_cast<long>(r0) * S, S);
      for (int i = r0; i < r0 + rows; ++i) {
        T* p = P + static_cast<long>(i) * S;
        T rmax = -std::numeric_limits<T>::infinity();
#pragma omp simd reduction(max : rmax)
        for (int j = 0; j <= i; ++j) rmax = std::max(rmax, p[j]);
        pmax = std::max(pmax, rmax);
        T m = rmax;
        if (C) {
          T* c = C + static_cast<long>(i) * S;
          for (int j = 0; j <= i; ++j) {
            c[j] = std::tanh(p[j] / cap);
            p[j] = cap * c[j];
          }
          for (int j = i + 1; j < cols; ++j) c[j] = 0;  // read (as 0) by the backward pass
          m = cap * std::tanh(rmax / cap);              // tanh is monotonic: the capped row max
        }
        // Masked logits become −inf so the exp, sum and scale loops run over the whole tile
        // width (a multiple of the vector width) instead of ragged rows with scalar tails.
        // Exp<float>(−inf) is ≈1e-38 rather than 0, invisible next to the row max's 1 in the
        // sum; the masked entries are then set to exactly 0.
        for (int j = i + 1; j < cols; ++j) p[j] = -std::numeric_limits<T>::infinity();
        T sum = 0;
#pragma omp simd reduction(+ : sum)
        for (int j = 0; j < cols; ++j) {
          p[j] = Exp<T>(p[j] - m);
          sum += p[j];
        }
        const T inv = T(1) / sum;
#pragma omp simd
        for (int j = 0; j < cols; ++j) p[j] *= inv;
        for (int j = i + 1; j < cols; ++j) p[j] = 0;
      }
      GemmOverwrite(false, false, rows, a.v_dim, cols, T(1), P + static_cast<long>(r0) * S, S, V,
                    a.ldv, O + static_cast<long>(r0) * a.ldo, a.ldo);
    }
    pair_max[pair] = pmax;
  }
}

template <typename T>
void AttentionBackward(const AttentionDims& a, const T* q, const T* k, const T* v, const T* probs,
                       const T* capped, const T* dout, T* dq, T* dk, T* dv, T* scratch) {
  const int S = a.seq, H = a.heads, G = a.kv_heads, group = a.heads / a.kv_heads;
  const T scale = static_cast<T>(a.scale);
  const bool cap = a.softcap > 0;
  const int units = a.batch * G;
  const bool par = static_cast<long>(a.batch) * H * S * S * a.qk_dim > 200000;
#pragma omp parallel for schedule(static) if (par)
  for (int unit = 0; unit < units; ++unit) {
    const int b = unit / G, g = unit % G;
    T* dS = scratch + static_cast<long>(omp_get_thread_num()) * S * S;
    const T* K = k + static_cast<long>(b) * S * a.ldk + static_cast<long>(g) * a.qk_dim;
    const T* V = v + static_cast<long>(b) * S * a.ldv + static_cast<long>(g) * a.v_dim;
    T* dK = dk + static_cast<long>(b) * S * a.ldk + static_cast<long>(g) * a.qk_dim;
    T* dV = dv + static_cast<long>(b) * S * a.ldv + static_cast<long>(g) * a.v_dim;
    for (int h = g * group; h < (g + 1) * group; ++h) {
      const long pair = static_cast<long>(b) * H + h;
      const T* Q = q + static_cast<long>(b) * S * a.ldq + static_cast<long>(h) * a.qk_dim;
      T* dQ = dq + static_cast<long>(b) * S * a.ldq + static_cast<long>(h) * a.qk_dim;
      const T* dO = dout + static_cast<long>(b) * S * a.ldo + static_cast<long>(h) * a.v_dim;
      const T* P = probs + pair * S * S;
      const T* C = cap ? capped + pair * S * S : nullptr;
      for (int r0 = 0; r0 < S; r0 += kTile) {
        const int rows = std::min(kTile, S - r0), cols = r0 + rows;
        // dP = dO·Vᵀ, then the softmax backward in place: dS = P ⊙ (dP − Σ_j P·dP).
        GemmOverwrite(false, true, rows, cols, a.v_dim, T(1), dO + static_cast<long>(r0) * a.ldo,
                      a.ldo, V, a.ldv, dS + static_cast<long>(r0) * S, S);
        // Masked entries of P are exactly 0 (and of C too), so these loops run over the whole
        // tile width and leave dS = 0 there.
        for (int i = r0; i < r0 + rows; ++i) {
          const T* p = P + static_cast<long>(i) * S;
          T* ds = dS + static_cast<long>(i) * S;
          T dot = 0;
#pragma omp simd reduction(+ : dot)
          for (int j = 0; j < cols; ++j) dot += p[j] * ds[j];
#pragma omp simd
          for (int j = 0; j < cols; ++j) ds[j] = p[j] * (ds[j] - dot);
          if (C) {
            const T* c = C + static_cast<long>(i) * S;
#pragma omp simd
            for (int j = 0; j < cols; ++j) ds[j] *= T(1) - c[j] * c[j];
          }
        }
        // dQ = scale·dS·K over the causal key tiles.
        GemmOverwrite(false, false, rows, a.qk_dim, cols, scale, dS + static_cast<long>(r0) * S, S,
                      K, a.ldk, dQ + static_cast<long>(r0) * a.ldq, a.ldq);
      }
      // Key tile c0 receives from query rows c0..S-1 only: dV = Pᵀ·dO, dK = scale·dSᵀ·Q.
      // The first query head of the group overwrites dK/dV, the others accumulate.
      if (h == g * group) {
        for (int r = 0; r < S; ++r) {
          std::memset(dV + static_cast<long>(r) * a.ldv, 0, sizeof(T) * a.v_dim);
          std::memset(dK + static_cast<long>(r) * a.ldk, 0, sizeof(T) * a.qk_dim);
        }
      }
      for (int c0 = 0; c0 < S; c0 += kTile) {
        const int ccols = std::min(kTile, S - c0), krows = S - c0;
        Gemm(true, false, ccols, a.v_dim, krows, T(1), P + static_cast<long>(c0) * S + c0, S,
             dO + static_cast<long>(c0) * a.ldo, a.ldo, T(1), dV + static_cast<long>(c0) * a.ldv,
             a.ldv);
        Gemm(true, false, ccols, a.qk_dim, krows, scale, dS + static_cast<long>(c0) * S + c0, S,
             Q + static_cast<long>(c0) * a.ldq, a.ldq, T(1), dK + static_cast<long>(c0) * a.ldk,
             a.ldk);
      }
    }
  }
}

template void AttentionForward<float>(const AttentionDims&, const float*, const float*,
                                      const float*, float*, float*, float*, float*);
template void AttentionForward<double>(const AttentionDims&, const double*, const double*,
                                       const double*, double*, double*, double*, double*);
template void AttentionBackward<float>(const AttentionDims&, const float*, const float*,
                                       const float*, const float*, const float*, const float*,
                                       float*, float*, float*, float*);
template void AttentionBackward<double>(const AttentionDims&, const double*, const double*,
                                        const double*, const double*, const double*, const double*,
                                        double*, double*, double*, double*);

}  // namespace moelab::cpu
