// The run configuration: one JSON document describes a run. Every field has a default here;
// docs/config.md is checked against these defaults by a test.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/kernel_choices.h"

namespace moelab {

struct ModelConfig {
  int vocab_size = 512;
  int d_model = 256;
  int layers = 4;
  int heads = 4;
  int kv_heads = 0;        // 0: same as heads (MHA); fewer: GQA, must divide heads.
  int head_dim = 0;        // 0: d_model / heads.
  int ffn_hidden = 1024;   // SwiGLU hidden size of dense layers.
  int seq_len = 256;
  bool tie_embeddings = false;
  double rope_theta = 10000.0;
  double norm_eps = 1e-5;
  double init_std = 0.02;
  // Attention variants and stability knobs (the MuonClip issue).
  std::string attention = "mha";  // "mha" (GQA when kv_heads < heads) | "mla"
  int q_lora_rank = 0;            // MLA: 0 means no query compression.
  int kv_lora_rank = 64;          // MLA
  int qk_nope_head_dim = 32;      // MLA
  int qk_rope_head_dim = 16;      // MLA
  int v_head_dim = 32;            // MLA
  double logit_softcap = 0.0;     // 0: off; otherwise cap·tanh(s/cap) on attention logits.
  bool qk_norm = false;           // RMSNorm on q and k per head.
  double z_loss = 0.0;            // coefficient of the output z-loss.

  int kv_heads_effective() const { return kv_heads > 0 ? kv_heads : heads; }
  int head_dim_effective() const { return head_dim > 0 ? head_dim : d_model / heads; }
};

struct MoEConfig {
  int experts_total = 0;     // 0: dense model (every layer a SwiGLU FFN).
  int experts_active = 2;    // top-k
  int shared_experts = 0;    // always-on experts, same hidden size as routed ones
  int expert_hidden = 256;
  int dense_layers = 0;      // the first dense_layers layers use the dense FFN
  std::string router = "softmax";    // "softmax" | "sigmoid"
  double route_scale = 1.0;          // multiplies the renormalised gates
  // "aux_free" | "aux_loss" | "none". Default aux_free since issue 23 (docs/model.md, "Load
  // balancing"); configs hashed before keep their hashes (ConfigHash).
  std::string balance = "aux_free";
  double aux_loss_coef = 0.01;
  double bias_update_rate = 1e-3;

  bool enabled() const { return experts_total > 0; }
};

struct OptimizerConfig {
  std::string name = "adamw";  // "adamw" | "muon" | "muonclip" (muon + QK-Clip)
  double lr = 3e-3;
  // Peak learning rate of the AdamW group under Muon/MuonClip (embeddings, LM head, norm gains,
  // router); 0 = optimizer.lr. Not written into the config hash when 0, so old hashes hold.
  double adamw_lr = 0.0;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;
  double grad_clip = 1.0;  // global-norm clip; 0 disables
  // Parameter kinds excluded from weight decay (see docs/config.md for the kinds).
  std::vector<std::string> no_decay = {"norm", "bias", "embedding"};
  // Muon (the MuonClip issue).
  double muon_momentum = 0.95;
  // Plain momentum, as Kimi K2's MuonClip (Algorithm 1: M = μM + G, O = NS(M)) and Moonlight's
  // Muon; Nesterov (U = G + μM, Keller Jordan's Muon) is opt-in.
  bool muon_nesterov = false;
  std::string muon_scale = "rms_match";  // "rms_match" = 0.2·sqrt(max(n,m)) | "shape"
  int muon_ns_steps = 5;
  // "syrk": the plain quintic iteration with symmetric kernels; "gram": iterate on the small
  // Gram matrix and multiply by X once (faster on non-square matrices, slightly more rounding).
  std::string muon_ns_kernel = "syrk";
  // QK-Clip, independent of the optimizer.
  double qk_clip_tau = 0.0;  // 0: off
  double qk_clip_alpha = 0.5;
  std::string qk_clip_mode = "per_head";  // "per_head" | "global"
};

struct ScheduleConfig {
  std::string type = "cosine";  // "constant" | "cosine" | "linear" | "wsd"
  int warmup_steps = 20;
  double min_lr_ratio = 0.1;    // final lr / peak lr for cosine, linear and wsd
  double decay_fraction = 0.2;  // wsd: fraction of steps spent decaying
};

struct DataConfig {
  std::string source = "corpus";  // "corpus" | "markov"
  std::string path = "data/default";  // folder written by `moelab data prepare`
  // Synthetic Markov source: vocab = model.vocab_size.
  int markov_order = 1;
  double markov_concentration = 0.1;  // Dirichlet concentration: smaller = lower entropy
  uint64_t markov_seed = 1234;
};

struct TrainConfig {
  int batch_size = 8;
  // Sequences per forward/backward on each rank (gradient accumulation); 0 = the whole local
  // batch. Not hashed: the step equals the unsplit one up to float rounding.
  int micro_batch = 0;
  int steps = 200;
  int64_t tokens = 0;  // if > 0, steps = ceil(tokens / (batch_size * seq_len))
  uint64_t seed = 1;
  int threads = 2;
  // Where the step runs (docs/cuda.md): "cpu" | "cuda". Not in the config hash: a cuda fp32 run
  // is the same experiment as the cpu run.
  std::string device = "cpu";
  // "auto" (bf16 on cuda, fp32 on cpu) | "fp32" | "bf16" (cuda only: bf16 compute, fp32 master
  // weights and accumulation). Hashed as the effective precision, and only when it is bf16, so
  // existing configs keep their hash.
  std::string precision = "auto";

  std::string effective_precision() const {
    if (precision != "auto") return precision;
    return device == "cuda" ? "bf16" : "fp32";
  }
  // The GPU kernel implementations (core/kernel_choices.h): recorded with the run, not hashed.
  KernelChoices kernels;
};

struct EvalConfig {
  int every = 50;    // 0: only at the end
  int batches = 4;
};

struct CheckpointConfig {
  int every = 100;  // 0: only at the end
  std::string dir = "runs";
  int keep = 2;
};

// How a run is spread over ranks (issue 9). Not hashed: the layout does not change the
// trajectory (within reduction-order rounding), so a run keeps its hash and checkpoints when it
// resumes at another rank count.
struct DistConfig {
  bool zero1 = false;       // shard optimizer state over the data-parallel ranks
  int expert_parallel = 1;  // ranks that split each MoE layer's experts (EP size)
  double bucket_mb = 4.0;   // gradient all-reduce bucket size in MiB
  bool overlap = true;      // start each bucket's reduction as the backward finishes it
};

struct RunConfig {
  ModelConfig model;
  MoEConfig moe;
  OptimizerConfig optimizer;
  ScheduleConfig schedule;
  DataConfig data;
  TrainConfig train;
  EvalConfig eval;
  CheckpointConfig checkpoint;
  DistConfig dist;

  int total_steps() const;
};

// Run arithmetic, computed here once so trainers, planners and the database agree.
// MoE layers: every layer after the first moe.dense_layers; none in a dense model.
int MoeLayers(const ModelConfig& model, const MoEConfig& moe);
// Tokens one optimizer step trains on: train.batch_size (the global batch, summed over the
// data-parallel ranks) × model.seq_len.
int64_t TokensPerStep(const RunConfig& config);

// Thrown for any invalid configuration; the message names the JSON path and the reason.
class ConfigError : public std::runtime_error {
 public:
  ConfigError(const std::string& path, const std::string& reason)
      : std::runtime_error(path + ": " + reason), path_(path), reason_(reason) {}
  const std::string& path() const { return path_; }
  const std::string& reason() const { return reason_; }

 private:
  std::string path_;
  std::string reason_;
};

// JSON -> config: rejects unknown keys (with a "did you mean" hint) and wrong types, then
// validates combinations. Missing fields take their defaults.
RunConfig ConfigFromJson(const nlohmann::json& j);
// Config -> full JSON with every field present (the canonical content).
nlohmann::json ConfigToJson(const RunConfig& c);
// Validates combinations (heads dividing d_model, top-k <= experts, ...); throws ConfigError.
void ValidateConfig(const RunConfig& c);
// Applies "a.b.c=value" overrides to a JSON document; value is parsed as JSON when it can be,
// otherwise taken as a string.
void ApplyOverride(nlohmann::json& j, const std::string& assignment);
// Canonical serialisation: sorted keys, numbers printed canonically (3e6 == 3000000).
std::string CanonicalJson(const nlohmann::json& j);
// SHA-256 of the canonical form of the fully defaulted config.
std::string ConfigHash(const RunConfig& c);
std::string Sha256Hex(const std::string& data);
// Hash of everything but the run length (train.steps, train.tokens): configs with the same
// branch hash follow the same trajectory until the shorter one's WSD decay starts.
std::string BranchHash(const RunConfig& c);

// Markdown reference of every field with its default (docs/config.md).
std::string ConfigDocsMarkdown();

RunConfig LoadConfigFile(const std::string& path, const std::vector<std::string>& overrides = {});

}  // namespace moelab
