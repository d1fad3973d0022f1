// `moelab sweep plan` runs fit's and promote's checks per family (issue 37.2) and prints the
// full plan of a sweep this machine cannot run, with a warning (issue 37.4).
#include <gtest/gtest.h>

#include <cstdio>

#include "core/device.h"
#include "sweeps/fit_plan.h"
#include "sweeps/plan.h"
#include "tests/sweeps/plan_fixture.h"
#include "tests/sweeps/spec_fixture.h"

namespace moelab::sweeps {
namespace {

#define EXPECT_HAS(haystack, needle) \
  EXPECT_NE(std::string(haystack).find(needle), std::string::npos) << (haystack)

ojson Spec(const std::string& axes) {
  ojson s = ojson::parse(axes);
  s["name"] = "plan";
  s["base"] = test_specs::Base();
  s["base"]["eval"]["every"] = 0;
  return s;
}

std::string PlanText(const Sweep& s) {
  PlanOptions po;
  po.calibrate = false;
  return test_plans::PlanText(s, po);
}

TEST(PlanFits, SparsityByHeadsIsOneFamilyPerArmAndSaysWhatFitNeeds) {
  const Sweep s = ExpandSpec(Spec(R"({
    "grid": {"sparsity": [2, 4], "model.heads": [1, 2], "train.steps": [20, 40, 80, 160]},
    "seeds": [1, 2, 3],
    "derived": ["moe.experts_total = sparsity * moe.experts_active"]})"));
  const FitPlan p = PlanFits(s);
  ASSERT_EQ(p.axes.size(), 2u);
  ASSERT_EQ(p.families.size(), 4u);
  for (const auto& f : p.families) {
    EXPECT_EQ(f.units, 3) << f.family;
    EXPECT_EQ(f.frontier_points, 12) << f.family;  // 4 budgets × 3 seeds
    EXPECT_EQ(f.PromoteText(), "yes") << f.family;
  }
  const std::string text = PlanText(s);
  EXPECT_HAS(text,
             "model.heads=1,sparsity=2: 3 trunk(s), 12 frontier point(s); fit: law with an "
             "interval (3 seeds); promote: yes");
  EXPECT_HAS(text, "`moelab fit --by sparsity` and `moelab promote` refuse to pool model.heads");
  EXPECT_HAS(text, "--pool model.heads");
  EXPECT_EQ(text.find("warning:"), std::string::npos) << text;
}

TEST(PlanFits, WarnsPerFamilyWhatFitAndPromoteWillRefuse) {
  // One seed and two budgets: no law for either family, so promote refuses too.
  const Sweep s =
      ExpandSpec(Spec(R"({"grid": {"moe.experts_total": [4, 8], "train.steps": [20, 40]}})"));
  const std::string text = PlanText(s);
  EXPECT_HAS(text, "moe.experts_total=4: 1 trunk(s), 2 frontier point(s); fit: no law: ");
  EXPECT_HAS(text, "promote: refused: no law to scale");
  EXPECT_HAS(text,
             "warning: `moelab fit` needs at least 4 points on each family's "
             "loss-over-compute frontier and fails for 2 of 2 families "
             "(moe.experts_total=4 has 2; moe.experts_total=8 has 2)");
  // Four budgets, two seeds: a law, but no interval, and promote refuses (issue 37.2).
  const Sweep t = ExpandSpec(Spec(R"({
    "grid": {"moe.experts_total": [4, 8], "train.steps": [20, 40, 80, 160]},
    "seeds": [1, 2]})"));
  const std::string two = PlanText(t);
  EXPECT_HAS(two, "fit: law, point estimate only (2 seeds: too few for an interval");
  EXPECT_HAS(two, "promote: refused: the fit has no bootstrap draws");
  EXPECT_HAS(two,
             "warning: `moelab fit` gives no interval for 2 of 2 families and `moelab "
             "promote` refuses them");
}

TEST(PlanFits, ModelSizesArePooledIntoOneFamily) {
  // promote-demo's design: widths × budgets × seeds of one sparsity.
  const Sweep s = ExpandSpec(Spec(R"({
    "zip": [{"model.d_model": [32, 48, 64], "model.ffn_hidden": [64, 96, 128]}],
    "grid": {"train.steps": [20, 40], "train.seed": [1, 2]}})"));
  const FitPlan p = PlanFits(s);
  EXPECT_TRUE(p.axes.empty());
  ASSERT_EQ(p.families.size(), 1u);
  EXPECT_EQ(p.families[0].family, "the sweep");
  EXPECT_EQ(p.families[0].units, 6);  // 3 widths × 2 seeds: not paired, needs 5
  EXPECT_FALSE(p.families[0].paired);
  EXPECT_EQ(p.families[0].PromoteText(), "yes");
}

TEST(PlanFits, PrintsTheFullPlanOfASweepThisMachineCannotRun) {
  if (QueryCudaDevices().count > 0) GTEST_SKIP() << "a GPU is usable here: nothing to warn about";
  ojson spec = Spec(R"({"grid": {"train.steps": [20, 40]}})");
  spec["base"]["train"]["device"] = "cuda";
  ExpandOptions eo;
  eo.check_device = true;
  EXPECT_THROW(ExpandSpec(spec, eo), SpecError);  // what `sweep run` does: refused
  const Sweep s = ExpandSpec(spec);               // what `sweep plan` does
  PlanOptions po;
  po.gpu_peak_tflops = 790;
  po.gpu_mfu = 0.35;
  // calibrate is on: it must not try to train on a missing GPU
  const std::string text = test_plans::PlanText(s, po);
  EXPECT_HAS(text, "total: 2 unique runs");
  EXPECT_HAS(text, "GPU-hours");
  EXPECT_HAS(text, "time estimate: not calibrated: this machine cannot run the sweep's device");
  EXPECT_HAS(text,
             "warning: this machine cannot run 2 of the 2 unique runs (\"cuda\" cannot run "
             "here");
  EXPECT_HAS(text, "`moelab sweep run` refuses here before anything starts");
}

}  // namespace
}  // namespace moelab::sweeps
