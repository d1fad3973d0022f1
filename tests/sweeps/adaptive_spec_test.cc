// Adaptive sweeps in-process: the "adaptive" block's validation by JSON path, the space it
// draws from, the estimand read from known results, and the chooser's batches (explore one seed
// on the whole ladder, then seeds on the rungs where the target was crossed, extensions before
// new seeds when cheaper, the budget respected, the same choice from the same results).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>

#include "sweeps/adaptive_chooser.h"
#include "sweeps/adaptive_estimand.h"
#include "sweeps/spec.h"
#include "tests/common/test_util.h"

namespace moelab::sweeps {
namespace {

using ::testing::HasSubstr;
using json = nlohmann::json;

ojson Spec(double budget = 1e15) {
  json base = test::TinyRunConfig("/tmp/unused-ckpt", 20, 0, false);
  base["schedule"] = {{"type", "wsd"}, {"warmup_steps", 2}, {"decay_fraction", 0.25}};
  return ojson::parse(json{
      {"name", "adaptive"},
      {"base", base},
      {"grid", {{"moe.experts_total", {4, 8}}, {"train.steps", {8, 16, 24, 32}}}},
      {"seeds", {1, 2, 3, 4, 5, 6}},
      {"adaptive",
       {{"estimand",
         {{"kind", "flops_ratio"},
          {"key", "moe.experts_total"},
          {"arm", 8},
          {"reference", 4},
          {"target_loss", 3.0}}},
        {"budget", {{"flops", budget}}},
        {"stop", {{"excludes", 1.0}}},
        {"min_seeds",
         3}}}}.dump());
}

std::string ErrorOf(const ojson& spec) {
  try {
    ExpandSpec(spec);
  } catch (const SpecError& e) {
    return e.what();
  }
  return "";
}

TEST(AdaptiveSpec, ParsesTheBlock) {
  const Sweep s = ExpandSpec(Spec());
  ASSERT_TRUE(s.adaptive.has_value());
  EXPECT_EQ(s.adaptive->key, "moe.experts_total");
  EXPECT_EQ(s.adaptive->max_seeds, 6);
  EXPECT_DOUBLE_EQ(*s.adaptive->excludes, 1.0);
  EXPECT_FALSE(s.adaptive->width.has_value());
  EXPECT_THAT(DescribeQuestion(*s.adaptive),
              HasSubstr("moe.experts_total=8 / moe.experts_total=4"));
}

TEST(AdaptiveSpec, ErrorsNameTheJsonPath) {
  auto with = [](const std::function<void(ojson&)>& edit) {
    ojson s = Spec();
    edit(s["adaptive"]);
    return ErrorOf(s);
  };
  EXPECT_THAT(with([](ojson& a) { a["stop"]["width"] = -0.1; }), HasSubstr("adaptive.stop.width:"));
  EXPECT_THAT(with([](ojson& a) { a["stop"] = ojson::object(); }), HasSubstr("adaptive.stop:"));
  EXPECT_THAT(with([](ojson& a) { a["estimand"]["arm"] = 16; }),
              HasSubstr("adaptive.estimand.arm:"));
  EXPECT_THAT(with([](ojson& a) { a["estimand"]["key"] = "sparsity"; }),
              HasSubstr("adaptive.estimand.key:"));
  EXPECT_THAT(with([](ojson& a) { a["estimand"]["kind"] = "loss"; }),
              HasSubstr("adaptive.estimand.kind:"));
  EXPECT_THAT(with([](ojson& a) { a["estimand"].erase("target_loss"); }),
              HasSubstr("adaptive.estimand.target_loss: missing"));
  EXPECT_THAT(with([](ojson& a) {
                a["budget"] = {{"cpu_hours", 2}};
              }),
              HasSubstr("adaptive.budget.cpu_hours:"));
  EXPECT_THAT(with([](ojson& a) { a["alpha"] = 0.7; }), HasSubstr("adaptive.alpha:"));
  EXPECT_THAT(with([](ojson& a) { a["min_seeds"] = 7; }), HasSubstr("adaptive.min_seeds:"));
  EXPECT_THAT(with([](ojson& a) { a["stopp"] = 1; }), HasSubstr("adaptive.stopp: unknown key"));
  EXPECT_THAT(with([](ojson& a) { a["budget_key"] = "model.d_model"; }),
              HasSubstr("adaptive.budget_key:"));
  ojson two_keys = Spec();
  two_keys["grid"]["optimizer.lr"] = {1e-3, 2e-3};
  EXPECT_THAT(ErrorOf(two_keys), HasSubstr("another swept key varies"));
}

// Results of a world where the arm needs 10 % more FLOPs than the reference at every loss:
// loss(C) = 2 + 4·(C/C0)^(−0.5), the arm's C scaled by 1.1.
Results World(const Sweep& sweep, const AdaptiveSpace& space, const std::set<int>& runs) {
  Results out;
  for (const SpaceRun& r : space.runs) {
    if (!runs.count(r.index)) continue;
    const double c = r.flops / (r.side == 1 ? 1.1 : 1.0);
    const double c0 = space.runs.front().flops;
    out[r.index] = {2.0 + 4.0 * std::pow(c / c0 * 4, -0.5), r.flops,
                    double(sweep.runs[r.index].config.total_steps())};
  }
  return out;
}

TEST(AdaptiveChooser, ExploresOneSeedThenFollowsTheCrossing) {
  ojson spec = Spec();
  const Sweep s = ExpandSpec(spec);
  AdaptiveSpec a = *s.adaptive;
  const AdaptiveSpace space = BuildSpace(s, a);
  ASSERT_EQ(space.ladder, (std::vector<std::string>{"8", "16", "24", "32"}));
  ASSERT_EQ(space.runs.size(), 48u);
  // Target: the reference's loss halfway between rungs 1 and 2.
  Results all;
  {
    std::set<int> every;
    for (const SpaceRun& r : space.runs) every.insert(r.index);
    all = World(s, space, every);
  }
  const SpaceRun* r1 = space.At(0, 1, 1);
  const SpaceRun* r2 = space.At(0, 1, 2);
  a.target_loss = 0.5 * (all[r1->index].loss + all[r2->index].loss);

  const AdaptiveBatch first = ChooseBatch(space, a, EstimandReading{}, {}, 0);
  EXPECT_EQ(first.runs.size(), 8u);  // seed 1, both arms, the whole ladder
  ASSERT_FALSE(first.why.empty());
  EXPECT_THAT(first.why[0], HasSubstr("no seed has shown where the target lies"));
  // Price: per arm the 32-step trunk in full and the 3 shorter rungs as branches.
  double expected = 0;
  for (int side : {0, 1}) {
    expected += space.At(side, 1, 3)->flops;
    for (int rung : {0, 1, 2}) expected += space.At(side, 1, rung)->decay_flops;
  }
  EXPECT_DOUBLE_EQ(first.cost_flops, expected);

  std::set<int> chosen(first.runs.begin(), first.runs.end());
  EstimandReading reading = ReadEstimand(space, a, World(s, space, chosen), {});
  ASSERT_EQ(reading.seeds, (std::vector<int64_t>{1}));
  EXPECT_NEAR(std::exp(reading.log_ratio[0]), 1.1, 0.02);  // log-log interpolation of a power law
  EXPECT_FALSE(reading.has_interval);
  const AdaptiveBatch second = ChooseBatch(space, a, reading, chosen, first.cost_flops);
  // Two more seeds (min_seeds 3) on rungs crossing ±1, cheaper per seed than the exploration.
  ASSERT_EQ(second.why.size(), 2u);
  EXPECT_THAT(second.why[0], HasSubstr("seed 2"));
  EXPECT_THAT(second.why[1], HasSubstr("seed 3"));
  EXPECT_LT(second.cost_flops, 2 * first.cost_flops);
  // Deterministic: the same state gives the same batch.
  const AdaptiveBatch again = ChooseBatch(space, a, reading, chosen, first.cost_flops);
  EXPECT_EQ(again.runs, second.runs);
  EXPECT_EQ(again.why, second.why);

  // A budget that cannot pay for the next step says so and chooses nothing.
  a.budget_flops = first.cost_flops * 1.01;
  const AdaptiveBatch broke = ChooseBatch(space, a, reading, chosen, first.cost_flops);
  EXPECT_TRUE(broke.runs.empty());
  EXPECT_THAT(broke.exhausted, HasSubstr("budget is spent"));
}

TEST(AdaptiveChooser, ExtendsATrunkThatStopsAboveTheTarget) {
  const Sweep s = ExpandSpec(Spec());
  AdaptiveSpec a = *s.adaptive;
  const AdaptiveSpace space = BuildSpace(s, a);
  std::set<int> every;
  for (const SpaceRun& r : space.runs) every.insert(r.index);
  const Results all = World(s, space, every);
  a.target_loss =
      0.5 * (all.at(space.At(0, 1, 2)->index).loss + all.at(space.At(0, 1, 3)->index).loss);
  // Seeds 1-3 bracket; seed 4 trained its arm only to rung 2 (above the target).
  std::set<int> chosen;
  for (int64_t seed : {1, 2, 3})
    for (int side : {0, 1})
      for (int rung : {1, 2, 3}) chosen.insert(space.At(side, seed, rung)->index);
  for (int side : {0, 1}) chosen.insert(space.At(side, 4, 1)->index);
  chosen.insert(space.At(0, 4, 3)->index);
  chosen.insert(space.At(1, 4, 2)->index);
  const EstimandReading reading = ReadEstimand(space, a, World(s, space, chosen), {});
  EXPECT_EQ(reading.seeds.size(), 3u);
  EXPECT_TRUE(reading.has_interval);
  EXPECT_EQ(reading.cover.at({1, 4}), Cover::kAbove);
  const AdaptiveBatch b = ChooseBatch(space, a, reading, chosen, 0);
  ASSERT_EQ(b.runs, (std::vector<int>{space.At(1, 4, 3)->index}));
  EXPECT_THAT(b.why[0], HasSubstr("extend to train.steps=32"));
  // The new trunk extends the trained rung-2 run: its stable phase is not paid again.
  const SpaceRun* trained = space.At(1, 4, 2);
  EXPECT_DOUBLE_EQ(b.cost_flops,
                   space.At(1, 4, 3)->flops - (trained->flops - trained->decay_flops));
  EXPECT_LT(b.cost_flops, space.At(1, 4, 3)->flops);
  // With a new shorter run that branches before the trained run's decay start, the runner trains
  // the trunk from scratch (PlanExtensions), and the price says so.
  EXPECT_DOUBLE_EQ(BatchCost(space, {space.At(1, 4, 3)->index, space.At(1, 4, 0)->index}, chosen),
                   space.At(1, 4, 3)->flops + space.At(1, 4, 0)->decay_flops);
}

TEST(AdaptiveChooser, PlanSaysWhatTheBudgetCanResolve) {
  const Sweep s = ExpandSpec(Spec());
  const std::string plan = DescribeAdaptivePlan(s, BuildSpace(s, *s.adaptive), *s.adaptive);
  EXPECT_THAT(plan, HasSubstr("first batch: 8 runs"));
  EXPECT_THAT(plan, HasSubstr("cost bound"));
  EXPECT_THAT(plan, HasSubstr("at best it resolves"));
}

}  // namespace
}  // namespace moelab::sweeps
