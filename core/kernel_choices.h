// The run's choice of GPU kernel implementations (`train.kernels`, docs/cuda.md "Kernel choices"):
// which attention kernels, where RoPE runs, the attention activations' precision, the FFN, the
// experts and the MoE dispatch plan. They replace the MOELAB_* environment switches of before:
// a choice is configuration, validated by JSON path before a run, stored with the run (the config
// JSON: `db show`, `db export`), and left out of the config hash, since every choice computes the
// same model (up to rounding: docs/cuda.md lists where the bits differ).
//
// Parsing, serialising, checking and documenting live here; core/config.cc only hooks them in.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace moelab {

struct KernelChoices {
  // "auto": the fused attention kernels in bf16 mode wherever they cover the shape, the
  // reference path (probabilities materialised) elsewhere; "fused" forces the fused kernels (fp32
  // mode too; refused where they cannot run the shape); "reference" forces the reference path.
  std::string attention = "auto";
  std::string attention_kernel = "wmma";  // fused kernels: "wmma" | "mma" | "mma64"
  std::string rope = "separate";          // "separate" | "fused" (in the mma kernels' tile loads)
  std::string attention_acts = "fp32";    // q|k|v, att, datt in bf16 mode: "fp32" | "bf16"
  std::string ffn = "split";              // bf16 gated FFN: "split" | "fused" (gate+up one GEMM)
  std::string experts = "grouped";        // routed experts: "grouped"|"chunked"|"cudnn"|"device"
  std::string dispatch = "scan";          // MoE dispatch plan: "scan" | "sort"

  bool operator==(const KernelChoices&) const = default;
};

// One choice of train.kernels: its key (the JSON path is "train.kernels." + key), the values it
// takes (the first is the default), and its doc line.
struct KernelChoiceInfo {
  std::string key;
  std::vector<std::string> values;
  std::string doc;
  std::string KernelChoices::*member;
};
const std::vector<KernelChoiceInfo>& KernelChoiceTable();

// The JSON object at `path` (e.g. "train.kernels") into *out: unknown keys (with a "did you
// mean" hint), non-strings and values outside a key's list throw ConfigError naming the path.
// Missing keys keep their defaults.
void ParseKernelChoices(const nlohmann::json& j, const std::string& path, KernelChoices* out);
// Every key with its value (the stored config carries the whole block).
nlohmann::json KernelChoicesToJson(const KernelChoices& k);
// Whether "train.kernels.<key>" is a path of the block (config overrides: --set).
bool IsKernelChoicePath(const std::string& path);

// Checks what the config alone decides: a choice other than the default on train.device "cpu"
// (the CPU backend has one implementation of each op) throws ConfigError naming
// "train.kernels.<key>".
void ValidateKernelChoices(const KernelChoices& k, const std::string& device);

// What a build can run: CUDA compiled in, and cuDNN's MoE grouped matmul loadable (`cudnn_why`
// says why not). A choice this build cannot run throws ConfigError naming its path; checked
// before a "cuda" run starts (RequireCudaSupports).
struct KernelBuild {
  bool cuda = false;
  bool cudnn = false;
  std::string cudnn_why;
};
void RequireKernelChoicesBuildable(const KernelChoices& k, const KernelBuild& build);

// train.kernels.experts "device" (the device-shaped grouped GEMM) where an MoE run cannot use it:
// fp32 mode or expert parallelism (ConfigError at "train.kernels.experts"), or a width that is not
// a multiple of 8 (its 16-byte rows: at "model.d_model" or "moe.expert_hidden"). A dense model
// (experts_total 0) has nothing to refuse. Checked before a "cuda" run starts
// (RequireCudaSupports).
void RequireDeviceExpertsRunnable(const KernelChoices& k, const std::string& precision,
                                  int experts_total, int expert_parallel, int d_model,
                                  int expert_hidden);

// `moelab bench --kernels key=value[,key=value...]`: the assignments over the defaults; a bad key
// or value throws std::invalid_argument naming `flag` and the valid keys or values.
KernelChoices ParseKernelAssignments(const std::string& assignments, const std::string& flag);

// "attention_kernel=mma ffn=fused" (the choices that differ from the defaults), or "defaults".
std::string DescribeKernelChoices(const KernelChoices& k);

// The train.kernels rows of docs/config.md's table.
std::string KernelChoicesDocsMarkdown();

}  // namespace moelab
