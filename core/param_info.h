// What a parameter tensor is (name, kind, shape, offset in the arenas, expert shard): its own
// header so the optimizer traits and the FLOPs/memory counts, which describe tensors without
// needing the model, do not include core/model (no include loop between core/ and core/model/).
#pragma once

#include <cstddef>
#include <string>

namespace moelab {

// What a parameter tensor is; optimizers map kinds to groups (Muon vs AdamW, decay or not).
enum class ParamKind {
  kEmbedding,     // token embedding [vocab, d]
  kLmHead,        // untied output projection [vocab, d]
  kNorm,          // RMSNorm gains [d]
  kAttnQ,         // [heads*head_dim, d]  (rows of head h: h*head_dim .. (h+1)*head_dim)
  kAttnK,         // [kv_heads*head_dim, d]
  kAttnV,         // [kv_heads*head_dim, d]
  kAttnO,         // [d, heads*head_dim]
  kFfn,           // dense SwiGLU matrices: w1,w3 [hidden, d], w2 [d, hidden]
  kExpert,        // routed experts, stacked: batch = experts_total
  kSharedExpert,  // shared experts, stacked: batch = shared_experts
  kRouter,        // router weight [experts_total, d]
  kMla,           // MLA projections (the MuonClip issue)
};
// Names used in the config's optimizer.no_decay list and in recorded parameter groups.
inline const char* ParamKindName(ParamKind k) {
  switch (k) {
    case ParamKind::kEmbedding:
      return "embedding";
    case ParamKind::kLmHead:
      return "lm_head";
    case ParamKind::kNorm:
      return "norm";
    case ParamKind::kAttnQ:
      return "attn_q";
    case ParamKind::kAttnK:
      return "attn_k";
    case ParamKind::kAttnV:
      return "attn_v";
    case ParamKind::kAttnO:
      return "attn_o";
    case ParamKind::kFfn:
      return "ffn";
    case ParamKind::kExpert:
      return "expert";
    case ParamKind::kSharedExpert:
      return "shared_expert";
    case ParamKind::kRouter:
      return "router";
    case ParamKind::kMla:
      return "mla";
  }
  return "unknown";
}

struct ParamInfo {
  std::string name;  // e.g. "layers.1.moe.experts.w1"
  ParamKind kind;
  int layer = -1;     // -1 for embedding, final norm, LM head
  size_t offset = 0;  // into the flat parameter/gradient arenas
  int batch = 1;      // stacked same-shape matrices (experts)
  int rows = 1;       // every matrix is row-major [rows, cols]; a linear layer is y = x·Wᵀ
  int cols = 1;
  // A sharded tensor (routed experts under expert parallelism, ExpertShard) holds matrices
  // batch_first … batch_first + batch − 1 of the model's batch_total; batch_total 0: whole.
  int batch_first = 0;
  int batch_total = 0;
  size_t size() const { return static_cast<size_t>(batch) * rows * cols; }
  bool sharded() const { return batch_total > 0 && batch_total != batch; }
  // A 2-D hidden weight (what Muon updates): not embedding, LM head, norm or router.
  bool is_hidden_matrix() const {
    switch (kind) {
      case ParamKind::kEmbedding:
      case ParamKind::kLmHead:
      case ParamKind::kNorm:
      case ParamKind::kRouter:
        return false;
      default:
        return rows > 1 && cols > 1;
    }
  }
};

// The routed experts a process holds (issue 23, sharded expert parallelism): every MoE layer's
// experts first … first+count−1. Their parameters, gradients (and so optimizer state) are the
// only expert tensors in the arenas; parameter names stay those of the whole model.
struct ExpertShard {
  int first = 0;
  int count = -1;  // -1: every expert
};

}  // namespace moelab
