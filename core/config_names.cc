#include <map>
#include <string>

#include "core/did_you_mean.h"

namespace moelab {

// Names other trainers (nanoGPT, llm.c, Hugging Face configs) give our fields: too far from
// ours by edit distance to be found as typos.
const std::map<std::string, std::string>& ForeignConfigNames() {
  static const std::map<std::string, std::string> names = {
      {"learning_rate", "optimizer.lr"},
      {"max_lr", "optimizer.lr"},
      {"wd", "optimizer.weight_decay"},
      {"max_grad_norm", "optimizer.grad_clip"},
      {"clip_grad", "optimizer.grad_clip"},
      {"n_head", "model.heads"},
      {"n_heads", "model.heads"},
      {"num_heads", "model.heads"},
      {"num_attention_heads", "model.heads"},
      {"num_key_value_heads", "model.kv_heads"},
      {"n_layer", "model.layers"},
      {"n_layers", "model.layers"},
      {"num_layers", "model.layers"},
      {"num_hidden_layers", "model.layers"},
      {"n_embd", "model.d_model"},
      {"hidden_size", "model.d_model"},
      {"intermediate_size", "model.ffn_hidden"},
      {"block_size", "model.seq_len"},
      {"context_length", "model.seq_len"},
      {"max_seq_len", "model.seq_len"},
      {"num_experts", "moe.experts_total"},
      {"n_experts", "moe.experts_total"},
      {"n_routed_experts", "moe.experts_total"},
      {"top_k", "moe.experts_active"},
      {"num_experts_per_tok", "moe.experts_active"},
      {"n_shared_experts", "moe.shared_experts"},
      {"moe_intermediate_size", "moe.expert_hidden"},
      {"max_steps", "train.steps"},
      {"num_steps", "train.steps"},
      {"warmup", "schedule.warmup_steps"},
      {"warmup_iters", "schedule.warmup_steps"},
  };
  return names;
}

}  // namespace moelab
