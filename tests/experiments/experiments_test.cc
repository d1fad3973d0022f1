// Protocol checks on the committed experiment specs: each is expanded exactly as `moelab sweep
// run` would, and the property its README relies on is asserted. These would have caught the
// sparsity sweep that gave sparser runs more tokens and a router worth 16–25 % of the active
// FLOPs, and the heads ablation whose arms had identical attention.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <set>
#include <string>
#include <tuple>

#include "core/flops.h"
#include "sweeps/plan.h"
#include "sweeps/spec.h"
#include "tests/sweeps/plan_fixture.h"

namespace moelab::sweeps {
namespace {

std::string Src(const std::string& rel) {
  const char* src = std::getenv("MOELAB_SOURCE_DIR");
  return std::string(src ? src : MOELAB_SOURCE_DIR_DEFAULT) + "/" + rel;
}

int64_t Tokens(const RunConfig& c) {
  return c.total_steps() * static_cast<int64_t>(c.train.batch_size) * c.model.seq_len;
}

double RouterShare(const RunConfig& c) {
  const FlopsBreakdown f = ForwardFlopsPerToken(c);
  return f.router / f.forward();
}

// The run's variables except the ones named: the key of its comparison group.
std::string GroupKey(const SweepRun& r, std::initializer_list<const char*> except) {
  ojson v = r.vars;
  for (const char* k : except) v.erase(k);
  v.erase("moe.experts_total");
  v.erase("model.heads");
  return v.dump();
}

// Every budget (model size × steps × seed) trains all sparsities on the same token count, with
// the router under 5 % of the active forward FLOPs (so "active compute" is the same up to 5 %).
void CheckSparsitySpec(const std::string& rel, std::map<std::string, int>* sparsities_seen) {
  SCOPED_TRACE(rel);
  const Sweep s = LoadSweep(Src(rel));
  std::map<std::string, std::vector<const SweepRun*>> groups;
  for (const SweepRun& r : s.runs) groups[GroupKey(r, {"sparsity"})].push_back(&r);
  ASSERT_GE(groups.size(), 3u) << "at least 3 budgets";
  for (const auto& [key, runs] : groups) {
    ASSERT_GE(runs.size(), 3u) << key;
    const int64_t tokens = Tokens(runs.front()->config);
    double min_fwd = 1e300, max_fwd = 0;
    for (const SweepRun* r : runs) {
      EXPECT_EQ(Tokens(r->config), tokens) << r->name << ": not iso-token with its budget";
      EXPECT_LT(RouterShare(r->config), 0.05) << r->name;
      const double fwd = ForwardFlopsPerToken(r->config).forward();
      min_fwd = std::min(min_fwd, fwd);
      max_fwd = std::max(max_fwd, fwd);
      (*sparsities_seen)[r->vars.value("sparsity", ojson(0)).dump()]++;
    }
    EXPECT_LT(max_fwd / min_fwd, 1.05) << key << ": active FLOPs per token differ by > 5 %";
  }
}

TEST(Experiments, SparsityLawHoldsActiveComputeFixed) {
  std::map<std::string, int> seen;
  CheckSparsitySpec("experiments/sparsity-law/sweep.json", &seen);
  EXPECT_GE(seen.size(), 4u);  // sparsity 8/16/32/48
}

// The extra seeds and the long trunk of issue 21 keep the protocol of the main sweep.
TEST(Experiments, SparsityLawSeedsAndLongTrunkHoldActiveComputeFixed) {
  for (const char* spec :
       {"experiments/sparsity-law/seed3.json", "experiments/sparsity-law/seed4.json"}) {
    std::map<std::string, int> seen;
    CheckSparsitySpec(spec, &seen);
    EXPECT_EQ(seen.size(), 4u);
  }
  const Sweep long_trunk = LoadSweep(Src("experiments/sparsity-law/long.json"));
  int64_t most = 0;
  for (const SweepRun& r : long_trunk.runs) most = std::max(most, Tokens(r.config));
  EXPECT_EQ(most, 12800 * 8 * 128);  // inside the default corpus's 23.2 M training tokens
}

// The GPU design (issue 21): d 256, 8 layers, 8 + 1 shared experts of hidden d, router <= 5.6 %
// of the active FLOPs (CheckSparsitySpec: < 5 %), iso-token budgets, >= 2 B tokens, 3 seeds.
TEST(Experiments, SparsityLawGpuDesign) {
  std::map<std::string, int> seen;
  CheckSparsitySpec("experiments/sparsity-law-gpu/sweep.json", &seen);
  EXPECT_EQ(seen.size(), 4u);
  const Sweep s = LoadSweep(Src("experiments/sparsity-law-gpu/sweep.json"));
  int64_t most = 0;
  std::set<uint64_t> seeds;
  double router = 0;
  for (const SweepRun& r : s.runs) {
    router = std::max(router, RouterShare(r.config));
    EXPECT_EQ(r.config.model.d_model, 256);
    EXPECT_EQ(r.config.model.layers, 8);
    EXPECT_EQ(r.config.model.vocab_size, 32768);
    EXPECT_EQ(r.config.moe.experts_active, 8);
    EXPECT_EQ(r.config.moe.shared_experts, 1);
    EXPECT_EQ(r.config.moe.expert_hidden, r.config.model.d_model);
    most = std::max(most, Tokens(r.config));
    seeds.insert(r.config.train.seed);
  }
  EXPECT_GE(most, 2000000000);
  EXPECT_EQ(seeds.size(), 3u);
  std::printf("GPU design: router at most %.2f %% of the active forward FLOPs\n", 100 * router);
  EXPECT_LE(router, 0.056);

  // `sweep plan --gpu-peak-tflops 790 --gpu-mfu 0.05` prints the GPU-hours of the design.
  PlanOptions po;
  po.calibrate = false;
  po.gpu_peak_tflops = 790;
  po.gpu_mfu = 0.05;
  po.gpu_name = "H100";
  const std::string text = test_plans::PlanText(s, po);
  const size_t at = text.find("GPU time: ");
  ASSERT_NE(at, std::string::npos) << text;
  EXPECT_NE(text.find("at 5 % of H100's 790 TFLOP/s peak", at), std::string::npos) << text;
  EXPECT_NE(text.find("stated utilisation, not measured", at), std::string::npos) << text;
}

// The pre-registered frontier design (issue 35; experiments/sparsity-law-frontier/README.md):
// Muon, 8 routed + 1 shared expert active, S = 8/16/32/48, 3 model sizes per S whose non-router
// active parameters are equal across S, every (size, budget, seed) iso-token across S, 8 seeds,
// 6,400-step trunks (inside the default corpus's 23.2 M training tokens).
TEST(Experiments, SparsityLawFrontierPreRegistration) {
  const Sweep s = LoadSweep(Src("experiments/sparsity-law-frontier/sweep.json"));
  std::map<int, std::set<int>> sizes_of;               // sparsity -> d_model
  std::map<std::string, std::set<int64_t>> tokens_of;  // (size, steps, seed) -> tokens
  std::map<int, std::set<double>> non_router_of;       // d_model -> active non-router FLOPs
  std::set<uint64_t> seeds;
  int64_t most = 0;
  double router = 0;
  for (const SweepRun& r : s.runs) {
    const RunConfig& c = r.config;
    EXPECT_EQ(c.optimizer.name, "muon") << r.name;
    EXPECT_EQ(c.moe.experts_active, 8) << r.name;
    EXPECT_EQ(c.moe.shared_experts, 1) << r.name;
    const int sparsity = r.vars.at("sparsity").get<int>();
    EXPECT_EQ(c.moe.experts_total, 8 * sparsity) << r.name;
    sizes_of[sparsity].insert(c.model.d_model);
    tokens_of[std::to_string(c.model.d_model) + "/" + std::to_string(c.train.steps) + "/" +
              std::to_string(c.train.seed)]
        .insert(Tokens(c));
    const FlopsBreakdown f = ForwardFlopsPerToken(c);
    non_router_of[c.model.d_model].insert(f.forward() - f.router);
    router = std::max(router, RouterShare(c));
    seeds.insert(c.train.seed);
    most = std::max(most, Tokens(c));
  }
  EXPECT_EQ(sizes_of.size(), 4u);
  for (const auto& [sparsity, sizes] : sizes_of) EXPECT_GE(sizes.size(), 3u) << sparsity;
  for (const auto& [key, tokens] : tokens_of) EXPECT_EQ(tokens.size(), 1u) << key;
  for (const auto& [d, f] : non_router_of) EXPECT_EQ(f.size(), 1u) << "d_model " << d;
  EXPECT_GE(seeds.size(), 8u);
  EXPECT_EQ(most, 4000 * 8 * 64);  // the 2026-12-05 redesign: 4,000-step trunks at seq 64
  std::printf("frontier design: router at most %.1f %% of the active forward FLOPs\n",
              100 * router);
}

// The order the frontier design runs in (README, "Run and resume"): by-seed.json is sweep.json's
// 288 configs, seed by seed (every run of seed 1 first), so sweep.json reuses each of its runs.
TEST(Experiments, SparsityLawFrontierBySeedIsTheDesignInSeedOrder) {
  const Sweep design = LoadSweep(Src("experiments/sparsity-law-frontier/sweep.json"));
  const Sweep by_seed = LoadSweep(Src("experiments/sparsity-law-frontier/by-seed.json"));
  std::multiset<std::string> want, got;
  for (const SweepRun& r : design.runs) want.insert(r.hash);
  for (const SweepRun& r : by_seed.runs) got.insert(r.hash);
  EXPECT_EQ(got, want);
  ASSERT_EQ(by_seed.runs.size(), 288u);
  for (size_t i = 1; i < by_seed.runs.size(); ++i) {
    EXPECT_LE(by_seed.runs[i - 1].config.train.seed, by_seed.runs[i].config.train.seed)
        << "run " << i << " comes before a run of a lower seed";
  }
}

// The adaptive experiment (issue 38) is replayed on the frontier design's runs: every run of its
// space is one of sparsity-law-frontier/sweep.json's configs (the same hash), S = 32 vs 48 at
// d_model 32, seeds 1-8, and its target is the frontier's middle pre-registered target.
TEST(Experiments, AdaptiveSparsityDrawsFromTheFrontierDesign) {
  const Sweep design = LoadSweep(Src("experiments/sparsity-law-frontier/sweep.json"));
  const Sweep adaptive = LoadSweep(Src("experiments/adaptive-sparsity/sweep.json"));
  std::set<std::string> hashes;
  for (const SweepRun& r : design.runs) hashes.insert(r.hash);
  ASSERT_EQ(adaptive.runs.size(), 48u);
  for (const SweepRun& r : adaptive.runs) {
    EXPECT_TRUE(hashes.count(r.hash)) << r.name << " is not a run of the frontier design";
    EXPECT_EQ(r.config.model.d_model, 32) << r.name;
  }
  ASSERT_TRUE(adaptive.adaptive.has_value());
  EXPECT_EQ(adaptive.adaptive->target_loss, 3.05);
}

TEST(Experiments, DemoHoldsActiveComputeFixed) {
  std::map<std::string, int> seen;
  CheckSparsitySpec("experiments/demo/sweep.json", &seen);
  EXPECT_EQ(seen.size(), 3u);
  // Issue 35: the main job's fit and the GUI show intervals, so the demo runs >= 3 seeds (the
  // fewest `moelab fit` gives an interval for); with one it printed "(no interval)".
  std::set<uint64_t> seeds;
  for (const SweepRun& r : LoadSweep(Src("experiments/demo/sweep.json")).runs)
    seeds.insert(r.config.train.seed);
  EXPECT_GE(seeds.size(), 3u);
}

// Heads ablation: arms paired by (budget, seed) see the same tokens; the treatment has twice the
// heads at the same head_dim, so attention projections and scores (parameters and FLOPs) double.
TEST(Experiments, HeadsAblationDoublesAttentionIsoToken) {
  const Sweep s = LoadSweep(Src("experiments/heads-ablation/sweep.json"));
  std::map<std::string, std::map<int, const SweepRun*>> pairs;
  for (const SweepRun& r : s.runs)
    pairs[GroupKey(r, {"head_ratio"})][r.vars.at("head_ratio").get<int>()] = &r;
  ASSERT_GE(pairs.size(), 6u) << "3 budgets x 2 seeds";
  std::map<int64_t, int> budgets;
  for (const auto& [key, arms] : pairs) {
    ASSERT_EQ(arms.size(), 2u) << key;
    const RunConfig& b = arms.at(1)->config;
    const RunConfig& t = arms.at(2)->config;
    EXPECT_EQ(b.model.heads, b.model.layers);
    EXPECT_EQ(t.model.heads, 2 * t.model.layers);
    EXPECT_EQ(Tokens(b), Tokens(t)) << key;
    EXPECT_EQ(b.model.head_dim_effective(), t.model.head_dim_effective()) << key;
    const FlopsBreakdown fb = ForwardFlopsPerToken(b), ft = ForwardFlopsPerToken(t);
    EXPECT_DOUBLE_EQ(ft.attn_proj, 2 * fb.attn_proj) << key;
    EXPECT_DOUBLE_EQ(ft.attn_scores, 2 * fb.attn_scores) << key;
    budgets[Tokens(b)]++;
  }
  EXPECT_GE(budgets.size(), 3u);
  for (const auto& [tokens, n] : budgets) EXPECT_GE(n, 2) << tokens << " tokens: 2 seeds";
}

}  // namespace
}  // namespace moelab::sweeps
