// A full Muon step (Muon part + AdamW part) on a tiny hand-built parameter set equals the
// double-precision reference written from the equations.
#include "core/optim/muon.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "tests/common/param_list.h"
#include "tests/core_optim/reference.h"

namespace moelab {
namespace {

// Layout of a 1-layer MoE-ish model with d = 6: two same-shape attention matrices (one bank),
// stacked tall and wide experts (batch 3), a router, norms, embedding and LM head.
std::vector<ParamInfo> TinyParams() {
  test::ParamList ps;
  ps.Add("embedding", ParamKind::kEmbedding, -1, 16, 6);
  ps.Add("layers.0.attn_norm", ParamKind::kNorm, 0, 1, 6);
  ps.Add("layers.0.attn.wq", ParamKind::kAttnQ, 0, 8, 6);
  ps.Add("layers.0.attn.wk", ParamKind::kAttnK, 0, 8, 6);
  ps.Add("layers.0.attn.wo", ParamKind::kAttnO, 0, 6, 8);
  ps.Add("layers.0.ffn_norm", ParamKind::kNorm, 0, 1, 6);
  ps.Add("layers.0.moe.router", ParamKind::kRouter, 0, 3, 6);
  ps.AddStacked("layers.0.moe.experts.w1", ParamKind::kExpert, 0, 3, 10, 6);
  ps.AddStacked("layers.0.moe.experts.w2", ParamKind::kExpert, 0, 3, 6, 10);
  ps.Add("final_norm", ParamKind::kNorm, -1, 1, 6);
  ps.Add("lm_head", ParamKind::kLmHead, -1, 16, 6);
  return ps.infos();
}

size_t Total(const std::vector<ParamInfo>& ps) { return ps.back().offset + ps.back().size(); }

struct MuonCase {
  bool nesterov;
  std::string scale;
};

class MuonStepTest : public ::testing::TestWithParam<MuonCase> {};

TEST_P(MuonStepTest, MatchesReferenceOverSeveralSteps) {
  const auto ps = TinyParams();
  const size_t n = Total(ps);
  OptimizerConfig c;
  c.name = "muon";
  c.lr = 0.02;
  c.weight_decay = 0.1;
  c.muon_nesterov = GetParam().nesterov;
  c.muon_scale = GetParam().scale;

  std::mt19937_64 rng(42);
  std::normal_distribution<double> nd;
  std::vector<double> wd(n);
  for (double& x : wd) x = 0.5 * nd(rng);
  std::vector<float> wf(wd.begin(), wd.end());
  // The reference starts from the float-rounded weights so only the arithmetic differs.
  for (size_t i = 0; i < n; ++i) wd[i] = wf[i];

  Muon muon(c, ps);
  testing::ReferenceMuon ref(c, ps);
  for (int64_t t = 1; t <= 4; ++t) {
    std::vector<float> gf(n);
    for (float& x : gf) x = static_cast<float>(0.1 * nd(rng));
    std::vector<double> gd(gf.begin(), gf.end());
    const double lr = c.lr * (1.0 - 0.1 * t);
    muon.Step(wf.data(), gf.data(), lr, t);
    ref.Step(wd.data(), gd.data(), lr, t);
    for (const ParamInfo& p : ps) {
      double worst = 0;
      for (size_t i = p.offset; i < p.offset + p.size(); ++i)
        worst = std::max(worst, std::abs(double(wf[i]) - wd[i]));
      EXPECT_LT(worst, 1e-5) << p.name << " step " << t;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Variants, MuonStepTest,
                         ::testing::Values(MuonCase{true, "rms_match"},
                                           MuonCase{false, "rms_match"}, MuonCase{true, "shape"}),
                         [](const auto& info) {
                           return std::string(info.param.nesterov ? "nesterov_" : "plain_") +
                                  info.param.scale;
                         });

// The experimental Gram-only NS kernel inside a full Muon step (1:4 matrices, tall and wide):
// same result as the plain reference up to its extra float rounding.
TEST(Muon, GramKernelStepMatchesReference) {
  std::vector<ParamInfo> ps(2);
  ps[0] = {"layers.0.ffn.w1", ParamKind::kFfn, 0, 0, 1, 48, 12};
  ps[1] = {"layers.0.ffn.w2", ParamKind::kFfn, 0, 576, 1, 12, 48};
  OptimizerConfig c;
  Muon muon(c, ps);
  cpu::NewtonSchulzOptions o = muon.ns_options();
  o.kernel = cpu::NsKernel::kGram;
  muon.set_ns_options(o);
  testing::ReferenceMuon ref(c, ps);
  std::mt19937_64 rng(8);
  std::normal_distribution<double> nd;
  std::vector<float> wf(1152);
  for (float& x : wf) x = static_cast<float>(0.1 * nd(rng));
  std::vector<double> wd(wf.begin(), wf.end());
  for (int64_t t = 1; t <= 3; ++t) {
    std::vector<float> gf(wf.size());
    for (float& x : gf) x = static_cast<float>(nd(rng));
    std::vector<double> gd(gf.begin(), gf.end());
    muon.Step(wf.data(), gf.data(), 0.02, t);
    ref.Step(wd.data(), gd.data(), 0.02, t);
  }
  double worst = 0;
  for (size_t i = 0; i < wf.size(); ++i) worst = std::max(worst, std::abs(double(wf[i]) - wd[i]));
  EXPECT_LT(worst, 1e-4);
}

// The Muon update itself (lr·s·O, no decay, no momentum history): RMS ≈ 0.2·lr for rms_match.
TEST(Muon, FirstStepUpdateRmsIsPointTwoLr) {
  ParamInfo p;
  p.name = "layers.0.ffn.w1";
  p.kind = ParamKind::kFfn;
  p.layer = 0;
  p.rows = 256;
  p.cols = 64;
  OptimizerConfig c;
  c.weight_decay = 0;
  Muon muon(c, {p});
  std::mt19937_64 rng(5);
  std::normal_distribution<float> nd;
  std::vector<float> w(p.size(), 0.0f), g(p.size());
  for (float& x : g) x = nd(rng);
  muon.Step(w.data(), g.data(), 1.0, 1);
  double ss = 0;
  for (float x : w) ss += double(x) * x;
  const double rms = std::sqrt(ss / w.size());
  EXPECT_GT(rms, 0.14);
  EXPECT_LT(rms, 0.23);
}

TEST(Muon, GroupsAndState) {
  const auto ps = TinyParams();
  OptimizerConfig c;  // no_decay = norm, bias, embedding
  Muon muon(c, ps);
  const auto groups = muon.groups();
  std::map<std::string, std::string> g(groups.begin(), groups.end());
  ASSERT_EQ(groups.size(), ps.size());
  for (size_t i = 0; i < ps.size(); ++i) EXPECT_EQ(groups[i].first, ps[i].name);
  EXPECT_EQ(g["embedding"], "adamw_no_decay");
  EXPECT_EQ(g["layers.0.attn_norm"], "adamw_no_decay");
  EXPECT_EQ(g["final_norm"], "adamw_no_decay");
  EXPECT_EQ(g["lm_head"], "adamw");
  EXPECT_EQ(g["layers.0.moe.router"], "adamw");
  for (const char* m : {"layers.0.attn.wq", "layers.0.attn.wk", "layers.0.attn.wo",
                        "layers.0.moe.experts.w1", "layers.0.moe.experts.w2"})
    EXPECT_EQ(g[m], "muon") << m;

  auto st = muon.state();
  ASSERT_EQ(st.size(), 3u);
  EXPECT_EQ(st[0].name, "muon.momentum");
  EXPECT_EQ(st[0].data->size(), 48u + 48 + 48 + 180 + 180);
  EXPECT_EQ(st[1].name, "adamw.m");
  EXPECT_EQ(st[1].data->size(), 96u + 6 + 6 + 18 + 6 + 96);
}

TEST(Muon, WorkspaceIsStableAfterFirstStep) {
  const auto ps = TinyParams();
  const size_t n = Total(ps);
  Muon muon(OptimizerConfig{}, ps);
  std::vector<float> w(n, 0.1f), g(n, 0.01f);
  muon.Step(w.data(), g.data(), 1e-3, 1);
  const size_t bytes = muon.workspace_bytes();
  for (int t = 2; t < 5; ++t) muon.Step(w.data(), g.data(), 1e-3, t);
  EXPECT_EQ(muon.workspace_bytes(), bytes);
}

TEST(Muon, RejectsUnknownScale) {
  OptimizerConfig c;
  c.muon_scale = "spectral";
  EXPECT_THROW(Muon(c, TinyParams()), std::invalid_argument);
  EXPECT_DOUBLE_EQ(MuonUpdateScale("rms_match", 384, 1536), 0.2 * std::sqrt(1536.0));
  EXPECT_DOUBLE_EQ(MuonUpdateScale("shape", 1536, 384), 2.0);
  EXPECT_DOUBLE_EQ(MuonUpdateScale("shape", 384, 1536), 1.0);
}

TEST(Muon, MakeMuonReturnsMuon) {
  auto opt = MakeMuon(OptimizerConfig{}, TinyParams());
  EXPECT_NE(dynamic_cast<Muon*>(opt.get()), nullptr);
}

}  // namespace
}  // namespace moelab
