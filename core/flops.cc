#include "core/flops.h"

#include "core/optimizer_traits.h"

namespace moelab {

AttentionMacs AttentionMacsPerToken(const ModelConfig& m, double keys) {
  const double d = m.d_model, h = m.heads;
  AttentionMacs a;
  if (m.attention == "mla") {
    const double qk = m.qk_nope_head_dim + m.qk_rope_head_dim;
    const double q = m.q_lora_rank > 0 ? d * m.q_lora_rank + m.q_lora_rank * h * qk : d * h * qk;
    const double kv_down = d * (m.kv_lora_rank + m.qk_rope_head_dim);
    const double kv_up = m.kv_lora_rank * h * (m.qk_nope_head_dim + m.v_head_dim);
    a.proj = q + kv_down + kv_up + h * m.v_head_dim * d;
    a.scores = keys * h * (qk + m.v_head_dim);
    return a;
  }
  const double hd = m.head_dim_effective(), kv = m.kv_heads_effective();
  a.proj = d * h * hd + 2 * d * kv * hd + h * hd * d;
  a.scores = keys * h * hd * 2;
  return a;
}

FlopsBreakdown ForwardFlopsPerToken(const RunConfig& c) {
  const ModelConfig& m = c.model;
  const MoEConfig& e = c.moe;
  const double keys = (m.seq_len + 1) / 2.0;
  const AttentionMacs attn = AttentionMacsPerToken(m, keys);
  const int moe_layers = MoeLayers(m, e);
  const int dense_layers = m.layers - moe_layers;
  const double d = m.d_model;
  FlopsBreakdown f;
  f.attn_proj = 2 * m.layers * attn.proj;
  f.attn_scores = 2 * m.layers * attn.scores;
  f.dense_ffn = 2 * dense_layers * 3 * d * m.ffn_hidden;
  if (moe_layers > 0) {
    f.router = 2.0 * moe_layers * d * e.experts_total;
    f.routed_experts = 2.0 * moe_layers * e.experts_active * 3 * d * e.expert_hidden;
    f.shared_experts = 2.0 * moe_layers * e.shared_experts * 3 * d * e.expert_hidden;
  }
  f.lm_head = 2 * d * m.vocab_size;
  return f;
}

ParamCounts CountParams(const RunConfig& c) {
  const ModelConfig& m = c.model;
  const MoEConfig& e = c.moe;
  const int64_t d = m.d_model;
  int64_t attn = 0;
  if (m.attention == "mla") {
    const int64_t h = m.heads, qk = m.qk_nope_head_dim + m.qk_rope_head_dim;
    attn = (m.q_lora_rank > 0 ? d * m.q_lora_rank + m.q_lora_rank + m.q_lora_rank * h * qk
                              : d * h * qk) +
           d * (m.kv_lora_rank + m.qk_rope_head_dim) + m.kv_lora_rank +
           m.kv_lora_rank * h * (m.qk_nope_head_dim + m.v_head_dim) + h * m.v_head_dim * d;
  } else {
    const int64_t hd = m.head_dim_effective();
    attn = d * m.heads * hd * 2 + 2 * d * m.kv_heads_effective() * hd;
  }
  if (m.qk_norm) attn += 2 * m.head_dim_effective();
  const int64_t norms = 2 * d;
  const int moe_layers = MoeLayers(m, e);
  const int dense_layers = m.layers - moe_layers;
  const int64_t expert = 3 * d * e.expert_hidden;
  ParamCounts p;
  p.embedding = static_cast<int64_t>(m.vocab_size) * d * (m.tie_embeddings ? 1 : 2);
  const int64_t common = m.layers * (attn + norms) + dense_layers * 3 * d * m.ffn_hidden + d +
                         p.embedding;
  const int64_t moe_fixed = moe_layers * (d * e.experts_total + e.shared_experts * expert);
  p.routed = static_cast<int64_t>(moe_layers) * e.experts_total * expert;
  p.total = common + moe_fixed + p.routed;
  p.active = common + moe_fixed + static_cast<int64_t>(moe_layers) * e.experts_active * expert;
  return p;
}

namespace {

// Elements of the non-hidden parameters (AdamW-updated under Muon): embedding, LM head, norms,
// routers. Everything else is a 2-D hidden matrix.
size_t NonHiddenParams(const RunConfig& c) {
  const ModelConfig& m = c.model;
  const size_t d = m.d_model, L = m.layers, V = m.vocab_size;
  size_t n = V * d * (m.tie_embeddings ? 1 : 2);
  n += (2 * L + 1) * d;  // attention, FFN and final norms
  if (m.attention == "mla") {
    n += L * (m.q_lora_rank > 0 ? m.q_lora_rank : 0) + L * m.kv_lora_rank;
  } else if (m.qk_norm) {
    n += L * 2 * m.head_dim_effective();
  }
  n += size_t(MoeLayers(m, c.moe)) * size_t(c.moe.experts_total) * d;
  return n;
}

}  // namespace

size_t OptimizerStateElements(const RunConfig& c) {
  const size_t total = static_cast<size_t>(CountParams(c).total);
  const OptimizerTraits traits = TraitsOf(c.optimizer);
  if (!traits.muon) return traits.other_state * total;
  const size_t rest = NonHiddenParams(c);
  const size_t hidden = total > rest ? total - rest : 0;
  return traits.hidden_state * hidden + traits.other_state * rest;  // Muon momentum; AdamW m, v
}

size_t OptimizerWorkspaceElements(const RunConfig& c) {
  if (!TraitsOf(c.optimizer).owns_bank) return 0;
  const size_t total = static_cast<size_t>(CountParams(c).total);
  const size_t rest = NonHiddenParams(c);
  return total > rest ? total - rest : 0;  // Muon's same-shape bank for batched Newton-Schulz
}

}  // namespace moelab
