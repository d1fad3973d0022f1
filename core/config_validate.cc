// ValidateConfig (core/config.h): every field's range and the rules between fields, each
// failure a ConfigError naming the JSON path, before anything runs.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "core/config.h"
#include "core/kernel_choices.h"

namespace moelab {

namespace {

void Require(bool ok, const std::string& path, const std::string& reason) {
  if (!ok) throw ConfigError(path, reason);
}

}  // namespace

void ValidateConfig(const RunConfig& c) {
  const ModelConfig& m = c.model;
  const MoEConfig& e = c.moe;
  Require(m.vocab_size >= 2, "model.vocab_size", "must be at least 2");
  Require(m.d_model >= 1, "model.d_model", "must be positive");
  Require(m.layers >= 1, "model.layers", "must be positive");
  Require(m.heads >= 1, "model.heads", "must be positive");
  Require(m.seq_len >= 2, "model.seq_len", "must be at least 2");
  Require(m.kv_heads >= 0, "model.kv_heads", "must be 0 (= heads) or positive");
  Require(m.kv_heads <= m.heads, "model.kv_heads",
          fmt::format("{} key/value heads exceed the {} query heads", m.kv_heads, m.heads));
  Require(m.heads % m.kv_heads_effective() == 0, "model.kv_heads",
          fmt::format("GQA groups: kv_heads {} does not divide heads {}", m.kv_heads, m.heads));
  Require(m.head_dim >= 0, "model.head_dim", "must be 0 (= d_model / heads) or positive");
  if (m.head_dim == 0) {
    Require(m.d_model % m.heads == 0, "model.heads",
            fmt::format("heads {} does not divide d_model {} (or set model.head_dim)", m.heads,
                        m.d_model));
  }
  Require(m.head_dim_effective() % 2 == 0, "model.head_dim",
          fmt::format("head dimension {} must be even for RoPE", m.head_dim_effective()));
  Require(m.ffn_hidden >= 1, "model.ffn_hidden", "must be positive");
  Require(m.rope_theta > 0, "model.rope_theta", "must be positive");
  Require(m.norm_eps > 0, "model.norm_eps", "must be positive");
  Require(m.init_std > 0, "model.init_std", "must be positive");
  Require(m.logit_softcap >= 0, "model.logit_softcap", "must be >= 0 (0 = off)");
  Require(m.z_loss >= 0, "model.z_loss", "must be >= 0");
  if (m.attention == "mla") {
    Require(m.kv_lora_rank >= 1, "model.kv_lora_rank", "MLA needs a positive latent rank");
    Require(m.q_lora_rank >= 0, "model.q_lora_rank", "must be >= 0");
    Require(m.qk_nope_head_dim >= 1, "model.qk_nope_head_dim", "must be positive for MLA");
    Require(m.qk_rope_head_dim >= 2 && m.qk_rope_head_dim % 2 == 0, "model.qk_rope_head_dim",
            "must be positive and even for MLA");
    Require(m.v_head_dim >= 1, "model.v_head_dim", "must be positive for MLA");
    Require(m.kv_heads == 0 || m.kv_heads == m.heads, "model.kv_heads",
            "MLA has no key/value head grouping; leave kv_heads at 0");
    Require(!m.qk_norm, "model.qk_norm",
            "QK-norm cannot be combined with MLA (keys are never materialised per head)");
  }
  Require(!(m.qk_norm && c.optimizer.qk_clip_tau > 0), "model.qk_norm",
          "QK-norm cannot be combined with QK-Clip (optimizer.qk_clip_tau > 0): the clip's "
          "rescaling would be undone by the normalisation");

  if (e.enabled()) {
    Require(e.experts_active >= 1, "moe.experts_active", "must be at least 1");
    Require(e.experts_active <= e.experts_total, "moe.experts_active",
            fmt::format("top-k {} exceeds experts_total {}", e.experts_active, e.experts_total));
    Require(e.expert_hidden >= 1, "moe.expert_hidden", "must be positive");
    Require(e.shared_experts >= 0, "moe.shared_experts", "must be >= 0");
    Require(e.dense_layers >= 0 && e.dense_layers <= m.layers, "moe.dense_layers",
            fmt::format("must be between 0 and model.layers ({})", m.layers));
    Require(e.aux_loss_coef >= 0, "moe.aux_loss_coef", "must be >= 0");
    Require(e.bias_update_rate >= 0, "moe.bias_update_rate", "must be >= 0");
    Require(e.route_scale > 0, "moe.route_scale", "must be positive");
  } else {
    Require(e.experts_total == 0, "moe.experts_total", "must be >= 0 (0 = dense model)");
  }

  const OptimizerConfig& o = c.optimizer;
  Require(o.lr > 0, "optimizer.lr", "must be positive");
  Require(o.adamw_lr >= 0, "optimizer.adamw_lr", "must be 0 (= optimizer.lr) or positive");
  Require(o.beta1 >= 0 && o.beta1 < 1, "optimizer.beta1", "must be in [0, 1)");
  Require(o.beta2 >= 0 && o.beta2 < 1, "optimizer.beta2", "must be in [0, 1)");
  Require(o.eps > 0, "optimizer.eps", "must be positive");
  Require(o.weight_decay >= 0, "optimizer.weight_decay", "must be >= 0");
  Require(o.grad_clip >= 0, "optimizer.grad_clip", "must be >= 0 (0 = off)");
  static const std::vector<std::string> kinds = {
      "embedding", "lm_head", "norm",   "router",        "attn_q", "attn_k", "attn_v",
      "attn_o",    "ffn",     "expert", "shared_expert", "mla",    "bias"};
  for (size_t i = 0; i < o.no_decay.size(); ++i) {
    Require(std::find(kinds.begin(), kinds.end(), o.no_decay[i]) != kinds.end(),
            fmt::format("optimizer.no_decay[{}]", i),
            fmt::format("unknown parameter kind '{}'; kinds: {}", o.no_decay[i],
                        fmt::join(kinds, ", ")));
  }
  Require(o.name != "muonclip" || o.qk_clip_tau > 0, "optimizer.qk_clip_tau",
          "muonclip needs a threshold > 0 (K2 uses 100)");
  Require(o.muon_momentum >= 0 && o.muon_momentum < 1, "optimizer.muon_momentum",
          "must be in [0, 1)");
  Require(o.muon_ns_steps >= 1 && o.muon_ns_steps <= 20, "optimizer.muon_ns_steps",
          "must be between 1 and 20");
  Require(o.qk_clip_tau >= 0, "optimizer.qk_clip_tau", "must be >= 0 (0 = off)");
  Require(o.qk_clip_alpha >= 0 && o.qk_clip_alpha <= 1, "optimizer.qk_clip_alpha",
          "must be in [0, 1]");

  const ScheduleConfig& s = c.schedule;
  Require(s.warmup_steps >= 0, "schedule.warmup_steps", "must be >= 0");
  Require(s.min_lr_ratio >= 0 && s.min_lr_ratio <= 1, "schedule.min_lr_ratio", "must be in [0, 1]");
  Require(s.decay_fraction > 0 && s.decay_fraction <= 1, "schedule.decay_fraction",
          "must be in (0, 1]");

  const DataConfig& d = c.data;
  if (d.source == "corpus") Require(!d.path.empty(), "data.path", "must name a folder");
  if (d.source == "markov") {
    Require(d.markov_order >= 1 && d.markov_order <= 4, "data.markov_order",
            "must be between 1 and 4");
    Require(std::pow(static_cast<double>(m.vocab_size), d.markov_order + 1) <= 2e8,
            "data.markov_order",
            fmt::format("vocab_size^(order+1) = {}^{} transition entries is too many for a "
                        "synthetic chain; lower the order or model.vocab_size",
                        m.vocab_size, d.markov_order + 1));
    Require(d.markov_concentration > 0, "data.markov_concentration", "must be positive");
  }

  const TrainConfig& t = c.train;
  Require(t.batch_size >= 1, "train.batch_size", "must be positive");
  Require(t.micro_batch >= 0 && t.micro_batch <= t.batch_size, "train.micro_batch",
          fmt::format("must be between 0 (the whole local batch) and train.batch_size ({})",
                      t.batch_size));
  Require(t.tokens >= 0, "train.tokens", "must be >= 0");
  if (t.tokens == 0) Require(t.steps >= 1, "train.steps", "must be positive (or set train.tokens)");
  Require(t.threads >= 1 && t.threads <= 1024, "train.threads", "must be between 1 and 1024");
  Require(t.device == "cuda" || t.effective_precision() == "fp32", "train.precision",
          "bf16 needs train.device \"cuda\" (the CPU model computes in fp32)");
  Require(c.schedule.warmup_steps < c.total_steps() || c.total_steps() <= 1,
          "schedule.warmup_steps",
          fmt::format("warmup {} is not shorter than the run ({} steps)", s.warmup_steps,
                      c.total_steps()));
  Require(c.eval.every >= 0, "eval.every", "must be >= 0");
  Require(c.eval.batches >= 1, "eval.batches", "must be positive");
  Require(c.checkpoint.every >= 0, "checkpoint.every", "must be >= 0");
  Require(c.checkpoint.keep >= 1, "checkpoint.keep", "must be at least 1");
  Require(c.dist.expert_parallel >= 1, "dist.expert_parallel", "must be at least 1");
  if (c.dist.expert_parallel > 1) {
    Require(e.enabled(), "dist.expert_parallel", "expert parallelism needs an MoE model");
    Require(c.dist.expert_parallel <= e.experts_total, "dist.expert_parallel",
            fmt::format("{} expert-parallel ranks exceed the {} experts", c.dist.expert_parallel,
                        e.experts_total));
    Require(e.experts_total % c.dist.expert_parallel == 0, "dist.expert_parallel",
            fmt::format("{} experts do not split evenly over {} expert-parallel ranks",
                        e.experts_total, c.dist.expert_parallel));
  }
  Require(c.dist.bucket_mb > 0 && c.dist.bucket_mb <= 4096, "dist.bucket_mb",
          "must be in (0, 4096]");
  ValidateKernelChoices(t.kernels, t.device);  // core/kernel_choices.h
}

}  // namespace moelab
