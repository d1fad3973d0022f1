#include "core/flops.h"

#include <gtest/gtest.h>

namespace moelab {
namespace {

// A hand count for a small MoE config, written out multiply-add by multiply-add.
TEST(Flops, HandCountSmallMoe) {
  RunConfig c;
  c.model.vocab_size = 100;
  c.model.d_model = 8;
  c.model.layers = 2;
  c.model.heads = 2;  // head_dim 4
  c.model.kv_heads = 1;
  c.model.ffn_hidden = 16;
  c.model.seq_len = 5;  // average keys per token (1+2+3+4+5)/5 = 3
  c.moe.experts_total = 4;
  c.moe.experts_active = 2;
  c.moe.shared_experts = 1;
  c.moe.expert_hidden = 6;
  c.moe.dense_layers = 1;
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
  RunConfig c;
  c.model.vocab_size = 100;
  c.model.d_model = 8;
  c.model.layers = 2;
  c.model.heads = 2;
  c.model.kv_heads = 1;
  c.model.ffn_hidden = 16;
  c.moe.experts_total = 4;
  c.moe.experts_active = 2;
  c.moe.shared_experts = 1;
  c.moe.expert_hidden = 6;
  c.moe.dense_layers = 1;
  const ParamCounts p = CountParams(c);
  const int64_t attn = 64 + 32 + 32 + 64, norms = 16, expert = 3 * 8 * 6;
  const int64_t common = 2 * (attn + norms) + 3 * 8 * 16 + 8 + 2 * 800;
  EXPECT_EQ(p.embedding, 1600);
  EXPECT_EQ(p.total, common + 8 * 4 + expert + 4 * expert);
  EXPECT_EQ(p.active, common + 8 * 4 + expert + 2 * expert);
}

}  // namespace
}  // namespace moelab
