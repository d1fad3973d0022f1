// The small run configs the model, optimizer, training and distributed tests start from, the
// attention and run settings they add, and random token batches for them. A test calls a builder
// and then sets, in its own body, only what it checks, so each test still reads as its config.
// Header-only: the test folders include it without linking anything more.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "core/config.h"

namespace moelab::test {

// A dense model small enough for finite differences in double: 2 layers, vocabulary 32, width
// 16, 4 heads (MHA), SwiGLU hidden 24, sequence 8.
inline RunConfig TinyDenseConfig() {
  RunConfig c;
  c.model = {
      .vocab_size = 32, .d_model = 16, .layers = 2, .heads = 4, .ffn_hidden = 24, .seq_len = 8};
  return c;
}

// The routed and shared experts of an MoE (named short so that a call fits on one line).
struct MoeDims {
  int experts = 0;       // moe.experts_total
  int top_k = 2;         // moe.experts_active
  int shared = 0;        // moe.shared_experts
  int hidden = 0;        // moe.expert_hidden
  int dense_layers = 0;  // moe.dense_layers: the first layers keep the dense FFN
};

// Makes `m` an MoE of these experts (router and balancing stay as they are).
inline void UseMoe(MoEConfig* m, const MoeDims& d) {
  m->experts_total = d.experts;
  m->experts_active = d.top_k;
  m->shared_experts = d.shared;
  m->expert_hidden = d.hidden;
  m->dense_layers = d.dense_layers;
}

// A 2-layer MoE with a training step of a few milliseconds: vocabulary 64, width 32, 4 heads
// (MHA), sequence 16; layer 0 a dense SwiGLU of hidden 64, layer 1 four routed experts of hidden
// 32 (top-2) beside one shared expert.
inline RunConfig SmallMoeConfig() {
  RunConfig c;
  c.model = {
      .vocab_size = 64, .d_model = 32, .layers = 2, .heads = 4, .ffn_hidden = 64, .seq_len = 16};
  UseMoe(&c.moe, {.experts = 4, .top_k = 2, .shared = 1, .hidden = 32, .dense_layers = 1});
  return c;
}

// The dimensions of multi-head latent attention (named short so that a call fits on one line).
struct MlaDims {
  int q_lora = 0;   // model.q_lora_rank; 0: no query compression
  int kv_lora = 0;  // model.kv_lora_rank
  int nope = 0;     // model.qk_nope_head_dim: the per-head query/key part without rotary
  int rope = 0;     // model.qk_rope_head_dim: the rotary part
  int v = 0;        // model.v_head_dim
};

// Switches `m` to MLA with these dimensions (the other fields stay as they are).
inline void UseMla(ModelConfig* m, const MlaDims& d) {
  m->attention = "mla";
  m->q_lora_rank = d.q_lora;
  m->kv_lora_rank = d.kv_lora;
  m->qk_nope_head_dim = d.nope;
  m->qk_rope_head_dim = d.rope;
  m->v_head_dim = d.v;
}

// A short training run on the synthetic Markov source: `steps` steps of `batch_size` rows, with
// evaluation and checkpoints only at the end (a test that checks either sets its own period).
inline void UseShortMarkovRun(RunConfig* c, int batch_size, int steps) {
  c->data.source = "markov";
  c->train.batch_size = batch_size;
  c->train.steps = steps;
  c->eval.every = 0;
  c->checkpoint.every = 0;
}

// `rows` rows of seq + 1 tokens (inputs and the next-token targets), each uniform over
// [0, vocab) as rng() % vocab. The engine is a parameter because tests that drew with
// std::mt19937 keep their exact tokens.
template <typename Engine = std::mt19937_64>
std::vector<int32_t> RandomTokens(int rows, int seq, int vocab, typename Engine::result_type seed) {
  Engine rng(seed);
  std::vector<int32_t> t(static_cast<size_t>(rows) * (seq + 1));
  for (int32_t& x : t) x = static_cast<int32_t>(rng() % vocab);
  return t;
}

}  // namespace moelab::test
