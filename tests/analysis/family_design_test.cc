// What a fit may pool into one family (issue 37.2), what fit and promote can do per family, the
// error that names every failing family, and RunFit's dispatch (issue 36.4b, 39).
#include "analysis/family_design.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "analysis/run_fit.h"

namespace moelab::analysis {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// A sparsity × heads sweep at a fixed width: every run has the same active parameters.
std::map<std::string, DesignRun> SparsityByHeads() {
  std::map<std::string, DesignRun> runs;
  int id = 0;
  for (const char* s : {"8", "48"})
    for (const char* h : {"2", "4"})
      for (const char* steps : {"100", "200"})
        runs[std::to_string(id++)] = {s,
                                      {{"sparsity", s},
                                       {"moe.experts_total", std::to_string(8 * std::stoi(s))},
                                       {"model.heads", h},
                                       {"train.steps", steps},
                                       {"train.seed", "1"}}};
  return runs;
}

TEST(FamilyDesign, BudgetAndSeedKeysAreNotTreatments) {
  EXPECT_TRUE(IsBudgetOrSeedKey("train.steps"));
  EXPECT_TRUE(IsBudgetOrSeedKey("train.tokens"));
  EXPECT_TRUE(IsBudgetOrSeedKey("train.seed"));
  EXPECT_TRUE(IsBudgetOrSeedKey("schedule.warmup_steps"));
  EXPECT_FALSE(IsBudgetOrSeedKey("model.heads"));
  EXPECT_FALSE(IsBudgetOrSeedKey("sparsity"));
}

TEST(FamilyDesign, RefusesToPoolAnotherSweptKeyNamingEveryFamily) {
  const auto runs = SparsityByHeads();
  const auto mixed = MixedFamilies(runs, "sparsity", {});
  ASSERT_EQ(mixed.size(), 2u);
  EXPECT_EQ(mixed[0].family, "48");
  EXPECT_EQ(mixed[1].family, "8");
  EXPECT_EQ(mixed[0].axes, std::vector<std::string>{"model.heads"});
  try {
    RequireUnmixedFamilies(runs, "sparsity", {}, "moelab fit");
    FAIL() << "pooled heads silently";
  } catch (const AnalysisError& e) {
    const std::string m = e.what();
    EXPECT_THAT(m, HasSubstr("2 of 2 families by 'sparsity'"));
    EXPECT_THAT(m, HasSubstr("sparsity=8: its runs differ in model.heads"));
    EXPECT_THAT(m, HasSubstr("sparsity=48: its runs differ in model.heads"));
    EXPECT_THAT(m, HasSubstr("--pool model.heads"));
  }
  EXPECT_NO_THROW(RequireUnmixedFamilies(runs, "sparsity", {"model.heads"}, "moelab fit"));
}

TEST(FamilyDesign, DerivedKeysJoinTheirAxisAndPoolWithIt) {
  auto runs = SparsityByHeads();
  for (auto& [id, r] : runs) r.family = r.vars["model.heads"];
  // By heads, the families pool the sparsities (and their derived experts_total): one axis.
  const auto mixed = MixedFamilies(runs, "model.heads", {});
  ASSERT_EQ(mixed.size(), 2u);
  EXPECT_EQ(mixed[0].axes, std::vector<std::string>{"sparsity = moe.experts_total"});
  EXPECT_TRUE(MixedFamilies(runs, "model.heads", {"sparsity"}).empty());
  EXPECT_TRUE(MixedFamilies(runs, "model.heads", {"moe.experts_total"}).empty());
}

TEST(FamilyDesign, ModelSizesArePooledOnTheFrontier) {
  // promote-demo's zip of widths × budgets of one sparsity: the frontier is the envelope over
  // model sizes, and a key that changes with the width (its layers) is a size too.
  std::map<std::string, DesignRun> runs;
  int id = 0;
  for (int d : {32, 48, 64})
    for (const char* steps : {"100", "250"})
      runs[std::to_string(id++)] = {"4",
                                    {{"sparsity", "4"},
                                     {"model.d_model", std::to_string(d)},
                                     {"model.layers", d == 32 ? "1" : "2"},
                                     {"train.steps", steps},
                                     {"schedule.warmup_steps", steps}}};
  EXPECT_TRUE(MixedFamilies(runs, "sparsity", {}).empty());
  EXPECT_TRUE(IsModelSizeKey("model.d_model"));
  EXPECT_FALSE(IsModelSizeKey("model.heads"));
  // A width variable of the spec with d_model derived from it: one axis, a size.
  for (auto& [k, r] : runs) r.vars["width"] = r.vars["model.d_model"];
  EXPECT_TRUE(MixedFamilies(runs, "sparsity", {}).empty());
}

// One seed's trunk per family and budget, with `budgets` runs on a falling curve.
std::vector<Observation> Curve(const std::string& family, const std::string& seed, int budgets,
                               const std::string& trunk = "a") {
  std::vector<Observation> obs;
  for (int b = 0; b < budgets; ++b) {
    Observation o;
    o.run = family + "/" + seed + "/" + trunk + "/" + std::to_string(b);
    o.family = family;
    o.flops = 1e15 * std::pow(2.0, b);
    o.tokens = 1e9 * std::pow(2.0, b);
    o.params = 1e6;
    o.loss = 2 + std::pow(2.0, -0.3 * b);
    o.seed = seed;
    o.unit = "seed " + seed + ", trunk " + trunk;
    obs.push_back(o);
  }
  return obs;
}

TEST(FamilyDesign, AssessFamiliesSaysWhatFitAndPromoteCanDo) {
  std::vector<Observation> obs;
  for (const char* seed : {"1", "2", "3"}) {
    const auto a = Curve("8", seed, 5), b = Curve("48", seed, 1);
    obs.insert(obs.end(), a.begin(), a.end());
    obs.insert(obs.end(), b.begin(), b.end());
  }
  const auto r = AssessFamilies(obs, FitOptions{});
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[0].family, "48");
  EXPECT_FALSE(r[0].Fits());
  EXPECT_THAT(r[0].FitText(), HasSubstr("no law: family '48'"));
  EXPECT_THAT(r[0].PromoteText(), HasSubstr("refused"));
  EXPECT_TRUE(r[1].Fits());
  EXPECT_TRUE(r[1].paired);
  EXPECT_EQ(r[1].units, 3);
  EXPECT_EQ(r[1].PromoteText(), "yes");

  // Two trunks of one seed in a family (a pooled treatment): not paired, promote needs 5.
  std::vector<Observation> pooled;
  for (const char* seed : {"1", "2"})
    for (const char* trunk : {"h2", "h4"}) {
      const auto c = Curve("8", seed, 5, trunk);
      pooled.insert(pooled.end(), c.begin(), c.end());
    }
  const auto p = AssessFamilies(pooled, FitOptions{});
  ASSERT_EQ(p.size(), 1u);
  EXPECT_FALSE(p[0].paired);
  EXPECT_EQ(p[0].units_needed, 5);
  EXPECT_FALSE(p[0].Promotable());
  EXPECT_THAT(p[0].PromoteText(), HasSubstr("4 trunks: too few"));
}

TEST(FamilyDesign, FitErrorNamesEveryFailingFamily) {
  std::vector<Observation> obs = Curve("8", "1", 1);
  const auto b = Curve("48", "1", 2);
  obs.insert(obs.end(), b.begin(), b.end());
  FitOptions fo;
  fo.skip_failed_families = true;
  fo.bootstrap_resamples = 20;
  try {
    FitFamilies(obs, fo);
    FAIL() << "fitted";
  } catch (const AnalysisError& e) {
    EXPECT_THAT(e.what(), HasSubstr("family '8'"));
    EXPECT_THAT(e.what(), HasSubstr("family '48'"));
  }
}

ObservationSet SetOf(const std::vector<Observation>& points) {
  ObservationSet s;
  s.points = points;
  std::set<std::string> runs;
  for (const auto& p : points) runs.insert(p.run);
  s.runs_used = static_cast<int>(runs.size());
  return s;
}

TEST(RunFit, OneFamilyVerdictSaysWhyThereIsNoModelFreeEstimate) {
  std::vector<Observation> obs;
  for (const char* seed : {"1", "2", "3"}) {
    const auto c = Curve("4", seed, 6);
    obs.insert(obs.end(), c.begin(), c.end());
  }
  RunFitOptions o;
  o.family_key = "sparsity";
  o.fit.bootstrap_resamples = 50;
  const FitResult r = RunFit(o, SetOf(obs));
  ASSERT_TRUE(r.power);
  EXPECT_THAT(r.power->verdict_basis, Not(HasSubstr("estimate: )")));
  EXPECT_THAT(r.power->verdict_basis, HasSubstr("one family (sparsity=4)"));
  const nlohmann::json j = r;
  EXPECT_EQ(j["verdict_basis"], r.power->verdict_basis);
}

TEST(RunFit, ModelFreeTableStandsWhenNoLawCanBeFitted) {
  // One seed on three budgets: the model-free table reads its crossing, but no family has the
  // 4 frontier points a law needs. The table is reported, and the law's failure said.
  std::vector<Observation> obs;
  for (const char* seed : {"1"})
    for (const char* f : {"32", "48"}) {
      auto c = Curve(f, seed, 3);
      for (auto& p : c)
        if (std::string(f) == "32") p.flops *= 0.9;  // S = 32 needs 0.9x the FLOPs
      obs.insert(obs.end(), c.begin(), c.end());
    }
  RunFitOptions o;
  o.family_key = "sparsity";
  o.reference = "48";
  o.target_losses = {2.7};
  o.fit.bootstrap_resamples = 50;
  const FitResult r = RunFit(o, SetOf(obs));
  ASSERT_TRUE(r.power);
  EXPECT_THAT(r.power->law_error, HasSubstr("no family could be fitted"));
  EXPECT_TRUE(r.power->families.empty());
  ASSERT_TRUE(r.power->model_free);
  ASSERT_EQ(r.power->model_free->rows.size(), 1u);
  EXPECT_NEAR(r.power->model_free->rows[0].flops_ratio.estimate, 0.9, 1e-9);
  EXPECT_THAT(r.power->verdict_basis, HasSubstr("model-free"));
  // Without the model-free table either (one family), nothing is reported: the law's reasons.
  std::vector<Observation> one;
  for (const auto& p : obs)
    if (p.family == "48") one.push_back(p);
  o.reference.clear();
  try {
    RunFit(o, SetOf(one));
    ADD_FAILURE() << "expected an AnalysisError";
  } catch (const AnalysisError& e) {
    EXPECT_THAT(e.what(), HasSubstr("no family could be fitted"));
    EXPECT_THAT(e.what(), HasSubstr("and no model-free estimate"));
  }
}

TEST(RunFit, DispatchesEveryFormAndRefusesMixedFamilies) {
  std::vector<Observation> obs;
  for (const char* seed : {"1", "2", "3"})
    for (const char* f : {"1", "2"}) {
      const auto c = Curve(f, seed, 5);
      obs.insert(obs.end(), c.begin(), c.end());
    }
  ObservationSet set = SetOf(obs);
  RunFitOptions o;
  o.family_key = "head_ratio";
  o.fit.bootstrap_resamples = 30;
  o.form = "heads";
  EXPECT_THROW(RunFit(o, set), AnalysisError);  // no base / treatment
  o.base = "1";
  o.treatment = "2";
  EXPECT_TRUE(RunFit(o, set).heads);
  o.form = "isoflop";
  EXPECT_TRUE(RunFit(o, set).isoflop);
  o.form = "nonsense";
  EXPECT_THROW(RunFit(o, set), AnalysisError);
  // The runs of family 1 differ in a swept optimizer: refused, then fitted when pooled.
  for (const auto& p : obs)
    set.run_vars[p.run] = {{"head_ratio", p.family},
                           {"optimizer.name", p.run.back() % 2 ? "muon" : "adamw"}};
  o.form = "power";
  EXPECT_THROW(RunFit(o, set), AnalysisError);
  o.pool = {"optimizer.name"};
  EXPECT_TRUE(RunFit(o, set).power);
  // --where keeps one arm: one experiment per family again.
  o.pool.clear();
  const ObservationSet adamw = SelectRuns(set, {{"optimizer.name", "adamw"}});
  EXPECT_LT(adamw.points.size(), set.points.size());
  EXPECT_NO_THROW(RunFit(o, adamw));
  EXPECT_THROW(SelectRuns(set, {{"optimizer.name", "sgd"}}), AnalysisError);
}

}  // namespace
}  // namespace moelab::analysis
