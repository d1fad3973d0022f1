// CUDA twin of kernels/cpu/attention.h (fp32): causal SDPA for MHA, GQA and MLA shapes (qk_dim
// != v_dim), optional soft-cap, with each (batch, head)'s raw pre-cap max logit emitted by the
// softmax kernel that reads the scores anyway (no extra pass over them). Same layout and
// AttentionDims as the CPU version; probabilities [B,H,S,S] are materialised for the backward.
//
// The score and output products run on cuBLAS strided-batched GEMMs (the full S×S square: the
// masked half is computed and then zeroed), the softmax, soft-cap and masking in one kernel
// (one block per query row).
#pragma once

#include <cstddef>

#include "kernels/cpu/attention.h"
#include "kernels/cuda/device.h"

namespace moelab::cuda {

// The same fields as cpu::AttentionDims (converts implicitly from it). A distinct type so that
// unqualified calls do not find both the CPU and the CUDA overloads by argument lookup.
struct AttentionDims {
  int batch = 1, seq = 1, heads = 1, kv_heads = 1;
  int qk_dim = 1, v_dim = 1;
  int ldq = 1, ldk = 1, ldv = 1, ldo = 1;
  double scale = 1;
  double softcap = 0;
  AttentionDims() = default;
  AttentionDims(const cpu::AttentionDims& c)  // NOLINT: implicit on purpose
      : batch(c.batch),
        seq(c.seq),
        heads(c.heads),
        kv_heads(c.kv_heads),
        qk_dim(c.qk_dim),
        v_dim(c.v_dim),
        ldq(c.ldq),
        ldk(c.ldk),
        ldv(c.ldv),
        ldo(c.ldo),
        scale(c.scale),
        softcap(c.softcap) {}
  operator cpu::AttentionDims() const {  // NOLINT
    cpu::AttentionDims c;
    c.batch = batch, c.seq = seq, c.heads = heads, c.kv_heads = kv_heads, c.qk_dim = qk_dim;
    c.v_dim = v_dim, c.ldq = ldq, c.ldk = ldk, c.ldv = ldv, c.ldo = ldo, c.scale = scale;
    c.softcap = softcap;
    return c;
  }
};

// Throws std::invalid_argument("<who>: <why>") for shapes no attention kernel accepts
// (non-positive dims, heads not a multiple of kv_heads, row strides narrower than the heads).
// Host-only: callable before any CUDA call.
void ValidateAttentionDims(const AttentionDims& a, const char* who);

// Elements (of T) of device scratch AttentionBackward needs: B·H·S·S.
size_t AttentionScratchSize(const AttentionDims& a);

// probs [B·H·S·S]; capped [B·H·S·S] when softcap > 0 (else may be null); pair_max [B·H] gets
// each (batch, head)'s max raw logit over unmasked j ≤ i, before any soft-cap.
template <typename T>
void AttentionForward(const AttentionDims& a, const T* q, const T* k, const T* v, T* probs,
                      T* capped, T* out, T* pair_max, cudaStream_t stream = nullptr);

// dq (head columns overwritten), dk, dv (head columns overwritten). The query heads of a kv
// group accumulate into dk/dv in head order (deterministic). scratch: AttentionScratchSize(a).
template <typename T>
void AttentionBackward(const AttentionDims& a, const T* q, const T* k, const T* v, const T* probs,
                       const T* capped, const T* dout, T* dq, T* dk, T* dv, T* scratch,
                       cudaStream_t stream = nullptr);

// bf16 mode: the four products per pair as bf16 GEMMs with fp32 accumulation; softmax, soft-cap
// and S_max stay fp32. q, k, v, out are bf16 in the layout above; probs (fp32) and probs16 (its
// bf16 copy, the P·V operand) [B·H·S·S] are both kept for the backward; capped as above.
void AttentionForwardBf16(const AttentionDims& a, const bf16* q, const bf16* k, const bf16* v,
                          float* probs, bf16* probs16, float* capped, bf16* out, float* pair_max,
                          cudaStream_t stream = nullptr);

// dout bf16 -> dq, dk, dv in fp32 (head columns overwritten; GQA heads accumulate in fp32).
// scratch: AttentionScratchSize(a) floats; scratch16: AttentionScratchSize(a) bf16.
void AttentionBackwardBf16(const AttentionDims& a, const bf16* q, const bf16* k, const bf16* v,
                           const float* probs, const bf16* probs16, const float* capped,
                           const bf16* dout, float* dq, float* dk, float* dv, float* scratch,
                           bf16* scratch16, cudaStream_t stream = nullptr);

// head_max[h] = max over b of pair_max[b·heads + h] (the layer's S_max row), on the device.
template <typename T>
void AttentionMaxOverBatch(const T* pair_max, int batch, int heads, T* head_max,
                           cudaStream_t stream = nullptr);

}  // namespace moelab::cuda
