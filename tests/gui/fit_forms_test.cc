// The Scaling view fits through analysis::RunFit, as `moelab fit` does (issue 36): for every
// fit form the GUI's ComputeFits and the real CLI, run on the same database with the same
// options, give the same numbers (the CLI with its default two bootstrap threads, the GUI with
// one), or refuse with the same reason.
#include <gtest/gtest.h>

#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>

#include "analysis/run_fit.h"
#include "gui/fits.h"
#include "tests/common/test_util.h"
#include "tests/gui/fixture.h"

namespace moelab::gui {
namespace {

using nlohmann::json;

// What `moelab fit --json --no-store` prints for this request's options; false (with its
// stderr in *err) when it refuses.
bool CliFit(const FitRequest& req, const test::TempDir& dir, json* out, std::string* err) {
  const std::string out_path = dir / (req.form + ".json"), err_path = dir / (req.form + ".err");
  const std::string cmd = test::BinPath("moelab") + " fit --db '" + req.db_path + "' --by " +
                          req.family_key + " --form " + req.form + " --resamples " +
                          std::to_string(req.resamples) + " --seed " + std::to_string(req.seed) +
                          " --base " + req.heads_base + " --treatment " + req.heads_treatment +
                          " --budgets 1e13,1e14 --json --no-store > '" + out_path + "' 2> '" +
                          err_path + "'";
  const int rc = std::system(cmd.c_str());
  *err = test::Slurp(err_path);
  if (rc != 0) return false;
  *out = json::parse(test::Slurp(out_path));
  return true;
}

TEST(GuiFitForms, EveryFormGivesTheNumbersMoelabFitPrints) {
  test::TempDir dir("moelab_gui_fit_forms");
  const std::string db = dir / "scaling.db";
  testing::BuildScalingFixture(db);
  int fitted = 0;
  for (const std::string& form : analysis::FitForms()) {
    SCOPED_TRACE(form);
    FitRequest req;
    req.db_path = db;
    req.family_key = "heads";
    req.form = form;
    req.resamples = 60;
    req.seed = 7;
    req.heads_base = "4";
    req.heads_treatment = "8";
    req.budgets = {1e13, 1e14};
    const FitResult gui = ComputeFits(req);
    json cli;
    std::string err;
    if (!CliFit(req, dir, &cli, &err)) {
      // A refusal: the GUI says what the CLI says.
      ASSERT_FALSE(gui.error.empty()) << "the CLI refused, the GUI fitted: " << err;
      EXPECT_NE(err.find(gui.error), std::string::npos) << err;
      continue;
    }
    ASSERT_TRUE(gui.form_result.has_value()) << gui.error;
    ++fitted;
    // The frontier's composition (which sizes make each seed's envelope, analysis/frontier.h) is
    // printed by `moelab fit` beside RunFit's result; the GUI shows the estimand label only. Every
    // number RunFit computes must agree.
    cli.erase("frontier");
    // Through JSON text on both sides: NaN is null in either.
    const json mine = json::parse(json(*gui.form_result).dump());
    EXPECT_EQ(mine, cli) << "GUI: " << mine.dump(1) << "\nCLI: " << cli.dump(1);
    if (form == "power") {
      // What the view draws is the RunFit result itself.
      ASSERT_TRUE(gui.fits.has_value());
      EXPECT_EQ(json::parse(json(*gui.fits).dump()), cli["fits"]);
      ASSERT_TRUE(gui.model_free.has_value()) << gui.model_free_error;
      EXPECT_EQ(json::parse(json(*gui.model_free).dump()), cli["model_free"]);
      EXPECT_EQ(gui.bands.size(), gui.fits->families.size());
    }
    if (form == "heads") {
      ASSERT_TRUE(gui.heads.has_value());
      EXPECT_LT(gui.heads->mean_delta_equal_tokens.estimate, 0);  // 8 heads is better
    }
  }
  EXPECT_GE(fitted, 2) << "power and heads fit this fixture";
}

TEST(GuiFitForms, TheRequestMapsToTheCliFlags) {
  FitRequest req;
  req.form = "chinchilla";
  req.family_key = "heads";
  req.resamples = 77;
  req.seed = 9;
  req.level = 0.8;
  req.min_seeds = 4;
  req.max_failed_fraction = 0.2;
  req.reference = "8";
  req.target_losses = {3.0, 2.9};
  req.budgets = {1e15};
  analysis::RunFitOptions o = RunFitOptionsOf(req);
  EXPECT_EQ(o.form, "chinchilla");
  EXPECT_EQ(o.family_key, "heads");
  EXPECT_EQ(o.fit.bootstrap_resamples, 77);
  EXPECT_EQ(o.fit.seed, 9u);
  EXPECT_EQ(o.fit.level, 0.8);
  EXPECT_EQ(o.fit.min_units, 4);
  EXPECT_EQ(o.fit.max_failed_fraction, 0.2);
  EXPECT_EQ(o.reference, "8");
  EXPECT_EQ(o.target_losses, req.target_losses);
  EXPECT_EQ(o.budgets, req.budgets);
  // final_only unset: neither flag (WSD runs use their post-decay points, as the CLI's default).
  EXPECT_FALSE(o.final_only);
  EXPECT_FALSE(o.all_points);
  req.final_only = true;  // --final-only
  o = RunFitOptionsOf(req);
  EXPECT_TRUE(o.final_only);
  EXPECT_FALSE(o.all_points);
  req.final_only = false;  // --all-points (a stored fit's options)
  o = RunFitOptionsOf(req);
  EXPECT_FALSE(o.final_only);
  EXPECT_TRUE(o.all_points);
}

}  // namespace
}  // namespace moelab::gui
