// Adaptive sweeps in-process: the "adaptive" block's validation by JSON path, the space it
// draws from, the estimand read from known results, and the chooser's batches (explore one seed
// on the whole ladder, then seeds on the rungs where the target was crossed, extensions before
// new seeds when cheaper, the budget respected, the same choice from the same results).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>

#include "analysis/seed_stats.h"
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
  EXPECT_NEAR(std::exp(reading.log_value[0]), 1.1, 0.02);  // log-log interpolation of a power law
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

// A slope over three values of the key: the reference 8 and arms 2 and 4, in a world where each
// halving of the key costs 1.2× the FLOPs at every loss (β = ln 1.2 per doubling).
ojson SlopeSpec() {
  ojson spec = Spec();
  spec["grid"]["moe.experts_total"] = {2, 4, 8};
  spec["adaptive"]["estimand"] = ojson::parse(R"({"kind": "slope", "key": "moe.experts_total",
      "arms": [2, 4], "reference": 8, "target_loss": 3.0})");
  return spec;
}

TEST(AdaptiveSpec, SlopeNamesItsArmsAndChecksThem) {
  ojson spec = SlopeSpec();
  spec["base"]["moe"]["experts_active"] = 1;
  const Sweep s = ExpandSpec(spec);
  ASSERT_TRUE(s.adaptive.has_value());
  EXPECT_TRUE(s.adaptive->IsSlope());
  EXPECT_EQ(s.adaptive->Sides(), 3);
  EXPECT_EQ(s.adaptive->SideValue(0), 8);  // the reference, then the arms in order
  EXPECT_EQ(s.adaptive->SideValue(1), 2);
  EXPECT_EQ(s.adaptive->SideValue(2), 4);
  EXPECT_THAT(DescribeQuestion(*s.adaptive),
              HasSubstr("slope: FLOPs factor per doubling of moe.experts_total in {2, 4} against "
                        "moe.experts_total=8"));
  auto with = [&](const std::function<void(ojson&)>& edit) {
    ojson t = spec;
    edit(t["adaptive"]["estimand"]);
    return ErrorOf(t);
  };
  EXPECT_THAT(with([](ojson& e) { e["arm"] = 2; }), HasSubstr("adaptive.estimand.arm:"));
  EXPECT_THAT(with([](ojson& e) { e.erase("arms"); }),
              HasSubstr("adaptive.estimand.arms: missing"));
  EXPECT_THAT(with([](ojson& e) {
                e["arms"] = {2, "four"};
              }),
              HasSubstr("adaptive.estimand.arms[1]: expected a positive number"));
  EXPECT_THAT(with([](ojson& e) {
                e["arms"] = {2, 2};
              }),
              HasSubstr("adaptive.estimand.arms[1]: 2 is listed twice"));
  EXPECT_THAT(with([](ojson& e) {
                e["arms"] = {2, 8};
              }),
              HasSubstr("adaptive.estimand.arms[1]: equals the reference"));
  EXPECT_THAT(with([](ojson& e) {
                e["arms"] = {2, 16};
              }),
              HasSubstr("adaptive.estimand.arms[1]: no run has moe.experts_total = 16"));
  EXPECT_THAT(with([](ojson& e) { e["reference"] = "eight"; }),
              HasSubstr("adaptive.estimand.reference: a slope needs a positive number"));
  ojson ratio = Spec();
  ratio["adaptive"]["estimand"]["arms"] = {8};
  EXPECT_THAT(ErrorOf(ratio), HasSubstr("adaptive.estimand.arms: a ratio compares one arm"));
}

TEST(AdaptiveChooser, SlopeReadsTheFactorPerDoublingOverEveryArm) {
  ojson spec = SlopeSpec();
  spec["base"]["moe"]["experts_active"] = 1;
  const Sweep s = ExpandSpec(spec);
  AdaptiveSpec a = *s.adaptive;
  const AdaptiveSpace space = BuildSpace(s, a);
  ASSERT_EQ(space.runs.size(), 72u);  // 3 sides x 6 seeds x 4 rungs
  const double c0 = space.runs.front().flops;
  auto world = [&](const std::set<int>& runs) {
    Results out;
    for (const SpaceRun& r : space.runs) {
      if (!runs.count(r.index)) continue;
      // The side's FLOPs to a loss: 1.2^doublings × the reference's, plus a seed offset on the
      // slope (β_seed = ln 1.2 + 0.01·(seed − 3.5)) so the interval has a width.
      const double beta = std::log(1.2) + 0.01 * (static_cast<double>(r.seed) - 3.5);
      const double doublings = std::log2(8.0 / a.SideValue(r.side).get<double>());
      const double scale = std::exp(beta * doublings);
      const double c = r.flops / scale;
      out[r.index] = {2.0 + 4.0 * std::pow(c / c0 * 4, -0.5), r.flops,
                      double(s.runs[r.index].config.total_steps())};
    }
    return out;
  };
  std::set<int> every;
  for (const SpaceRun& r : space.runs) every.insert(r.index);
  // The target between the arms' and the reference's middle rungs, so every side brackets it.
  const Results all = world(every);
  a.target_loss =
      0.5 * (all.at(space.At(1, 1, 2)->index).loss + all.at(space.At(0, 1, 1)->index).loss);

  const AdaptiveBatch first = ChooseBatch(space, a, EstimandReading{}, {}, 0);
  EXPECT_EQ(first.runs.size(), 12u);  // seed 1: every side on the whole ladder
  EXPECT_THAT(first.why[0], HasSubstr("moe.experts_total=2 on"));
  EXPECT_THAT(first.why[0], HasSubstr("moe.experts_total=8 on"));

  const EstimandReading r = ReadEstimand(space, a, all, {3, 4, 5});
  ASSERT_EQ(r.seeds.size(), 6u);
  for (size_t i = 0; i < r.seeds.size(); ++i) {
    const double beta = std::log(1.2) + 0.01 * (static_cast<double>(r.seeds[i]) - 3.5);
    EXPECT_NEAR(r.log_value[i], beta, 0.01) << "seed " << r.seeds[i];
  }
  ASSERT_TRUE(r.has_interval);
  EXPECT_NEAR(r.ratio, 1.2, 0.02);
  EXPECT_LT(r.lo, 1.2);
  EXPECT_GT(r.hi, 1.2);
  EXPECT_THAT(StopReason(a, r), HasSubstr("excludes 1"));
  // A seed missing one arm is not read: the slope needs every arm of the seed.
  std::set<int> partial = every;
  for (int rung = 0; rung < 4; ++rung) partial.erase(space.At(1, 6, rung)->index);
  const EstimandReading p = ReadEstimand(space, a, world(partial), {});
  EXPECT_EQ(p.seeds, (std::vector<int64_t>{1, 2, 3, 4, 5}));
}

TEST(AdaptiveChooser, ComparesTheAnswerWithFixedGrids) {
  const Sweep s = ExpandSpec(Spec());
  const AdaptiveSpec& a = *s.adaptive;
  const AdaptiveSpace space = BuildSpace(s, a);
  std::vector<int> seed1;
  for (const SpaceRun& r : space.runs)
    if (r.seed == 1) seed1.push_back(r.index);
  const double per_seed = BatchCost(space, seed1, {});
  // A one-look t critical value at 4 seeds: the fixed grid as narrow is the same 4 seeds.
  const double t4 = analysis::StudentTQuantile(1 - a.alpha / 2, 3);
  GridComparison g = CompareWithGrid(space, a, 4, t4);
  EXPECT_DOUBLE_EQ(g.per_seed_flops, per_seed);
  EXPECT_DOUBLE_EQ(g.same_seeds_flops, 4 * per_seed);
  EXPECT_DOUBLE_EQ(g.full_flops, 6 * per_seed);
  EXPECT_EQ(g.equal_width_seeds, 4);
  // A repeated interval (larger c: the price of looking after every batch) is as wide as a
  // one-look interval over fewer seeds: the smallest such n'.
  g = CompareWithGrid(space, a, 4, 1.5 * t4);
  ASSERT_LT(g.equal_width_seeds, 4);
  ASSERT_GE(g.equal_width_seeds, 2);
  const auto half = [&](int n) {
    return analysis::StudentTQuantile(1 - a.alpha / 2, n - 1) / std::sqrt(double(n));
  };
  EXPECT_LE(half(g.equal_width_seeds), 1.5 * t4 / 2);
  if (g.equal_width_seeds > 2) EXPECT_GT(half(g.equal_width_seeds - 1), 1.5 * t4 / 2);
  const std::string line = FormatGridComparison(g, 2 * per_seed);
  EXPECT_THAT(line, HasSubstr("for the same 4 seeds (2.00×)"));
  EXPECT_THAT(line, HasSubstr("as narrow needs"));
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
