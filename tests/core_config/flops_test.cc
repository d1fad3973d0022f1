#include "core/flops.h"

#include <gtest/gtest.h>

#include "tests/common/tiny_configs.h"

namespace moelab {
namespace {

// The small MoE of the hand counts: vocabulary 100, width 8, 2 layers of 2 heads (head_dim 4)
// sharing one KV head, dense hidden 16; layer 1 four experts of hidden 6 (top-2) and one shared.
RunConfig HandCountMoe() {
  RunConfig c;
  c.model = {
      .vocab_size = 100, .d_model = 8, .layers = 2, .heads = 2, .kv_heads = 1, .ffn_hidden = 16};
  test::UseMoe(&c.moe, {.experts = 4, .top_k = 2, .shared = 1, .hidden = 6, .dense_layers = 1});
  return c;
}

// A hand count for a small MoE config, written out multiply-add by multiply-add.
TEST(Flops, HandCountSmallMoe) {
  RunConfig c = HandCountMoe();
  c.model.seq_len = 5;  // average keys per token (1+2+3+4+5)/5 = 3
  const FlopsBreakdown f = ForwardFlopsPerToken(c);
  // q: 8·8, k and v: 8·4 each, o: 8·8 → 192 MACs per layer, 2 layers.
  EXPECT_DOUBLE_EQ(f.attn_proj, 2 * 2 * 192);
  // q·k and P·V: 3 keys × 2 heads × 4 dims each → 48 MACs per layer.
  EXPECT_DOUBLE_EQ(f.attn_scores, 2 * 2 * 48);
  EXPECT_DOUBLE_EQ(f.dense_ffn, 2 * 1 * 3 * 8 * 16);
  EXPECT_DOUBLE_EQ(f.router, 2 * 1 * 8 * 4);
  EXPECT_DOUBLE_EQ(f.routed_experts, 2 * 1 * 2 * 3 * 8 * 6);
  EXPECT_DOUBLE_EQ(f.shared_experts, 2 * 1 * 1 * 3 * 8 * 6);
  EXPECT_DOUBLE_EQ(f.lm_head, 2 * 8 * 100);
  EXPECT_DOUBLE_EQ(f.training(), 3 * (768 + 192 + 768 + 64 + 576 + 288 + 1600));
}

TEST(Flops, ParamCounts) {
  const ParamCounts p = CountParams(HandCountMoe());
  const int64_t attn = 64 + 32 + 32 + 64, norms = 16, expert = 3 * 8 * 6;
  const int64_t common = 2 * (attn + norms) + 3 * 8 * 16 + 8 + 2 * 800;
  EXPECT_EQ(p.embedding, 1600);
  EXPECT_EQ(p.total, common + 8 * 4 + expert + 4 * expert);
  EXPECT_EQ(p.active, common + 8 * 4 + expert + 2 * expert);
}

}  // namespace
}  // namespace moelab

namespace moelab {
namespace {

// MLA, written out multiply-add by multiply-add (training forward, up-projections NOT absorbed:
// scores over the per-head qk = nope + rope dims, values over v_head_dim).
TEST(Flops, HandCountMla) {
  RunConfig c;
  // seq_len 5: 3 keys per token on average.
  c.model = {
      .vocab_size = 100, .d_model = 24, .layers = 2, .heads = 3, .ffn_hidden = 16, .seq_len = 5};
  test::UseMla(&c.model, {.q_lora = 10, .kv_lora = 12, .nope = 6, .rope = 4, .v = 6});
  const FlopsBreakdown f = ForwardFlopsPerToken(c);
  // q: 24→10 (240) then 10→3·(6+4) (300); kv down 24→12+4 (384); kv up 12→3·(6+6) (432);
  // o: 3·6→24 (432). 1788 MACs per layer.
  EXPECT_DOUBLE_EQ(f.attn_proj, 2 * 2 * 1788);
  // q·k over 10 dims and P·V over 6 dims, 3 keys, 3 heads: 144 MACs per layer.
  EXPECT_DOUBLE_EQ(f.attn_scores, 2 * 2 * 144);
  EXPECT_DOUBLE_EQ(f.dense_ffn, 2 * 2 * 3 * 24 * 16);
  c.model.q_lora_rank = 0;  // q straight from d: 24→30
  EXPECT_DOUBLE_EQ(ForwardFlopsPerToken(c).attn_proj, 2 * 2 * (720 + 384 + 432 + 432));
}

// Fixing model.head_dim and doubling heads doubles the attention projections and scores (the
// heads ablation's treatment arm); leaving head_dim = d_model / heads changes nothing.
TEST(Flops, DoublingHeadsAtFixedHeadDimDoublesAttention) {
  RunConfig c;
  c.model.d_model = 32;
  c.model.heads = 2;
  c.model.head_dim = 16;
  const FlopsBreakdown a = ForwardFlopsPerToken(c);
  c.model.heads = 4;
  const FlopsBreakdown b = ForwardFlopsPerToken(c);
  EXPECT_DOUBLE_EQ(b.attn_proj, 2 * a.attn_proj);
  EXPECT_DOUBLE_EQ(b.attn_scores, 2 * a.attn_scores);
  c.model.head_dim = 0;  // 32 / 4 = 8: the arms would be equal
  EXPECT_DOUBLE_EQ(ForwardFlopsPerToken(c).attn_proj, a.attn_proj);
}

}  // namespace
}  // namespace moelab
