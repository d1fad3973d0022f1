// Analytic FLOP and parameter counts. One multiply-add is 2 FLOPs. Training FLOPs per token are
// 3× the forward (the backward computes gradients for both activations and weights).
#pragma once

#include <cstdint>

#include "core/config.h"

namespace moelab {

// Forward FLOPs per token, by part, for a training sequence of model.seq_len tokens.
// Causal attention is counted at the unmasked positions only: token i (0-based) attends to i+1
// keys, so a sequence of S tokens averages (S+1)/2 keys per token for q·kᵀ and for P·V.
struct FlopsBreakdown {
  double attn_proj = 0;       // q, k, v, o projections (MLA: its down/up projections)
  double attn_scores = 0;     // q·kᵀ and P·V over the causal half
  double router = 0;          // router logits
  double routed_experts = 0;  // top-k active routed experts
  double shared_experts = 0;  // always-on experts
  double dense_ffn = 0;       // dense SwiGLU layers
  double lm_head = 0;         // output projection to the vocabulary
  double forward() const {
    return attn_proj + attn_scores + router + routed_experts + shared_experts + dense_ffn +
           lm_head;
  }
  double training() const { return 3.0 * forward(); }
};
FlopsBreakdown ForwardFlopsPerToken(const RunConfig& config);

// Multiply-adds per token of one attention block: its projections, and its scores (q·kᵀ and
// P·V) when a token attends to `keys` keys. MLA as trained: k and v up-projected per head.
// ForwardFlopsPerToken and the inference FLOPs (analysis/ablation.h) both count from this.
struct AttentionMacs {
  double proj = 0;
  double scores = 0;
};
AttentionMacs AttentionMacsPerToken(const ModelConfig& model, double keys);

struct ParamCounts {
  int64_t total = 0;      // every trainable parameter
  int64_t active = 0;     // used per token: routed experts counted top-k times, not E times
  int64_t embedding = 0;  // token embedding (+ untied LM head)
  int64_t routed = 0;     // routed experts' weights (what expert parallelism splits over ranks)
};
ParamCounts CountParams(const RunConfig& config);

// Elements of the optimizer's persistent state (what checkpoints save: AdamW m and v; Muon's
// momentum plus AdamW m, v for the non-matrix parameters).
size_t OptimizerStateElements(const RunConfig& config);
// Elements of the optimizer's scratch (Muon: the same-shape banks for batched Newton-Schulz,
// one float per hidden-matrix parameter; AdamW: none).
size_t OptimizerWorkspaceElements(const RunConfig& config);

}  // namespace moelab
