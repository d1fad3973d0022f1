// Causal scaled-dot-product attention on CPU, MHA and GQA, with the per-head max logit that
// QK-Clip needs and an optional logit soft-cap.
//
// Layout: q [B·S, ldq] holds head h's query in columns h·qk_dim .. (h+1)·qk_dim; k [B·S, ldk]
// and v [B·S, ldv] hold kv head g in columns g·qk_dim.. and g·v_dim..; out [B·S, ldo] gets head
// h in columns h·v_dim... Query head h reads kv head h / (heads / kv_heads). The strides let q,
// k and v be column slices of one fused QKV projection output.
//
// Work is split over (batch, head) pairs in an OpenMP loop with single-threaded GEMMs inside
// (OpenBLAS-openmp does not nest). Each pair is processed in row tiles of kTile queries; tile i
// multiplies only key tiles 0..i (causal blocking), so the work is close to the causal half.
// Probabilities are kept ([B, H, S, S], only the causal tiles written) for the backward pass.
#pragma once

#include <cstddef>

namespace moelab::cpu {

struct AttentionDims {
  int batch = 1, seq = 1, heads = 1, kv_heads = 1;
  int qk_dim = 1, v_dim = 1;               // per head
  int ldq = 1, ldk = 1, ldv = 1, ldo = 1;  // row strides of the q, k, v, out buffers
  double scale = 1;                        // logits = scale·q·k (1/sqrt(qk_dim) normally)
  double softcap = 0;                      // > 0: logits = cap·tanh(raw/cap)
};

// Elements of the per-thread scratch the backward pass needs for `threads` OpenMP threads.
size_t AttentionScratchSize(const AttentionDims& a, int threads);

// probs [B·H·S·S]. capped [B·H·S·S] holds tanh(raw/cap) when softcap > 0 (else unused, may be
// null). pair_max [B·H] receives each (batch, head)'s max raw logit over unmasked j ≤ i (before
// any soft-cap); the caller reduces it over the batch.
template <typename T>
void AttentionForward(const AttentionDims& a, const T* q, const T* k, const T* v, T* probs,
                      T* capped, T* out, T* pair_max);

// dout [B·S, ldo] -> dq (overwritten, head columns only), dk and dv (overwritten). Work is split
// over (batch, kv head) so the query heads sharing a kv head accumulate into it in a fixed
// order (deterministic, no atomics). scratch: AttentionScratchSize(a, omp_get_max_threads()).
template <typename T>
void AttentionBackward(const AttentionDims& a, const T* q, const T* k, const T* v, const T* probs,
                       const T* capped, const T* dout, T* dq, T* dk, T* dv, T* scratch);

}  // namespace moelab::cpu
