// QK-Clip's plan applied to a parameter arena: clipped heads' rows scaled by exactly γ^α / γ^(1−α)
// (MHA) or γ (GQA, shared keys untouched), everything else bit-identical, one event per clipped
// head.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "core/optim/qk_clip_plan.h"
#include "tests/common/param_list.h"
#include "tests/core_optim/clip_by_plan.h"

namespace moelab {
namespace {

constexpr int kLayers = 2, kHeads = 4, kHd = 3, kD = 12;

RunConfig Config(int kv_heads, double tau, const std::string& mode = "per_head") {
  RunConfig c;
  c.model.layers = kLayers;
  c.model.heads = kHeads;
  c.model.kv_heads = kv_heads;
  c.model.head_dim = kHd;
  c.model.d_model = kD;
  c.optimizer.qk_clip_tau = tau;
  c.optimizer.qk_clip_mode = mode;
  c.optimizer.qk_clip_alpha = 0.5;
  return c;
}

std::vector<ParamInfo> Params(const RunConfig& c) {
  test::ParamList ps;
  const int kv = c.model.kv_heads_effective();
  ps.Add("embedding", ParamKind::kEmbedding, -1, 10, kD);
  for (int l = 0; l < kLayers; ++l) {
    const std::string pre = "layers." + std::to_string(l) + ".attn.";
    ps.Add(pre + "wq", ParamKind::kAttnQ, l, kHeads * kHd, kD);
    ps.Add(pre + "wk", ParamKind::kAttnK, l, kv * kHd, kD);
    ps.Add(pre + "wv", ParamKind::kAttnV, l, kv * kHd, kD);
    ps.Add(pre + "wo", ParamKind::kAttnO, l, kD, kHeads * kHd);
  }
  return ps.infos();
}

template <typename T>
std::vector<T> RandomArena(const std::vector<ParamInfo>& ps) {
  std::mt19937_64 rng(17);
  std::normal_distribution<double> nd;
  std::vector<T> a(ps.back().offset + ps.back().size());
  for (T& x : a) x = static_cast<T>(nd(rng));
  return a;
}

// Params(c), a random arena over them, and a copy of it that the test scales into what it
// expects the clip to leave.
template <typename T>
struct Arenas {
  std::vector<ParamInfo> ps;
  std::vector<T> arena, expected;
};

template <typename T>
Arenas<T> RandomArenas(const RunConfig& c) {
  std::vector<ParamInfo> ps = Params(c);
  std::vector<T> arena = RandomArena<T>(ps);
  return {ps, arena, arena};
}

const ParamInfo& Find(const std::vector<ParamInfo>& ps, const std::string& name) {
  for (const ParamInfo& p : ps)
    if (p.name == name) return p;
  throw std::runtime_error(name);
}

// Expected arena after scaling rows [h·hd, (h+1)·hd) of the named tensor by factor.
template <typename T>
void ScaleHead(std::vector<T>& a, const ParamInfo& p, int h, double factor) {
  const T f = static_cast<T>(factor);
  for (size_t i = 0; i < static_cast<size_t>(kHd) * p.cols; ++i)
    a[p.offset + static_cast<size_t>(h) * kHd * p.cols + i] *= f;
}

template <typename T>
class QkClipTest : public ::testing::Test {};
using Types = ::testing::Types<float, double>;
TYPED_TEST_SUITE(QkClipTest, Types);

TYPED_TEST(QkClipTest, MhaPerHeadScalesClippedHeadsOnly) {
  using T = TypeParam;
  RunConfig c = Config(0, 10.0);
  c.optimizer.qk_clip_alpha = 0.3;  // unequal split shows which side gets which exponent
  auto [ps, arena, expected] = RandomArenas<T>(c);
  // Layer 0: head 1 over τ; head 2 exactly at τ (not clipped). Layer 1: heads 0 and 3.
  const std::vector<float> s = {5, 40, 10, 9.99f, 12.5f, 1, 2, 1000};
  const auto events = testing::ClipByPlan<T>(c, ps, arena.data(), s, 7);
  ASSERT_EQ(events.size(), 3u);
  const int clipped[3][2] = {{0, 1}, {1, 0}, {1, 3}};
  for (int e = 0; e < 3; ++e) {
    const int l = clipped[e][0], h = clipped[e][1];
    const double gamma = 10.0 / s[l * kHeads + h];
    EXPECT_EQ(events[e].step, 7);
    EXPECT_EQ(events[e].layer, l);
    EXPECT_EQ(events[e].head, h);
    EXPECT_DOUBLE_EQ(events[e].s_max, s[l * kHeads + h]);
    EXPECT_DOUBLE_EQ(events[e].gamma, gamma);
    const std::string pre = "layers." + std::to_string(l) + ".attn.";
    ScaleHead(expected, Find(ps, pre + "wq"), h, std::pow(gamma, 0.3));
    ScaleHead(expected, Find(ps, pre + "wk"), h, std::pow(gamma, 0.7));
  }
  // Bit-identical everywhere else, and exactly the scaled values on clipped rows.
  EXPECT_EQ(std::memcmp(arena.data(), expected.data(), arena.size() * sizeof(T)), 0);
}

TYPED_TEST(QkClipTest, GqaScalesQueryHeadByGammaAndLeavesKeysAlone) {
  using T = TypeParam;
  const RunConfig c = Config(2, 10.0);
  auto [ps, arena, expected] = RandomArenas<T>(c);
  const std::vector<float> s = {20, 1, 1, 1, 1, 1, 11, 30};
  const auto events = testing::ClipByPlan<T>(c, ps, arena.data(), s, 3);
  ASSERT_EQ(events.size(), 3u);
  ScaleHead(expected, Find(ps, "layers.0.attn.wq"), 0, 10.0 / 20.0);
  ScaleHead(expected, Find(ps, "layers.1.attn.wq"), 2, 10.0 / 11.0);
  ScaleHead(expected, Find(ps, "layers.1.attn.wq"), 3, 10.0 / 30.0);
  EXPECT_EQ(std::memcmp(arena.data(), expected.data(), arena.size() * sizeof(T)), 0);
}

TYPED_TEST(QkClipTest, GlobalModeUsesOneGammaPerLayer) {
  using T = TypeParam;
  for (int kv : {0, 2}) {
    const RunConfig c = Config(kv, 10.0, "global");
    auto [ps, arena, expected] = RandomArenas<T>(c);
    // Layer 0 max 25 > τ: every head gets γ = 0.4. Layer 1 max 9 ≤ τ: untouched.
    const std::vector<float> s = {5, 25, 10, 1, 9, 1, 2, 3};
    const auto events = testing::ClipByPlan<T>(c, ps, arena.data(), s, 1);
    ASSERT_EQ(events.size(), static_cast<size_t>(kHeads));
    for (int h = 0; h < kHeads; ++h) {
      EXPECT_EQ(events[h].layer, 0);
      EXPECT_EQ(events[h].head, h);
      EXPECT_DOUBLE_EQ(events[h].gamma, 0.4);
      EXPECT_DOUBLE_EQ(events[h].s_max, s[h]);
      ScaleHead(expected, Find(ps, "layers.0.attn.wq"), h, std::sqrt(0.4));
    }
    for (int h = 0; h < c.model.kv_heads_effective(); ++h)
      ScaleHead(expected, Find(ps, "layers.0.attn.wk"), h, std::pow(0.4, 0.5));
    EXPECT_EQ(std::memcmp(arena.data(), expected.data(), arena.size() * sizeof(T)), 0) << kv;
  }
}

TYPED_TEST(QkClipTest, OffWhenTauIsZeroAndNothingOverTau) {
  using T = TypeParam;
  const std::vector<float> s(kLayers * kHeads, 50.0f);
  for (double tau : {0.0, 100.0}) {
    const RunConfig c = Config(0, tau);
    const auto ps = Params(c);
    std::vector<T> arena = RandomArena<T>(ps);
    const std::vector<T> before = arena;
    EXPECT_TRUE(testing::ClipByPlan<T>(c, ps, arena.data(), s, 1).empty());
    EXPECT_EQ(std::memcmp(arena.data(), before.data(), arena.size() * sizeof(T)), 0);
  }
}

TEST(QkClip, RejectsBadInputs) {
  RunConfig c = Config(0, 10.0);
  const auto ps = Params(c);
  std::vector<float> arena = RandomArena<float>(ps);
  const std::vector<float> s(kLayers * kHeads, 50.0f);
  EXPECT_THROW(testing::ClipByPlan<float>(c, ps, arena.data(), {1.0f}, 1), std::invalid_argument);
  c.optimizer.qk_clip_mode = "per_layer";
  EXPECT_THROW(testing::ClipByPlan<float>(c, ps, arena.data(), s, 1), std::invalid_argument);
  c.optimizer.qk_clip_mode = "per_head";
  // An MLA config over parameters without the MLA projections names what is missing.
  c.model.attention = "mla";
  try {
    testing::ClipByPlan<float>(c, ps, arena.data(), s, 1);
    FAIL() << "no error for MLA without MLA parameters";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("attn.q_b_nope"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace moelab
