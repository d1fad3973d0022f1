#include "core/config.h"

#include <fmt/format.h>
#include <openssl/evp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <limits>
#include <sstream>

#include "core/did_you_mean.h"
#include "core/printable.h"

namespace moelab {

using nlohmann::json;

namespace {

enum class FieldType { kInt, kInt64, kUint64, kDouble, kBool, kString, kStringList };

// One leaf of the config: its JSON path, type, where it lives in RunConfig, and its doc line.
// This table is the single source of truth for parsing, serialising and docs/config.md.
struct Field {
  std::string path;
  FieldType type;
  std::function<void*(RunConfig&)> ref;
  std::string doc;
  std::vector<std::string> choices;  // for strings with a fixed set of values
  bool in_hash = true;               // false: does not change the experiment (threads, ckpt)
};

template <typename M>
std::function<void*(RunConfig&)> Ref(M RunConfig::*section, auto M::*member) {
  return [section, member](RunConfig& c) -> void* { return &(c.*section.*member); };
}

std::vector<Field> ModelFields() {
  using C = RunConfig;
  return {
      {"model.vocab_size", FieldType::kInt, Ref(&C::model, &ModelConfig::vocab_size),
       "Vocabulary size; must be >= the tokenizer's vocabulary for corpus data."},
      {"model.d_model", FieldType::kInt, Ref(&C::model, &ModelConfig::d_model), "Model width."},
      {"model.layers", FieldType::kInt, Ref(&C::model, &ModelConfig::layers),
       "Number of transformer blocks."},
      {"model.heads", FieldType::kInt, Ref(&C::model, &ModelConfig::heads),
       "Query heads per attention layer."},
      {"model.kv_heads", FieldType::kInt, Ref(&C::model, &ModelConfig::kv_heads),
       "Key/value heads; 0 = heads (MHA), fewer = GQA (must divide heads)."},
      {"model.head_dim", FieldType::kInt, Ref(&C::model, &ModelConfig::head_dim),
       "Per-head q/k/v dimension; 0 = d_model / heads. Must be even (RoPE)."},
      {"model.ffn_hidden", FieldType::kInt, Ref(&C::model, &ModelConfig::ffn_hidden),
       "SwiGLU hidden size of dense layers."},
      {"model.seq_len", FieldType::kInt, Ref(&C::model, &ModelConfig::seq_len),
       "Training context length in tokens."},
      {"model.tie_embeddings", FieldType::kBool, Ref(&C::model, &ModelConfig::tie_embeddings),
       "Share the token embedding with the LM head."},
      {"model.rope_theta", FieldType::kDouble, Ref(&C::model, &ModelConfig::rope_theta),
       "RoPE base frequency."},
      {"model.norm_eps", FieldType::kDouble, Ref(&C::model, &ModelConfig::norm_eps),
       "RMSNorm epsilon."},
      {"model.init_std", FieldType::kDouble, Ref(&C::model, &ModelConfig::init_std),
       "Std of the normal initialisation (output projections also scaled by 1/sqrt(2·layers))."},
      {"model.attention",
       FieldType::kString,
       Ref(&C::model, &ModelConfig::attention),
       "Attention type: mha (GQA when kv_heads < heads) or mla.",
       {"mha", "mla"}},
      {"model.q_lora_rank", FieldType::kInt, Ref(&C::model, &ModelConfig::q_lora_rank),
       "MLA: query latent rank; 0 = no query compression."},
      {"model.kv_lora_rank", FieldType::kInt, Ref(&C::model, &ModelConfig::kv_lora_rank),
       "MLA: compressed key/value latent rank."},
      {"model.qk_nope_head_dim", FieldType::kInt, Ref(&C::model, &ModelConfig::qk_nope_head_dim),
       "MLA: per-head non-rotary q/k dimension."},
      {"model.qk_rope_head_dim", FieldType::kInt, Ref(&C::model, &ModelConfig::qk_rope_head_dim),
       "MLA: rotary q/k dimension (one shared rotary key)."},
      {"model.v_head_dim", FieldType::kInt, Ref(&C::model, &ModelConfig::v_head_dim),
       "MLA: per-head value dimension."},
      {"model.logit_softcap", FieldType::kDouble, Ref(&C::model, &ModelConfig::logit_softcap),
       "Attention logit soft-cap cap·tanh(s/cap); 0 = off."},
      {"model.qk_norm", FieldType::kBool, Ref(&C::model, &ModelConfig::qk_norm),
       "RMSNorm on q and k per head (not combinable with QK-Clip or MLA)."},
      {"model.z_loss", FieldType::kDouble, Ref(&C::model, &ModelConfig::z_loss),
       "Coefficient of the output z-loss mean(logsumexp(logits)^2); 0 = off."},
  };
}

std::vector<Field> MoeFields() {
  using C = RunConfig;
  return {
      {"moe.experts_total", FieldType::kInt, Ref(&C::moe, &MoEConfig::experts_total),
       "Routed experts per MoE layer; 0 = dense model."},
      {"moe.experts_active", FieldType::kInt, Ref(&C::moe, &MoEConfig::experts_active),
       "Routed experts chosen per token (top-k)."},
      {"moe.shared_experts", FieldType::kInt, Ref(&C::moe, &MoEConfig::shared_experts),
       "Always-on experts per MoE layer."},
      {"moe.expert_hidden", FieldType::kInt, Ref(&C::moe, &MoEConfig::expert_hidden),
       "SwiGLU hidden size of each routed and shared expert."},
      {"moe.dense_layers", FieldType::kInt, Ref(&C::moe, &MoEConfig::dense_layers),
       "The first dense_layers blocks use the dense FFN instead of MoE."},
      {"moe.router",
       FieldType::kString,
       Ref(&C::moe, &MoEConfig::router),
       "Router score function.",
       {"softmax", "sigmoid"}},
      {"moe.route_scale", FieldType::kDouble, Ref(&C::moe, &MoEConfig::route_scale),
       "Multiplier of the gates after renormalisation over the chosen experts."},
      {"moe.balance",
       FieldType::kString,
       Ref(&C::moe, &MoEConfig::balance),
       "Load balancing: the aux-loss-free selection bias of DeepSeek-V3 and Kimi K2, the Switch "
       "aux loss (on global-batch statistics), or none (docs/model.md).",
       {"aux_free", "aux_loss", "none"}},
      {"moe.aux_loss_coef", FieldType::kDouble, Ref(&C::moe, &MoEConfig::aux_loss_coef),
       "Coefficient of the aux loss coef·E·Σ f_i·P_i (balance = aux_loss)."},
      {"moe.bias_update_rate", FieldType::kDouble, Ref(&C::moe, &MoEConfig::bias_update_rate),
       "Aux-loss-free bias step: b_i += rate·sign(mean load − load_i) (balance = aux_free)."},
  };
}

std::vector<Field> OptimizerFields() {
  using C = RunConfig;
  return {
      {"optimizer.name",
       FieldType::kString,
       Ref(&C::optimizer, &OptimizerConfig::name),
       "Optimizer for hidden matrices (muonclip = muon with QK-Clip, needs qk_clip_tau > 0); "
       "embeddings, LM head, norms and router always use AdamW.",
       {"adamw", "muon", "muonclip"}},
      {"optimizer.lr", FieldType::kDouble, Ref(&C::optimizer, &OptimizerConfig::lr),
       "Peak learning rate."},
      {"optimizer.adamw_lr", FieldType::kDouble, Ref(&C::optimizer, &OptimizerConfig::adamw_lr),
       "Peak learning rate of the AdamW group under muon/muonclip (embeddings, LM head, norm "
       "gains, router), on the same schedule; 0 = optimizer.lr. Hold it equal across arms "
       "when comparing Muon learning rates."},
      {"optimizer.beta1", FieldType::kDouble, Ref(&C::optimizer, &OptimizerConfig::beta1),
       "AdamW first-moment decay."},
      {"optimizer.beta2", FieldType::kDouble, Ref(&C::optimizer, &OptimizerConfig::beta2),
       "AdamW second-moment decay."},
      {"optimizer.eps", FieldType::kDouble, Ref(&C::optimizer, &OptimizerConfig::eps),
       "AdamW epsilon."},
      {"optimizer.weight_decay", FieldType::kDouble,
       Ref(&C::optimizer, &OptimizerConfig::weight_decay),
       "Decoupled weight decay λ (w ← w − lr·λ·w)."},
      {"optimizer.grad_clip", FieldType::kDouble, Ref(&C::optimizer, &OptimizerConfig::grad_clip),
       "Global gradient-norm clip; 0 = off."},
      {"optimizer.no_decay", FieldType::kStringList, Ref(&C::optimizer, &OptimizerConfig::no_decay),
       "Parameter kinds without weight decay (embedding, lm_head, norm, router, attn_q, attn_k, "
       "attn_v, attn_o, ffn, expert, shared_expert, mla)."},
      {"optimizer.muon_momentum", FieldType::kDouble,
       Ref(&C::optimizer, &OptimizerConfig::muon_momentum), "Muon momentum μ."},
      {"optimizer.muon_nesterov", FieldType::kBool,
       Ref(&C::optimizer, &OptimizerConfig::muon_nesterov),
       "Nesterov momentum for Muon (off: plain momentum, as MuonClip's Algorithm 1 in the "
       "Kimi K2 report)."},
      {"optimizer.muon_scale",
       FieldType::kString,
       Ref(&C::optimizer, &OptimizerConfig::muon_scale),
       "Muon update scale: rms_match = 0.2·sqrt(max(n,m)) (Moonlight/K2), shape = "
       "sqrt(max(1,n/m)).",
       {"rms_match", "shape"}},
      {"optimizer.muon_ns_steps", FieldType::kInt,
       Ref(&C::optimizer, &OptimizerConfig::muon_ns_steps), "Newton–Schulz iterations."},
      {"optimizer.muon_ns_kernel",
       FieldType::kString,
       Ref(&C::optimizer, &OptimizerConfig::muon_ns_kernel),
       "Newton–Schulz kernel: syrk (plain iteration, symmetric products) or gram (iterate on the "
       "small Gram matrix, multiply by X once: faster for non-square matrices, ~1e-4 more "
       "rounding in float).",
       {"syrk", "gram"}},
      {"optimizer.qk_clip_tau", FieldType::kDouble,
       Ref(&C::optimizer, &OptimizerConfig::qk_clip_tau),
       "QK-Clip threshold τ on the per-head max logit; 0 = off (Muon + τ = MuonClip)."},
      {"optimizer.qk_clip_alpha", FieldType::kDouble,
       Ref(&C::optimizer, &OptimizerConfig::qk_clip_alpha),
       "QK-Clip split: W_q scaled by γ^α, W_k by γ^(1−α) (MHA)."},
      {"optimizer.qk_clip_mode",
       FieldType::kString,
       Ref(&C::optimizer, &OptimizerConfig::qk_clip_mode),
       "per_head (K2) or global (one γ from the max over heads).",
       {"per_head", "global"}},
  };
}

std::vector<Field> ScheduleFields() {
  using C = RunConfig;
  return {
      {"schedule.type",
       FieldType::kString,
       Ref(&C::schedule, &ScheduleConfig::type),
       "Learning-rate schedule after warmup.",
       {"constant", "cosine", "linear", "wsd"}},
      {"schedule.warmup_steps", FieldType::kInt, Ref(&C::schedule, &ScheduleConfig::warmup_steps),
       "Linear warmup steps."},
      {"schedule.min_lr_ratio", FieldType::kDouble,
       Ref(&C::schedule, &ScheduleConfig::min_lr_ratio),
       "Final lr as a fraction of the peak (cosine, linear, wsd)."},
      {"schedule.decay_fraction", FieldType::kDouble,
       Ref(&C::schedule, &ScheduleConfig::decay_fraction),
       "WSD: fraction of all steps spent in the final linear decay."},
  };
}

std::vector<Field> DataFields() {
  using C = RunConfig;
  return {
      {"data.source",
       FieldType::kString,
       Ref(&C::data, &DataConfig::source),
       "corpus (prepared shards) or markov (synthetic source with a known entropy rate).",
       {"corpus", "markov"}},
      {"data.path", FieldType::kString, Ref(&C::data, &DataConfig::path),
       "Folder written by `moelab data prepare` (corpus)."},
      {"data.markov_order", FieldType::kInt, Ref(&C::data, &DataConfig::markov_order),
       "Order of the synthetic Markov chain."},
      {"data.markov_concentration", FieldType::kDouble,
       Ref(&C::data, &DataConfig::markov_concentration),
       "Dirichlet concentration of the transition rows (smaller = lower entropy)."},
      {"data.markov_seed", FieldType::kUint64, Ref(&C::data, &DataConfig::markov_seed),
       "Seed of the synthetic chain itself (not of the sampling)."},
  };
}

std::vector<Field> TrainFields() {
  using C = RunConfig;
  return {
      {"train.batch_size", FieldType::kInt, Ref(&C::train, &TrainConfig::batch_size),
       "Sequences per optimizer step."},
      {"train.micro_batch",
       FieldType::kInt,
       Ref(&C::train, &TrainConfig::micro_batch),
       "Sequences per forward/backward on each rank (gradient accumulation); 0 = the whole "
       "local batch. Equal to the unsplit step up to float rounding.",
       {},
       false},
      {"train.steps", FieldType::kInt, Ref(&C::train, &TrainConfig::steps),
       "Optimizer steps (ignored when train.tokens > 0)."},
      {"train.tokens", FieldType::kInt64, Ref(&C::train, &TrainConfig::tokens),
       "Training tokens; > 0 sets steps = ceil(tokens / (batch_size·seq_len))."},
      {"train.seed", FieldType::kUint64, Ref(&C::train, &TrainConfig::seed),
       "Seed of initialisation and data sampling."},
      {"train.threads",
       FieldType::kInt,
       Ref(&C::train, &TrainConfig::threads),
       "CPU threads (OpenMP and OpenBLAS share one pool).",
       {},
       false},
      {"train.device",
       FieldType::kString,
       Ref(&C::train, &TrainConfig::device),
       "Where the step runs; cuda needs a GPU (docs/cuda.md).",
       {"cpu", "cuda"},
       false},
      {"train.precision",
       FieldType::kString,
       Ref(&C::train, &TrainConfig::precision),
       "auto = bf16 on cuda, fp32 on cpu; bf16 (cuda only) keeps fp32 master weights. Hashed as "
       "the effective precision, and only when that is bf16 (docs/cuda.md).",
       {"auto", "fp32", "bf16"}},
  };
}

std::vector<Field> EvalFields() {
  using C = RunConfig;
  return {
      {"eval.every", FieldType::kInt, Ref(&C::eval, &EvalConfig::every),
       "Validation every N steps (and always at the end); 0 = only at the end."},
      {"eval.batches", FieldType::kInt, Ref(&C::eval, &EvalConfig::batches),
       "Validation batches (of train.batch_size sequences) per evaluation."},
  };
}

std::vector<Field> CheckpointFields() {
  using C = RunConfig;
  return {
      {"checkpoint.every",
       FieldType::kInt,
       Ref(&C::checkpoint, &CheckpointConfig::every),
       "Checkpoint every N steps (and at the end); 0 = only at the end.",
       {},
       false},
      {"checkpoint.dir",
       FieldType::kString,
       Ref(&C::checkpoint, &CheckpointConfig::dir),
       "Folder for checkpoints (one sub-folder `<config hash16>/<run uuid>` per run).",
       {},
       false},
      {"checkpoint.keep",
       FieldType::kInt,
       Ref(&C::checkpoint, &CheckpointConfig::keep),
       "How many recent checkpoints to keep per run.",
       {},
       false},
  };
}

std::vector<Field> DistFields() {
  using C = RunConfig;
  return {
      {"dist.zero1",
       FieldType::kBool,
       Ref(&C::dist, &DistConfig::zero1),
       "ZeRO-1: shard AdamW moments and Muon momentum over the data-parallel ranks.",
       {},
       false},
      {"dist.expert_parallel",
       FieldType::kInt,
       Ref(&C::dist, &DistConfig::expert_parallel),
       "Expert-parallel size: ranks sharing each MoE layer's experts; must divide the world "
       "size and experts_total.",
       {},
       false},
      {"dist.bucket_mb",
       FieldType::kDouble,
       Ref(&C::dist, &DistConfig::bucket_mb),
       "Gradient all-reduce bucket size in MiB.",
       {},
       false},
      {"dist.overlap",
       FieldType::kBool,
       Ref(&C::dist, &DistConfig::overlap),
       "Data parallelism: start each gradient bucket's all-reduce as soon as the backward has "
       "finished it (same bits as after the backward).",
       {},
       false},
  };
}

// Every field, in the order of the JSON sections (the help, the docs table and the
// unknown-key suggestions list them in this order).
const std::vector<Field>& Fields() {
  static const std::vector<Field> fields = [] {
    std::vector<Field> all;
    for (auto section : {ModelFields, MoeFields, OptimizerFields, ScheduleFields, DataFields,
                         TrainFields, EvalFields, CheckpointFields, DistFields}) {
      std::vector<Field> part = section();
      all.insert(all.end(), std::make_move_iterator(part.begin()),
                 std::make_move_iterator(part.end()));
    }
    return all;
  }();
  return fields;
}

size_t EditDistance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] != b[j - 1])});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

std::vector<std::string> KnownPaths() {
  std::vector<std::string> paths;
  for (const Field& f : Fields()) {
    paths.push_back(f.path);
    std::string section = f.path.substr(0, f.path.find('.'));
    if (std::find(paths.begin(), paths.end(), section) == paths.end()) paths.push_back(section);
  }
  return paths;
}

std::string DidYouMean(const std::string& path) {
  const std::string near = NearestConfigPath(path);
  return near.empty() ? "" : fmt::format(" (did you mean '{}'?)", near);
}

std::string TypeName(FieldType t) {
  switch (t) {
    case FieldType::kInt:
    case FieldType::kInt64:
      return "an integer";
    case FieldType::kUint64:
      return "a non-negative integer";
    case FieldType::kDouble:
      return "a number";
    case FieldType::kBool:
      return "true or false";
    case FieldType::kString:
      return "a string";
    case FieldType::kStringList:
      return "a list of strings";
  }
  return "?";
}

std::string JsonTypeName(const json& v) { return v.type_name(); }

// Integers may be written as 3e6; they must still be integral.
bool AsInteger(const json& v, double lo, double hi, long long* out) {
  if (v.is_number_integer() || v.is_number_unsigned()) {
    const double d = v.get<double>();
    if (d < lo || d > hi) return false;
    *out = v.is_number_unsigned() ? static_cast<long long>(v.get<unsigned long long>())
                                  : v.get<long long>();
    return true;
  }
  if (v.is_number_float()) {
    const double d = v.get<double>();
    if (!std::isfinite(d) || std::floor(d) != d || d < lo || d > hi) return false;
    *out = static_cast<long long>(d);
    return true;
  }
  return false;
}

void SetField(const Field& f, const json& v, RunConfig& c) {
  void* p = f.ref(c);
  auto fail = [&](const std::string& extra = "") {
    throw ConfigError(f.path, fmt::format("expected {}, got {} {}{}", TypeName(f.type),
                                          JsonTypeName(v), v.dump(), extra));
  };
  long long i = 0;
  switch (f.type) {
    case FieldType::kInt:
      if (!AsInteger(v, std::numeric_limits<int>::min(), std::numeric_limits<int>::max(), &i))
        fail();
      *static_cast<int*>(p) = static_cast<int>(i);
      break;
    case FieldType::kInt64:
      if (!AsInteger(v, -9.2e18, 9.2e18, &i)) fail();
      *static_cast<int64_t*>(p) = i;
      break;
    case FieldType::kUint64:
      if (v.is_number_unsigned()) {
        *static_cast<uint64_t*>(p) = v.get<uint64_t>();
      } else {
        if (!AsInteger(v, 0, 1.8e19, &i)) fail();
        *static_cast<uint64_t*>(p) = static_cast<uint64_t>(i);
      }
      break;
    case FieldType::kDouble:
      if (!v.is_number()) fail();
      if (!std::isfinite(v.get<double>())) fail(" (must be finite)");
      *static_cast<double*>(p) = v.get<double>();
      break;
    case FieldType::kBool:
      if (!v.is_boolean()) fail();
      *static_cast<bool*>(p) = v.get<bool>();
      break;
    case FieldType::kString: {
      if (!v.is_string()) fail();
      const std::string s = v.get<std::string>();
      if (!f.choices.empty() &&
          std::find(f.choices.begin(), f.choices.end(), s) == f.choices.end()) {
        throw ConfigError(f.path, fmt::format("'{}' is not one of: {}", PrintableText(s),
                                              fmt::join(f.choices, ", ")));
      }
      *static_cast<std::string*>(p) = s;
      break;
    }
    case FieldType::kStringList: {
      if (!v.is_array()) fail();
      std::vector<std::string> list;
      for (size_t k = 0; k < v.size(); ++k) {
        if (!v[k].is_string()) {
          throw ConfigError(fmt::format("{}[{}]", f.path, k),
                            fmt::format("expected a string, got {}", JsonTypeName(v[k])));
        }
        list.push_back(v[k].get<std::string>());
      }
      *static_cast<std::vector<std::string>*>(p) = list;
      break;
    }
  }
}

json GetField(const Field& f, RunConfig& c) {
  void* p = f.ref(c);
  switch (f.type) {
    case FieldType::kInt:
      return *static_cast<int*>(p);
    case FieldType::kInt64:
      return *static_cast<int64_t*>(p);
    case FieldType::kUint64:
      return *static_cast<uint64_t*>(p);
    case FieldType::kDouble:
      return *static_cast<double*>(p);
    case FieldType::kBool:
      return *static_cast<bool*>(p);
    case FieldType::kString:
      return *static_cast<std::string*>(p);
    case FieldType::kStringList:
      return *static_cast<std::vector<std::string>*>(p);
  }
  return nullptr;
}

const Field* FindField(const std::string& path) {
  for (const Field& f : Fields())
    if (f.path == path) return &f;
  return nullptr;
}

void Walk(const json& j, const std::string& prefix, RunConfig& c) {
  if (!j.is_object()) {
    throw ConfigError(prefix.empty() ? "(root)" : prefix,
                      fmt::format("expected an object, got {}", JsonTypeName(j)));
  }
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (it.key().empty()) {  // else the message would name an empty path (found by fuzzing)
      throw ConfigError(prefix.empty() ? "(root)" : prefix, "an empty key \"\" is not a field");
    }
    const std::string path = prefix.empty() ? it.key() : prefix + "." + it.key();
    if (const Field* f = FindField(path)) {
      SetField(*f, it.value(), c);
      continue;
    }
    if (path == "train.kernels") {  // core/kernel_choices.h
      ParseKernelChoices(it.value(), path, &c.train.kernels);
      continue;
    }
    const auto known = KnownPaths();
    const bool is_section = std::find(known.begin(), known.end(), path) != known.end();
    if (is_section) {
      Walk(it.value(), path, c);
    } else if (prefix.empty() && (it.key() == "name" || it.key() == "description")) {
      // Free-text labels are allowed at the top level and ignored by the engine.
      if (!it.value().is_string()) throw ConfigError(path, "expected a string");
    } else {
      // Keys are the input's text: a NUL or an escape sequence must not reach the message.
      throw ConfigError(PrintableText(path), "unknown key" + DidYouMean(path));
    }
  }
}

void FormatNumber(double d, std::string* out) {
  if (std::floor(d) == d && std::fabs(d) < 9007199254740992.0) {
    *out += fmt::format("{}", static_cast<long long>(d));
  } else {
    *out += fmt::format("{}", d);  // shortest round-trip representation
  }
}

void Canonical(const json& j, std::string* out) {
  switch (j.type()) {
    case json::value_t::object: {
      *out += '{';
      bool first = true;
      for (auto it = j.begin(); it != j.end(); ++it) {  // nlohmann objects iterate sorted
        if (!first) *out += ',';
        first = false;
        *out += json(it.key()).dump();
        *out += ':';
        Canonical(it.value(), out);
      }
      *out += '}';
      break;
    }
    case json::value_t::array: {
      *out += '[';
      for (size_t i = 0; i < j.size(); ++i) {
        if (i) *out += ',';
        Canonical(j[i], out);
      }
      *out += ']';
      break;
    }
    case json::value_t::number_integer:
    case json::value_t::number_unsigned:
      *out += j.dump();
      break;
    case json::value_t::number_float:
      FormatNumber(j.get<double>(), out);
      break;
    default:
      *out += j.dump();
  }
}

}  // namespace

std::string NearestConfigPath(const std::string& name) {
  const std::string leaf = name.substr(name.rfind('.') + 1);
  const auto& foreign = ForeignConfigNames();
  if (const auto it = foreign.find(leaf); it != foreign.end()) return it->second;
  std::string best;
  size_t best_d = std::numeric_limits<size_t>::max();
  for (const std::string& known : KnownPaths()) {
    const std::string known_leaf = known.substr(known.rfind('.') + 1);
    // Compare whole paths and leaves so a key under the wrong section (or with none, a sweep
    // variable) is still found.
    const size_t d = std::min(EditDistance(name, known), EditDistance(leaf, known_leaf) + 1);
    if (d < best_d) best_d = d, best = known;
  }
  const size_t limit = std::max<size_t>(3, leaf.size() / 3);
  return best_d <= limit ? best : "";
}

std::string ClosestName(const std::string& name, const std::vector<std::string>& candidates) {
  std::string best;
  size_t best_d = std::numeric_limits<size_t>::max();
  for (const std::string& c : candidates) {
    const size_t d = EditDistance(name, c);
    if (d < best_d) best_d = d, best = c;
  }
  return best_d <= std::max<size_t>(2, name.size() / 3) ? best : "";
}

int MoeLayers(const ModelConfig& model, const MoEConfig& moe) {
  return moe.enabled() ? std::max(0, model.layers - moe.dense_layers) : 0;
}

int64_t TokensPerStep(const RunConfig& config) {
  return static_cast<int64_t>(config.train.batch_size) * config.model.seq_len;
}

int RunConfig::total_steps() const {
  if (train.tokens > 0) {
    const int64_t per_step = TokensPerStep(*this);
    return static_cast<int>((train.tokens + per_step - 1) / per_step);
  }
  return train.steps;
}

RunConfig ConfigFromJson(const json& j) {
  RunConfig c;
  Walk(j, "", c);
  ValidateConfig(c);
  return c;
}

json ConfigToJson(const RunConfig& config) {
  RunConfig c = config;
  json j = json::object();
  for (const Field& f : Fields()) {
    const size_t dot = f.path.find('.');
    j[f.path.substr(0, dot)][f.path.substr(dot + 1)] = GetField(f, c);
  }
  j["train"]["kernels"] = KernelChoicesToJson(c.train.kernels);  // core/kernel_choices.h
  return j;
}

void ApplyOverride(json& j, const std::string& assignment) {
  const size_t eq = assignment.find('=');
  if (eq == std::string::npos || eq == 0) {
    // Named by the flag: an empty assignment has no path to name (found by fuzzing).
    throw ConfigError(fmt::format("--set '{}'", PrintableText(assignment)),
                      "an override must look like path.to.key=value");
  }
  const std::string path = assignment.substr(0, eq);
  const std::string text = assignment.substr(eq + 1);
  if (!FindField(path) && !IsKernelChoicePath(path)) {
    throw ConfigError(PrintableText(path), "unknown key" + DidYouMean(path));
  }
  json value;
  try {
    value = json::parse(text);
  } catch (const json::out_of_range&) {  // a number like 1e999 (found by fuzzing)
    throw ConfigError(path, fmt::format("the number {} is out of range", PrintableText(text)));
  } catch (const json::parse_error&) {
    value = text;  // bare words are strings: --set optimizer.name=muon
    try {
      value.dump();  // the config's JSON (its hash, the database) needs UTF-8 text
    } catch (const json::type_error&) {
      throw ConfigError(path, "the value is not valid UTF-8 text");
    }
  }
  // A document that is not an object (a file holding `5`) has no key to set; nlohmann would throw
  // its own type_error from operator[] (found by fuzzing).
  if (!j.is_object() && !j.is_null()) {
    throw ConfigError("(root)", fmt::format("expected an object, got {}", JsonTypeName(j)));
  }
  json* node = &j;
  size_t start = 0;
  while (true) {
    const size_t dot = path.find('.', start);
    const std::string key = path.substr(start, dot - start);
    if (dot == std::string::npos) {
      (*node)[key] = value;
      break;
    }
    if (!node->contains(key)) (*node)[key] = json::object();
    node = &(*node)[key];
    if (!node->is_object()) throw ConfigError(path.substr(0, dot), "is not an object");
    start = dot + 1;
  }
}

std::string CanonicalJson(const json& j) {
  std::string out;
  Canonical(j, &out);
  return out;
}

std::string Sha256Hex(const std::string& data) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_Digest(data.data(), data.size(), digest, &len, EVP_sha256(), nullptr);
  std::string hex;
  for (unsigned int i = 0; i < len; ++i) hex += fmt::format("{:02x}", digest[i]);
  return hex;
}

std::string ConfigHash(const RunConfig& c) {
  json j = ConfigToJson(c);
  for (const Field& f : Fields()) {
    if (f.in_hash) continue;
    const size_t dot = f.path.find('.');
    j[f.path.substr(0, dot)].erase(f.path.substr(dot + 1));
  }
  // Fields added later with a neutral default leave the hash of configs that do not use them
  // unchanged (runs recorded before the field existed still dedupe and resume).
  if (c.optimizer.adamw_lr == 0) j["optimizer"].erase("adamw_lr");
  // optimizer.muon_nesterov changed its default (true -> false, K2's Algorithm 1). It does nothing
  // under AdamW, so AdamW configs hash with the old value and keep their hashes; Muon runs with
  // plain momentum are a different experiment and hash differently, as they should.
  if (c.optimizer.name == "adamw") j["optimizer"]["muon_nesterov"] = true;
  // moe.balance changed its default (aux_loss -> aux_free, issue 23). It does nothing in a dense
  // model, so dense configs hash with the old value and keep their hashes; an MoE config that
  // leaves it unset is now a different experiment and hashes differently, as it should.
  if (!c.moe.enabled()) j["moe"]["balance"] = "aux_loss";
  // The dist section holds only unhashed fields: drop it whole so configs written before it
  // existed keep their hash.
  if (j.contains("dist") && j["dist"].empty()) j.erase("dist");
  // Kernel choices compute the same model (docs/cuda.md, Kernel choices): not the experiment.
  j["train"].erase("kernels");
  // bf16 changes the trajectory, fp32 on either device does not (docs/cuda.md).
  j["train"].erase("precision");
  const std::string precision = c.train.effective_precision();
  if (precision != "fp32") j["train"]["precision"] = precision;
  return Sha256Hex(CanonicalJson(j));
}

std::string BranchHash(const RunConfig& c) {
  RunConfig copy = c;
  copy.train.steps = 0;
  copy.train.tokens = 0;
  return ConfigHash(copy);
}

RunConfig LoadConfigFile(const std::string& path, const std::vector<std::string>& overrides) {
  std::ifstream in(path);
  if (!in) throw ConfigError(path, "cannot open the config file");
  json j;
  try {
    j = json::parse(in, nullptr, true, /*ignore_comments=*/true);
  } catch (const json::exception& e) {  // parse_error, and out_of_range for a number like 1e999
    // nlohmann quotes the raw bytes it last read (a DEL, invalid UTF-8: found by fuzzing).
    throw ConfigError(path, fmt::format("not valid JSON: {}", PrintableText(e.what())));
  }
  for (const std::string& o : overrides) ApplyOverride(j, o);
  return ConfigFromJson(j);
}

std::string ConfigDocsMarkdown() {
  RunConfig defaults;
  std::string out =
      "# Run configuration\n\n"
      "One JSON document describes a run. Every field is optional; missing fields take the\n"
      "defaults below. Unknown keys are rejected (with a \"did you mean\" hint, which also\n"
      "knows other trainers' names: `learning_rate` is `optimizer.lr`, `n_layer` is\n"
      "`model.layers`), and every error names the JSON path. Override any field on the command\n"
      "line with `--set path=value`. Integers may be written in exponent form (`3e6`). The\n"
      "config hash (SHA-256 of the canonical, fully defaulted JSON) ignores the fields marked\n"
      "*not hashed*: they do not change the experiment.\n\n"
      "`moelab config check CONFIG.json [--set path=value] [--ranks N]` runs every check\n"
      "`moelab train` runs before training, through the same function (`PreflightRun`,\n"
      "`core/train/preflight.h`): the fields, the layout for N ranks, the data (`data.path`\n"
      "exists, its vocabulary fits `model.vocab_size`), the device and, on CUDA, the memory\n"
      "plan. It exits 2 on exactly the errors `train` exits 2 on, and otherwise prints the\n"
      "fully defaulted config with its hash.\n\n"
      "`train.threads` is not hashed, but it fixes the trajectory (same seed and threads, the\n"
      "same losses bit for bit): `moelab train --resume` refuses another thread count or rank\n"
      "layout than the run last trained with unless `--allow-nondeterministic-resume` is given\n"
      "(docs/database.md, run identity).\n\n"
      "This file is generated by `moelab config docs`; a test checks it matches the code.\n";
  std::string section;
  for (const Field& f : Fields()) {
    const std::string s = f.path.substr(0, f.path.find('.'));
    if (s != section) {
      section = s;
      out += fmt::format("\n## `{}`\n\n| key | default | description |\n|---|---|---|\n", s);
    }
    std::string doc = f.doc;
    if (!f.choices.empty()) doc += fmt::format(" One of: {}.", fmt::join(f.choices, ", "));
    if (!f.in_hash) doc += " *Not hashed.*";
    out += fmt::format("| `{}` | `{}` | {} |\n", f.path, GetField(f, defaults).dump(), doc);
    if (f.path == "train.precision") out += KernelChoicesDocsMarkdown();
  }
  return out;
}

}  // namespace moelab
