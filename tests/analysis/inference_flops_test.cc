// The inference-FLOPs count (analysis/ablation.h) against the K2 report's heads-doubling figure at
// 128k context and against hand counts.
#include <gtest/gtest.h>

#include <cmath>

#include "analysis/ablation.h"
#include "core/flops.h"
#include "tests/common/tiny_configs.h"

namespace moelab::analysis {
namespace {

ModelConfig K2Model(int heads) {
  ModelConfig m{
      .vocab_size = 163840, .d_model = 7168, .layers = 61, .heads = heads, .ffn_hidden = 18432};
  test::UseMla(&m, {.q_lora = 1536, .kv_lora = 512, .nope = 128, .rope = 64, .v = 128});
  return m;
}

MoEConfig K2MoE() {
  MoEConfig e;
  test::UseMoe(&e, {.experts = 384, .top_k = 8, .shared = 1, .hidden = 2048, .dense_layers = 1});
  return e;
}

TEST(InferenceFlops, K2HeadsDoublingAt128kMatchesReport) {
  const int64_t ctx = 131072;
  auto f64 = InferenceFlopsPerToken(K2Model(64), K2MoE(), ctx);
  auto f128 = InferenceFlopsPerToken(K2Model(128), K2MoE(), ctx);
  const double increase = f128.total / f64.total - 1;
  InferenceFlopsOptions prefill;
  prefill.mode = "prefill";
  const double inc_prefill = InferenceFlopsPerToken(K2Model(128), K2MoE(), ctx, prefill).total /
                                 InferenceFlopsPerToken(K2Model(64), K2MoE(), ctx, prefill).total -
                             1;
  std::printf(
      "K2 64->128 heads at 128k: decode %+.1f%%, prefill average %+.1f%% (report +83%%); "
      "64-head decode total %.4g FLOPs/token\n",
      100 * increase, 100 * inc_prefill, f64.total);
  EXPECT_NEAR(increase, 0.83, 0.04);
  // Sanity of the non-attention side: ~32.6B activated params → ~2·(params) FLOPs w/o attention.
  const double non_attention = f64.dense_ffn + f64.routed_experts + f64.shared_experts +
                               f64.router + f64.lm_head + f64.attention_projections;
  EXPECT_NEAR(non_attention / 2 / 32.6e9, 1.0, 0.15);
}

TEST(InferenceFlops, SmallDenseMhaByHand) {
  ModelConfig m;  // d 256, 4 layers, 4 heads, ffn 1024, vocab 512
  MoEConfig dense;
  auto f = InferenceFlopsPerToken(m, dense, 100);
  const double per_layer = 4 * 256.0 * 256 + 2 * 100 * 256 + 3 * 256.0 * 1024;
  EXPECT_DOUBLE_EQ(f.total, 2 * (4 * per_layer + 256.0 * 512));
  // The convention (docs/model.md): decode = one token at position 100 attends to 100 keys;
  // prefill = the average over a causal prefill of 100 tokens, (100+1)/2 keys per token.
  EXPECT_DOUBLE_EQ(f.attention_scores, 2 * 4 * (2 * 100 * 256.0));
  InferenceFlopsOptions prefill;
  prefill.mode = "prefill";
  EXPECT_DOUBLE_EQ(InferenceFlopsPerToken(m, dense, 100, prefill).attention_scores,
                   2 * 4 * (2 * 50.5 * 256.0));
  EXPECT_THROW(InferenceFlopsPerToken(m, dense, 0), AnalysisError);
}

// Inference prefill at context seq_len is the training forward's count (causal half), so the
// two must agree exactly: both count attention through core/flops.
TEST(InferenceFlops, PrefillAtSeqLenEqualsCoreTrainingForward) {
  for (int variant = 0; variant < 5; ++variant) {
    RunConfig c;
    c.model.d_model = 512;
    c.model.layers = 6;
    c.model.heads = 8;
    c.model.seq_len = 256;
    if (variant == 1) c.model.kv_heads = 2;
    if (variant == 2) c.model.attention = "mla";
    if (variant == 3) {
      c.model.attention = "mla";
      c.model.q_lora_rank = 96;
    }
    if (variant == 4) {
      c.moe.experts_total = 16;
      c.moe.shared_experts = 1;
      c.moe.dense_layers = 2;
    }
    InferenceFlopsOptions prefill;
    prefill.mode = "prefill";
    const InferenceFlops f = InferenceFlopsPerToken(c.model, c.moe, c.model.seq_len, prefill);
    const FlopsBreakdown core = ForwardFlopsPerToken(c);
    SCOPED_TRACE(variant);
    EXPECT_EQ(f.attention_projections, core.attn_proj);
    EXPECT_EQ(f.attention_scores, core.attn_scores);
    EXPECT_EQ(f.dense_ffn, core.dense_ffn);
    EXPECT_EQ(f.routed_experts, core.routed_experts);
    EXPECT_EQ(f.shared_experts, core.shared_experts);
    EXPECT_EQ(f.router, core.router);
    EXPECT_EQ(f.lm_head, core.lm_head);
    EXPECT_EQ(f.total, core.forward());
  }
}

// ---- JSON ----------------------------------------------------------------------------------

}  // namespace
}  // namespace moelab::analysis
