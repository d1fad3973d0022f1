#include "core/kernel_choices.h"

#include <fmt/format.h>

#include <algorithm>

#include "core/config.h"
#include "core/did_you_mean.h"

namespace moelab {

using nlohmann::json;

namespace {

constexpr const char* kPrefix = "train.kernels";

const KernelChoiceInfo* FindChoice(const std::string& key) {
  for (const KernelChoiceInfo& c : KernelChoiceTable()) {
    if (c.key == key) return &c;
  }
  return nullptr;
}

std::vector<std::string> Keys() {
  std::vector<std::string> keys;
  for (const KernelChoiceInfo& c : KernelChoiceTable()) keys.push_back(c.key);
  return keys;
}

std::string Hint(const std::string& name, const std::vector<std::string>& candidates) {
  const std::string best = ClosestName(name, candidates);
  return best.empty() ? "" : fmt::format(" (did you mean '{}'?)", best);
}

// The error text for a value outside a key's list (shared by the config and the bench flag).
std::string BadValue(const KernelChoiceInfo& c, const std::string& value) {
  return fmt::format("'{}' is not one of: {}{}", value, fmt::join(c.values, ", "),
                     Hint(value, c.values));
}

}  // namespace

const std::vector<KernelChoiceInfo>& KernelChoiceTable() {
  static const std::vector<KernelChoiceInfo> table = {
      {"attention",
       {"auto", "fused", "reference"},
       "Attention on cuda: auto = the fused kernels (log-sum-exp kept) in bf16 mode where they "
       "cover the shape, else the reference path (probabilities stored); fused forces the fused "
       "kernels (refused where they cannot run the shape); reference forces the reference path.",
       &KernelChoices::attention},
      {"attention_kernel",
       {"wmma", "mma", "mma64"},
       "The fused attention kernels' implementation: wmma fragments, or mma.sync fragments kept "
       "in registers (opt-in: docs/cuda.md); mma64 is the first mma version (64-key tiles, "
       "synchronous backward loads), kept to compare.",
       &KernelChoices::attention_kernel},
      {"rope",
       {"separate", "fused"},
       "Where RoPE runs on cuda: its own kernel, or inside the mma attention kernels' tile loads "
       "(fp32 q/k, MHA/GQA; elsewhere the separate kernel runs).",
       &KernelChoices::rope},
      {"attention_acts",
       {"fp32", "bf16"},
       "bf16 mode's attention activations (q|k|v, the output and its gradient): fp32, or bf16 "
       "where the fused kernels run without QK-norm.",
       &KernelChoices::attention_acts},
      {"ffn",
       {"split", "fused"},
       "bf16 mode's gated FFN (dense layers, shared experts): three GEMMs on fp32 intermediates, "
       "or gate and up as one GEMM with bf16 intermediates.",
       &KernelChoices::ffn},
      {"experts",
       {"grouped", "chunked", "cudnn", "device"},
       "bf16 mode's routed experts without expert parallelism: cuBLAS's grouped GEMMs, batched "
       "GEMMs over the chunked layout, cuDNN's MoE grouped matmul (forward; needs cuDNN 9.18+ "
       "and d_model, moe.expert_hidden multiples of 8), or our grouped GEMM whose shapes are "
       "written on the device (forward and backward, no host sync; bf16 mode only, no expert "
       "parallelism, d_model and moe.expert_hidden multiples of 8; not yet run on a GPU).",
       &KernelChoices::experts},
      {"dispatch",
       {"scan", "sort"},
       "The MoE dispatch plan: one block per expert scanning every assignment, or a chunked "
       "counting sort (at most 12288 experts) with 16-byte row moves.",
       &KernelChoices::dispatch},
  };
  return table;
}

void ParseKernelChoices(const json& j, const std::string& path, KernelChoices* out) {
  if (!j.is_object()) {
    throw ConfigError(path, fmt::format("expected an object, got {}", j.type_name()));
  }
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string at = path + "." + it.key();
    const KernelChoiceInfo* c = FindChoice(it.key());
    if (c == nullptr) throw ConfigError(at, "unknown key" + Hint(it.key(), Keys()));
    if (!it.value().is_string()) {
      throw ConfigError(at, fmt::format("expected a string, got {} {}", it.value().type_name(),
                                        it.value().dump()));
    }
    const std::string value = it.value().get<std::string>();
    if (std::find(c->values.begin(), c->values.end(), value) == c->values.end()) {
      throw ConfigError(at, BadValue(*c, value));
    }
    out->*(c->member) = value;
  }
}

json KernelChoicesToJson(const KernelChoices& k) {
  json j = json::object();
  for (const KernelChoiceInfo& c : KernelChoiceTable()) j[c.key] = k.*(c.member);
  return j;
}

bool IsKernelChoicePath(const std::string& path) {
  const std::string prefix = std::string(kPrefix) + ".";
  return path.rfind(prefix, 0) == 0 && FindChoice(path.substr(prefix.size())) != nullptr;
}

void ValidateKernelChoices(const KernelChoices& k, const std::string& device) {
  if (device == "cuda") return;
  for (const KernelChoiceInfo& c : KernelChoiceTable()) {
    const std::string& value = k.*(c.member);
    if (value == c.values.front()) continue;
    throw ConfigError(fmt::format("{}.{}", kPrefix, c.key),
                      fmt::format("'{}' is a CUDA kernel choice, but train.device is \"{}\" (the "
                                  "CPU backend has one implementation; leave it at '{}')",
                                  value, device, c.values.front()));
  }
}

void RequireKernelChoicesBuildable(const KernelChoices& k, const KernelBuild& build) {
  for (const KernelChoiceInfo& c : KernelChoiceTable()) {
    const std::string& value = k.*(c.member);
    if (value == c.values.front() || build.cuda) continue;
    throw ConfigError(fmt::format("{}.{}", kPrefix, c.key),
                      fmt::format("'{}' needs the CUDA backend, and this moelab was built "
                                  "without CUDA",
                                  value));
  }
  if (k.experts == "cudnn" && !build.cudnn) {
    throw ConfigError(fmt::format("{}.experts", kPrefix),
                      "'cudnn' needs cuDNN's MoE grouped matmul, but " + build.cudnn_why);
  }
}

void RequireDeviceExpertsRunnable(const KernelChoices& k, const std::string& precision,
                                  int experts_total, int expert_parallel, int d_model,
                                  int expert_hidden) {
  if (k.experts != "device" || experts_total <= 0) return;
  const std::string at = fmt::format("{}.experts", kPrefix);
  if (precision != "bf16") {
    throw ConfigError(at, fmt::format("'device' runs the bf16 experts (bf16 operands, fp32 "
                                      "accumulation), but train.precision is \"{}\"",
                                      precision));
  }
  if (expert_parallel > 1) {
    throw ConfigError(at, fmt::format("'device' has no expert parallelism (dist.expert_parallel "
                                      "is {}): its products read every expert's rows locally",
                                      expert_parallel));
  }
  for (auto [path, width] :
       {std::pair{"model.d_model", d_model}, std::pair{"moe.expert_hidden", expert_hidden}}) {
    if (width % 8 != 0) {
      throw ConfigError(path, fmt::format("train.kernels.experts \"device\" needs a multiple of "
                                          "8 (16-byte rows for cp.async), got {}",
                                          width));
    }
  }
}

KernelChoices ParseKernelAssignments(const std::string& assignments, const std::string& flag) {
  KernelChoices k;
  if (assignments.empty()) return k;
  for (size_t at = 0; at <= assignments.size();) {
    const size_t comma = std::min(assignments.find(',', at), assignments.size());
    const std::string item = assignments.substr(at, comma - at);
    at = comma + 1;
    const size_t eq = item.find('=');
    const std::string key = item.substr(0, eq);
    const KernelChoiceInfo* c = FindChoice(key);
    if (eq == std::string::npos || c == nullptr) {
      throw std::invalid_argument(
          fmt::format("{}: \"{}\" is not key=value with a key of train.kernels ({}){}", flag, item,
                      fmt::join(Keys(), ", "), eq == std::string::npos ? "" : Hint(key, Keys())));
    }
    const std::string value = item.substr(eq + 1);
    if (std::find(c->values.begin(), c->values.end(), value) == c->values.end()) {
      throw std::invalid_argument(fmt::format("{}: {}: {}", flag, key, BadValue(*c, value)));
    }
    k.*(c->member) = value;
  }
  return k;
}

std::string DescribeKernelChoices(const KernelChoices& k) {
  std::string out;
  for (const KernelChoiceInfo& c : KernelChoiceTable()) {
    const std::string& value = k.*(c.member);
    if (value == c.values.front()) continue;
    out += fmt::format("{}{}={}", out.empty() ? "" : " ", c.key, value);
  }
  return out.empty() ? "defaults" : out;
}

std::string KernelChoicesDocsMarkdown() {
  std::string out;
  for (const KernelChoiceInfo& c : KernelChoiceTable()) {
    out += fmt::format("| `{}.{}` | `\"{}\"` | {} One of: {}. Not hashed; cuda only. |\n", kPrefix,
                       c.key, c.values.front(), c.doc, fmt::join(c.values, ", "));
  }
  return out;
}

}  // namespace moelab
