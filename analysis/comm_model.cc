#include "analysis/comm_model.h"

#include <fmt/format.h>

#include <algorithm>

#include "core/flops.h"
#include "core/optimizer_traits.h"

namespace moelab::analysis {

namespace {

constexpr double kMemBytes = 4;  // fp32 master weights, gradients and optimizer state

double Frac(int p) { return p > 1 ? static_cast<double>(p - 1) / p : 0.0; }

}  // namespace

CommShape CommShapeOf(const RunConfig& c) {
  CommShape s;
  const ParamCounts pc = CountParams(c);
  s.params_total = pc.total;
  s.layers = c.model.layers;
  s.heads = c.model.heads;
  s.d_model = c.model.d_model;
  s.tokens_per_step = TokensPerStep(c);
  s.muon = TraitsOf(c.optimizer).muon;
  if (c.moe.enabled()) {
    s.moe_layers = MoeLayers(c.model, c.moe);
    s.experts = c.moe.experts_total;
    s.top_k = c.moe.experts_active;
    // SwiGLU experts: gate and up (d × h) and down (h × d).
    s.expert_params = static_cast<int64_t>(s.moe_layers) * c.moe.experts_total * 3 *
                      static_cast<int64_t>(c.model.d_model) * c.moe.expert_hidden;
  }
  // Muon takes the 2-D hidden matrices: everything but embeddings/LM head, norms and router
  // biases (the last two are negligible here).
  s.muon_params = s.muon ? pc.total - pc.embedding : 0;
  return s;
}

double RingAllReduceWire(double bytes, int p) { return 2.0 * Frac(p) * bytes; }

double RingAllReduceTime(double bytes, int p, const CommCost& cost) {
  if (p <= 1) return 0;
  return 2.0 * (p - 1) * cost.alpha_s + RingAllReduceWire(bytes, p) / cost.beta_bytes_per_s;
}

CommEstimate EstimateComm(const CommShape& s, const CommLayout& l, const CommCost& cost) {
  CommEstimate e;
  const double b = cost.bytes_per_element;
  const int world = std::max(1, l.ranks);
  const int ep = std::max(1, l.expert_parallel);
  const int dp = std::max(1, world / ep);
  const double replicated = static_cast<double>(s.params_total - s.expert_params);
  const double experts_local = static_cast<double>(s.expert_params) / ep;

  // ZeRO-1 (with distributed Muon: each matrix's Newton-Schulz runs on its owner) replaces the
  // gradient all-reduce by a reduce-scatter to the owners and an all-gather of the updated
  // parameters: the same bytes as a ring all-reduce, in two halves. Without ZeRO-1 every rank
  // steps every parameter (Muon too) after the all-reduce.
  const bool sharded = l.zero1;
  if (world > 1) {
    e.dense_grad_payload = replicated * b;
    if (sharded) {
      e.dense_grad_wire = Frac(world) * e.dense_grad_payload;
      e.gather_payload = replicated * b;
      e.gather_wire = Frac(world) * e.gather_payload;
      e.time_s += 2.0 * ((world - 1) * cost.alpha_s + e.gather_wire / cost.beta_bytes_per_s);
    } else {
      e.dense_grad_wire = RingAllReduceWire(e.dense_grad_payload, world);
      e.time_s += RingAllReduceTime(e.dense_grad_payload, world, cost);
    }
  }
  if (dp > 1 && experts_local > 0) {
    e.expert_grad_payload = experts_local * b;
    if (sharded) {
      e.expert_grad_wire = Frac(dp) * e.expert_grad_payload;
      e.gather_payload += experts_local * b;
      e.gather_wire += Frac(dp) * experts_local * b;
      e.time_s += 2.0 * ((dp - 1) * cost.alpha_s + e.expert_grad_wire / cost.beta_bytes_per_s);
    } else {
      e.expert_grad_wire = RingAllReduceWire(e.expert_grad_payload, dp);
      e.time_s += RingAllReduceTime(e.expert_grad_payload, dp, cost);
    }
  }
  if (ep > 1 && s.moe_layers > 0) {
    const double tokens_rank = static_cast<double>(s.tokens_per_step) / world;
    const double one = tokens_rank * s.top_k * s.d_model * b;  // one exchange, one layer
    e.a2a_payload = 4.0 * s.moe_layers * one;
    e.a2a_wire = Frac(ep) * e.a2a_payload;
    e.time_s += 4.0 * s.moe_layers * (ep - 1) * cost.alpha_s + e.a2a_wire / cost.beta_bytes_per_s;
  }
  if (world > 1) {
    e.metrics_payload = (3.0 + static_cast<double>(s.layers) * s.heads) * 4.0 +
                        static_cast<double>(s.moe_layers) * s.experts * 8.0;
  }

  const double local_params = replicated + experts_local;
  e.param_bytes = local_params * kMemBytes;
  e.grad_bytes = local_params * kMemBytes;
  // AdamW: two moments; Muon: one momentum per matrix element (AdamW for the rest).
  const double muon_replicated =
      s.muon ? std::max(0.0, static_cast<double>(s.muon_params - s.expert_params)) : 0.0;
  const double expert_state = (s.muon ? 1.0 : 2.0) * experts_local;
  const double replicated_state =
      s.muon ? muon_replicated + 2.0 * (replicated - muon_replicated) : 2.0 * replicated;
  e.optimizer_bytes = kMemBytes * (l.zero1 ? replicated_state / world + expert_state / dp
                                           : replicated_state + expert_state);
  return e;
}

RunConfig K2LikeConfig(int64_t global_tokens) {
  RunConfig c;
  c.model.vocab_size = 163840;
  c.model.d_model = 7168;
  c.model.layers = 61;
  c.model.heads = 64;
  c.model.attention = "mla";
  c.model.q_lora_rank = 1536;
  c.model.kv_lora_rank = 512;
  c.model.qk_nope_head_dim = 128;
  c.model.qk_rope_head_dim = 64;
  c.model.v_head_dim = 128;
  c.model.ffn_hidden = 18432;
  c.model.seq_len = 4096;
  c.moe.experts_total = 384;
  c.moe.experts_active = 8;
  c.moe.shared_experts = 1;
  c.moe.expert_hidden = 2048;
  c.moe.dense_layers = 1;
  c.optimizer.name = "muonclip";
  c.train.batch_size = static_cast<int>(global_tokens / c.model.seq_len);
  return c;
}

std::string K2ScalingTable() {
  const CommShape s = CommShapeOf(K2LikeConfig());
  CommCost bf16;
  bf16.bytes_per_element = 2;
  bf16.beta_bytes_per_s = 50e9;  // ~400 Gb/s per GPU (InfiniBand NDR)
  std::string t = fmt::format(
      "K2-like shape: {:.2f} T parameters ({:.2f} T in routed experts), {} MoE layers, top-{} "
      "of {}, {:.1f} M tokens per step; bf16 communication, fp32 memory; ring algorithms, "
      "50 GB/s and 5 µs per message; no pipeline or tensor parallelism.\n\n",
      s.params_total / 1e12, s.expert_params / 1e12, s.moe_layers, s.top_k, s.experts,
      s.tokens_per_step / 1e6);
  t += "| ranks | EP | DP | M tokens/rank | grad reduce-scatter GB/rank | EP all-to-all GB/rank | "
       "param all-gather GB/rank | params+grads GB/rank | optimizer GB/rank (off / ZeRO-1) | "
       "comm s/step (ZeRO-1) |\n";
  t += "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n";
  for (int ranks : {8, 64, 256, 1024}) {
    for (int ep : {8, 16, 64}) {
      if (ep > ranks) continue;
      const CommEstimate off = EstimateComm(s, {ranks, ep, false}, bf16);
      const CommEstimate z = EstimateComm(s, {ranks, ep, true}, bf16);
      t += fmt::format(
          "| {} | {} | {} | {:.2f} | {:.0f} | {:.0f} | {:.0f} | {:.0f} | {:.0f} / {:.1f} | "
          "{:.1f} |\n",
          ranks, ep, ranks / ep, s.tokens_per_step / 1e6 / ranks,
          (z.dense_grad_wire + z.expert_grad_wire) / 1e9, z.a2a_wire / 1e9, z.gather_wire / 1e9,
          (z.param_bytes + z.grad_bytes) / 1e9, off.optimizer_bytes / 1e9, z.optimizer_bytes / 1e9,
          z.time_s);
    }
  }
  return t;
}

}  // namespace moelab::analysis
