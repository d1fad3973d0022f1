// The device QK-Clip applies PlanQkClip's row scalings; on the host the plan must reproduce
// ApplyQkClip bit for bit (same heads, γ and factors) for MHA, GQA, MLA and both modes.
#include "core/optim/qk_clip_plan.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "core/config.h"
#include "core/model/model.h"
#include "core/optim/qk_clip.h"

namespace moelab {
namespace {

RunConfig Tiny(const std::string& attention, int kv_heads, const std::string& mode) {
  RunConfig c;
  c.model.vocab_size = 32;
  c.model.d_model = 32;
  c.model.layers = 2;
  c.model.heads = 4;
  c.model.kv_heads = kv_heads;
  c.model.ffn_hidden = 48;
  c.model.seq_len = 8;
  c.model.attention = attention;
  c.model.kv_lora_rank = 16;
  c.model.qk_nope_head_dim = 8;
  c.model.qk_rope_head_dim = 4;
  c.model.v_head_dim = 8;
  c.optimizer.qk_clip_tau = 10;
  c.optimizer.qk_clip_alpha = 0.5;
  c.optimizer.qk_clip_mode = mode;
  return c;
}

void ExpectPlanMatches(const RunConfig& c) {
  Model<float> model(c);
  model.Init(7);
  const size_t n = model.num_params();
  std::vector<float> a(model.params(), model.params() + n), b = a;
  // Heads above, at and below τ.
  const std::vector<float> s = {12.f, 10.f, 3.f, 40.f, 9.f, 0.5f, 10.5f, 1.f};
  const std::vector<ClipEvent> ref = ApplyQkClip(c, model.param_infos(), a.data(), s, 5);
  const QkClipPlan plan = PlanQkClip(c, model.param_infos(), s, 5);
  ApplyQkClipPlan(plan, b.data());
  ASSERT_EQ(plan.events.size(), ref.size());
  ASSERT_FALSE(ref.empty());
  for (size_t i = 0; i < ref.size(); ++i) {
    EXPECT_EQ(plan.events[i].layer, ref[i].layer);
    EXPECT_EQ(plan.events[i].head, ref[i].head);
    EXPECT_EQ(plan.events[i].gamma, ref[i].gamma);
    EXPECT_EQ(plan.events[i].s_max, ref[i].s_max);
  }
  EXPECT_EQ(std::memcmp(a.data(), b.data(), n * sizeof(float)), 0);
}

TEST(QkClipPlan, MhaPerHead) { ExpectPlanMatches(Tiny("mha", 0, "per_head")); }
TEST(QkClipPlan, GqaPerHead) { ExpectPlanMatches(Tiny("mha", 2, "per_head")); }
TEST(QkClipPlan, MhaGlobal) { ExpectPlanMatches(Tiny("mha", 0, "global")); }
TEST(QkClipPlan, GqaGlobal) { ExpectPlanMatches(Tiny("mha", 2, "global")); }
TEST(QkClipPlan, MlaPerHead) { ExpectPlanMatches(Tiny("mla", 0, "per_head")); }
TEST(QkClipPlan, MlaGlobal) { ExpectPlanMatches(Tiny("mla", 0, "global")); }

TEST(QkClipPlan, OffWhenTauIsZero) {
  RunConfig c = Tiny("mha", 0, "per_head");
  c.optimizer.qk_clip_tau = 0;
  Model<float> model(c);
  const QkClipPlan plan = PlanQkClip(c, model.param_infos(), std::vector<float>(8, 100.f), 1);
  EXPECT_TRUE(plan.scales.empty());
  EXPECT_TRUE(plan.events.empty());
}

}  // namespace
}  // namespace moelab
