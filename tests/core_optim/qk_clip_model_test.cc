// End to end on the real model (double): after QK-Clip, recomputing the forward on the same batch
// gives S_max^h = τ for every clipped head (MHA, GQA and MLA, per-head and global), and unclipped
// heads see bit-identical logits.
//
// Exactness holds per layer given that layer's input: clipping layer l changes the attention
// output and so the input of every later layer, whose recomputed S_max then moves too. The test
// therefore clips one layer at a time (the other layers' S_max fed as 0) and checks that layer
// plus all layers before it; a final case clips every layer at once and checks layer 0.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/model/model.h"
#include "core/optim/qk_clip_plan.h"
#include "tests/common/tiny_configs.h"
#include "tests/core_optim/clip_by_plan.h"

namespace moelab {
namespace {

RunConfig Tiny(int kv_heads, const std::string& mode, bool mla) {
  RunConfig c = test::TinyDenseConfig();
  c.model.layers = 3;
  c.model.kv_heads = kv_heads;
  c.model.init_std = 0.5;  // large logits, spread across heads
  c.optimizer.qk_clip_mode = mode;
  if (mla) test::UseMla(&c.model, {.q_lora = 8, .kv_lora = 8, .nope = 4, .rope = 4, .v = 4});
  c.optimizer.qk_clip_alpha = 0.5;
  return c;
}

std::vector<float> MaxLogits(Model<double>& model, const std::vector<int32_t>& tokens, int batch) {
  StepStats st;
  model.Forward(tokens.data(), batch, &st);
  return st.max_logit;
}

struct Case {
  int kv_heads;
  const char* mode;
  bool mla = false;
};

class QkClipModelTest : public ::testing::TestWithParam<Case> {};

TEST_P(QkClipModelTest, RecomputedMaxLogitEqualsTau) {
  RunConfig c = Tiny(GetParam().kv_heads, GetParam().mode, GetParam().mla);
  const int L = c.model.layers, H = c.model.heads, batch = 3;
  const auto tokens = test::RandomTokens(batch, c.model.seq_len, c.model.vocab_size, 99);
  Model<double> model(c);
  model.Init(5);
  const std::vector<double> init(model.params(), model.params() + model.num_params());
  const std::vector<float> s0 = MaxLogits(model, tokens, batch);

  // τ between the smallest and largest positive S_max so some heads clip and some do not.
  std::vector<float> sorted = s0;
  std::sort(sorted.begin(), sorted.end());
  const double tau = 0.5 * (sorted[sorted.size() / 3] + sorted[2 * sorted.size() / 3]);
  ASSERT_GT(tau, 0);
  c.optimizer.qk_clip_tau = tau;

  int checked = 0;
  for (int target = -1; target < L; ++target) {  // -1: every layer at once
    std::copy(init.begin(), init.end(), model.params());
    std::vector<float> s = s0;
    if (target >= 0) {
      for (int l = 0; l < L; ++l)
        if (l != target) std::fill(s.begin() + l * H, s.begin() + (l + 1) * H, 0.0f);
    }
    const auto events = testing::ClipByPlan<double>(c, model.param_infos(), model.params(), s, 1);
    const std::vector<float> s1 = MaxLogits(model, tokens, batch);
    const int last = target >= 0 ? target : 0;  // layers whose input is unchanged
    for (int l = 0; l <= last; ++l) {
      const float layer_max = *std::max_element(s.begin() + l * H, s.begin() + (l + 1) * H);
      for (int h = 0; h < H; ++h) {
        const size_t i = static_cast<size_t>(l) * H + h;
        if (GetParam().mode == std::string("global")) {
          if (layer_max > tau) {
            // One γ = τ/max for the layer: the max head lands on τ, the others shrink with it.
            const double want = s0[i] * tau / layer_max;
            EXPECT_NEAR(s1[i] / want, 1.0, 1e-5) << "layer " << l << " head " << h;
            ++checked;
          } else {
            EXPECT_EQ(s1[i], s0[i]) << "layer " << l << " head " << h;
          }
        } else if (s[i] > tau) {
          EXPECT_NEAR(s1[i] / tau, 1.0, 1e-5) << "layer " << l << " head " << h;
          ++checked;
        } else {
          EXPECT_EQ(s1[i], s0[i]) << "layer " << l << " head " << h;
        }
      }
    }
    const bool any = std::any_of(s.begin(), s.end(), [&](float v) { return v > tau; });
    EXPECT_EQ(!events.empty(), any);
  }
  EXPECT_GT(checked, 0);
}

INSTANTIATE_TEST_SUITE_P(Attention, QkClipModelTest,
                         ::testing::Values(Case{0, "per_head"}, Case{2, "per_head"},
                                           Case{0, "global"}, Case{2, "global"},
                                           Case{0, "per_head", true}, Case{0, "global", true}),
                         [](const auto& info) {
                           return std::string(info.param.mla             ? "mla_"
                                              : info.param.kv_heads == 0 ? "mha_"
                                                                         : "gqa_") +
                                  info.param.mode;
                         });

}  // namespace
}  // namespace moelab
