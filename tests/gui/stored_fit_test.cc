// The Scaling view draws a fit `moelab fit` stored without refitting (issue 14): the row the
// real CLI writes is turned into the view's FitResult (curves from the stored parameters, the
// observations and the multiplier table; no bands, since the bootstrap draws are not stored).
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "db/fits.h"
#include "db/schema.h"
#include "gui/fits.h"
#include "tests/common/test_util.h"
#include "tests/gui/fixture.h"
#include "tests/gui/harness.h"

namespace moelab::gui {
namespace {

using nlohmann::json;

double Param(const json& family, const std::string& name) {
  for (const json& p : family["params"]) {
    if (p["name"] == name) return p["value"]["estimate"].get<double>();
  }
  return NAN;
}

TEST(GuiStoredFit, ARowMoelabFitStoredGivesItsCurvesPointsAndMultipliers) {
  test::TempDir dir("moelab_gui_stored_fit");
  const std::string db = dir / "scaling.db";
  testing::BuildScalingFixture(db);
  const std::string cmd = test::BinPath("moelab") + " fit --db '" + db +
                          "' --sweep heads --by heads --resamples 100 > '" + (dir / "fit.log") +
                          "' 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << test::Slurp(dir / "fit.log");
  const std::vector<db::FitRecord> rows = db::ListFits(db, std::nullopt);
  ASSERT_EQ(rows.size(), 1u);
  const db::FitRecord& row = rows[0];

  std::string why;
  const std::optional<FitResult> r = FitResultFromStored(row, &why);
  ASSERT_TRUE(r.has_value()) << why;
  EXPECT_EQ(r->stored_fit, row.id);
  ASSERT_TRUE(r->fits.has_value());

  const json stored = json::parse(row.result_json);
  const json& families = stored["fits"]["families"];
  ASSERT_EQ(r->fits->families.size(), families.size());
  ASSERT_EQ(r->bands.size(), families.size());
  for (size_t i = 0; i < families.size(); ++i) {
    const json& want = families[i];
    const analysis::PowerLawFit& f = r->fits->Get(want["family"].get<std::string>());
    const double E = Param(want, "E"), log_A = Param(want, "log_A"), alpha = Param(want, "alpha");
    EXPECT_DOUBLE_EQ(f.E(), E);
    EXPECT_DOUBLE_EQ(f.log_A(), log_A);
    EXPECT_DOUBLE_EQ(f.alpha(), alpha);
    EXPECT_EQ(f.frontier.size(), want["frontier"].size());
    EXPECT_DOUBLE_EQ(f.min_flops, want["flops_range"][0].get<double>());
    EXPECT_DOUBLE_EQ(f.max_flops, want["flops_range"][1].get<double>());
    // The curve is the stored law over the family's compute range (3x beyond each end); no
    // band without draws.
    const FitBand& b = r->bands[i];
    EXPECT_EQ(b.family, f.family);
    EXPECT_FALSE(b.has_band());
    ASSERT_EQ(b.flops.size(), 65u);
    EXPECT_NEAR(b.flops.front(), f.min_flops / 3, 1e-9 * f.min_flops);
    EXPECT_NEAR(b.flops.back(), f.max_flops * 3, 1e-9 * f.max_flops);
    const double unit = want["flops_unit"].get<double>();
    for (size_t k = 0; k < b.flops.size(); ++k) {
      EXPECT_NEAR(b.loss[k], E + std::exp(log_A - alpha * std::log(b.flops[k] / unit)),
                  1e-12 * b.loss[k]);
    }
  }
  // The observations are the row's inputs; the multiplier table is the stored one.
  EXPECT_EQ(r->observations.points.size(), json::parse(row.inputs_json).size());
  EXPECT_EQ(r->observations.runs_used, 10);
  ASSERT_TRUE(r->stored_multipliers.has_value());
  const json& m = stored["multipliers"];
  EXPECT_EQ(r->stored_multipliers->reference, m["reference"].get<std::string>());
  EXPECT_DOUBLE_EQ(r->stored_multipliers->target_loss, m["target_loss"].get<double>());
  ASSERT_EQ(r->stored_multipliers->rows.size(), m["rows"].size());
  ASSERT_FALSE(m["rows"].empty());
  EXPECT_EQ(r->stored_multipliers->rows[0].ok, m["rows"][0]["ok"].get<bool>());
  if (r->stored_multipliers->rows[0].ok) {
    EXPECT_DOUBLE_EQ(r->stored_multipliers->rows[0].multiplier.estimate,
                     m["rows"][0]["multiplier"]["estimate"].get<double>());
  }
}

TEST(GuiStoredFit, OlderRowsAndRowsWithoutALawAreHandled) {
  db::FitRecord row;
  row.id = 7;
  row.form = "power";
  row.family_key = "heads";
  // Families at the top level, A instead of log_A, no ranges: the frontier gives the range.
  row.result_json = R"({"families": [{"family": "8", "params": [
      {"name": "E", "value": {"estimate": 1.5, "lo": 1.4, "hi": 1.6}},
      {"name": "A", "value": {"estimate": 2.0, "lo": null, "hi": null}},
      {"name": "alpha", "value": {"estimate": 0.3, "lo": 0.25, "hi": 0.35}}],
      "frontier": [{"run": "1", "flops": 1e12, "loss": 3.0}, {"run": "2", "flops": 1e13,
      "loss": 2.5}]}]})";
  std::string why;
  std::optional<FitResult> r = FitResultFromStored(row, &why);
  ASSERT_TRUE(r.has_value()) << why;
  const analysis::PowerLawFit& f = r->fits->Get("8");
  EXPECT_DOUBLE_EQ(f.log_A(), std::log(2.0));
  EXPECT_DOUBLE_EQ(f.min_flops, 1e12);
  EXPECT_DOUBLE_EQ(f.max_flops, 1e13);
  EXPECT_DOUBLE_EQ(f.LossAtCompute(1e15), 1.5 + 2.0);
  EXPECT_FALSE(r->stored_multipliers.has_value());

  // No alpha: nothing to draw, and the reason says so.
  row.result_json = R"({"families": [{"family": "8", "params": [{"name": "alpha",
      "value": {"estimate": 0.3}}]}]})";
  EXPECT_FALSE(FitResultFromStored(row, &why).has_value());
  EXPECT_NE(why.find("no family"), std::string::npos) << why;
  row.form = "chinchilla";
  EXPECT_FALSE(FitResultFromStored(row, &why).has_value());
  row.form = "power";
  row.result_json = "not json";
  EXPECT_FALSE(FitResultFromStored(row, &why).has_value());
  row.result_json = R"({"families": [{"family": "8", "params": 3}]})";
  EXPECT_FALSE(FitResultFromStored(row, &why).has_value());
}

// `moelab fit --all-points` on the scaling fixture (one seed: no intervals); the row and what
// the CLI printed.
struct AllPointsFit {
  db::FitRecord row;
  std::string printed;
};
AllPointsFit FitAllPoints(const std::string& db, const std::string& log) {
  testing::BuildScalingFixture(db);
  const std::string cmd = test::BinPath("moelab") + " fit --db '" + db +
                          "' --sweep heads --by heads --all-points --resamples 100 --seed 7 > '" +
                          log + "' 2>&1";
  AllPointsFit out;
  if (std::system(cmd.c_str()) != 0) return out;
  out.printed = test::Slurp(log);
  const std::vector<db::FitRecord> rows = db::ListFits(db, std::nullopt);
  if (rows.size() == 1) out.row = rows[0];
  return out;
}

TEST(GuiStoredFit, TheModelFreeTableAndTheOptionsAreTheStoredOnes) {
  // Issue 37: the view recomputed the model-free table with default options (final points
  // only, where `moelab fit --all-points` used every evaluation) and showed -nan for it.
  test::TempDir dir("moelab_gui_stored_mf");
  const AllPointsFit fit = FitAllPoints(dir / "scaling.db", dir / "fit.log");
  ASSERT_GT(fit.row.id, 0) << fit.printed;
  std::string why;
  const std::optional<FitResult> r = FitResultFromStored(fit.row, &why);
  ASSERT_TRUE(r.has_value()) << why;
  EXPECT_TRUE(r->options_stored);
  EXPECT_FALSE(r->options.final_only);  // --all-points
  EXPECT_EQ(r->options.bootstrap_resamples, 100);
  EXPECT_EQ(r->options.seed, 7u);
  const json stored = json::parse(fit.row.result_json)["model_free"];
  ASSERT_TRUE(r->model_free.has_value()) << r->model_free_error;
  EXPECT_EQ(r->model_free->reference, stored["reference"].get<std::string>());
  ASSERT_EQ(r->model_free->rows.size(), stored["rows"].size());
  ASSERT_FALSE(stored["rows"].empty());
  for (size_t i = 0; i < stored["rows"].size(); ++i) {
    const json& want = stored["rows"][i];
    const analysis::ModelFreeRow& got = r->model_free->rows[i];
    EXPECT_EQ(got.family, want["family"].get<std::string>());
    EXPECT_DOUBLE_EQ(got.target_loss, want["target_loss"].get<double>());
    EXPECT_DOUBLE_EQ(got.flops_ratio.estimate, want["flops_ratio"]["estimate"].get<double>());
    EXPECT_TRUE(std::isnan(got.flops_ratio.lo));  // one seed: stored as null
    EXPECT_EQ(got.interval_note, want["interval_note"].get<std::string>());
  }
  // A recompute asks for exactly those options.
  const FitRequest again = RequestFromStored(*r, "x.db");
  EXPECT_EQ(again.final_only, std::optional<bool>(false));
  EXPECT_EQ(again.resamples, 100);
  EXPECT_EQ(again.seed, 7u);
  EXPECT_EQ(again.reference, r->model_free->reference);
  EXPECT_EQ(again.target_losses, r->model_free->targets);
  EXPECT_EQ(again.family_key, "heads");
  // ... and computes the stored table again (same data, options and bootstrap seed).
  FitRequest here = again;
  here.db_path = dir / "scaling.db";
  const FitResult recomputed = ComputeFits(here);
  ASSERT_TRUE(recomputed.model_free.has_value()) << recomputed.model_free_error;
  ASSERT_EQ(recomputed.model_free->rows.size(), r->model_free->rows.size());
  for (size_t i = 0; i < recomputed.model_free->rows.size(); ++i) {
    EXPECT_NEAR(recomputed.model_free->rows[i].flops_ratio.estimate,
                r->model_free->rows[i].flops_ratio.estimate, 1e-9);
  }
}

TEST(GuiStoredFit, AnEstimateWithoutAnIntervalSaysWhyAndNeverNan) {
  const std::string note =
      "1 seed: too few for an interval (the replicate is a seed's trunk with its branches; an "
      "interval needs >= 3)";
  EXPECT_EQ(EstimateText({0, NAN, NAN}, note), "0 (1 seed: no interval)");
  EXPECT_EQ(EstimateText({1.1494, NAN, NAN}, note, "%.3f"), "1.149 (1 seed: no interval)");
  EXPECT_EQ(EstimateText({1.1494, NAN, NAN}, ""), "1.149 (no interval)");
  EXPECT_EQ(EstimateText({1.5, 1.25, 1.75}, ""), "1.5 [1.25, 1.75]");
  EXPECT_EQ(EstimateText({NAN, NAN, NAN}, note), "none (not estimated)");
}

std::string Lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

// The FLOPs ratios `moelab fit` printed in its model-free table ("1.149" each).
std::vector<std::string> PrintedRatios(const std::string& printed) {
  std::vector<std::string> out;
  std::istringstream in(printed.substr(printed.find("Model-free (primary)")));
  std::string line;
  while (std::getline(in, line)) {
    if (line.find("Fitted law") != std::string::npos) break;
    std::istringstream words(line);
    std::string target, family, seeds, ratio;
    if (!(words >> target >> family >> seeds >> ratio)) continue;
    if (target.empty() || !std::isdigit(static_cast<unsigned char>(target[0]))) continue;
    out.push_back(ratio);
  }
  return out;
}

TEST(GuiStoredFit, TheScalingViewShowsWhatMoelabFitPrinted) {
  if (!testing::HaveXvfb()) GTEST_SKIP() << "xvfb-run not installed (apt-get install xvfb xauth)";
  test::TempDir dir("moelab_gui_stored_view");
  const AllPointsFit fit = FitAllPoints(dir / "scaling.db", dir / "fit.log");
  ASSERT_GT(fit.row.id, 0) << fit.printed;
  const std::vector<std::string> ratios = PrintedRatios(fit.printed);
  ASSERT_FALSE(ratios.empty()) << fit.printed;
  // Tall enough that every table of the right-hand pane is on screen (text scrolled out of a
  // window is not drawn, so not in the dump).
  const std::string text =
      testing::ViewText(dir / "scaling.db", "--view scaling", dir / "view.log", "1280x1600");
  ASSERT_FALSE(text.empty()) << test::Slurp(dir / "view.log");
  for (const std::string& r : ratios) {
    EXPECT_NE(text.find(r + " (1 seed: no interval)"), std::string::npos)
        << "the CLI's model-free ratio " << r << " is not shown as stored:\n"
        << text;
  }
  EXPECT_EQ(Lower(text).find("nan"), std::string::npos) << text;
  EXPECT_EQ(text.find("CLIPPED"), std::string::npos) << text;
  // The options the row was made with, and no refit.
  EXPECT_NE(text.find("100 bootstrap resamples (seed 7)"), std::string::npos) << text;
  EXPECT_NE(text.find("every evaluation (pre-decay points included, --all-points)"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("Stored fit #"), std::string::npos) << text;
  EXPECT_EQ(text.find("fitted in"), std::string::npos) << text;
  // The picture of it (docs/images/gui-scaling-stored-all-points.png when refreshing docs).
  const std::string png = dir / "stored.png";
  ASSERT_EQ(
      testing::RunGuiScript(dir / "scaling.db", "wait-settled 120\nscreenshot " + png + "\nquit\n",
                            dir / "shot.log", "--view scaling"),
      0)
      << test::Slurp(dir / "shot.log");
  EXPECT_EQ(testing::LoadPng(png).w, 1280);
  testing::CopyToDocs(png, "scaling-stored-all-points.png");
}

TEST(GuiStoredFit, ARunEndingAfterTheFitIsSaidNotRefitted) {
  // The view used to refit (with its own defaults) as soon as a run ended after the stored fit;
  // now it keeps the stored result, says how many runs are newer, and refits only on request.
  if (!testing::HaveXvfb()) GTEST_SKIP() << "xvfb-run not installed (apt-get install xvfb xauth)";
  test::TempDir dir("moelab_gui_stored_stale");
  const AllPointsFit fit = FitAllPoints(dir / "scaling.db", dir / "fit.log");
  ASSERT_GT(fit.row.id, 0) << fit.printed;
  {
    db::Connection c = db::OpenForWrite(dir / "scaling.db");
    c.Exec("UPDATE runs SET ended_at = 4e9 WHERE id IN (1, 2)");
  }
  const std::string text =
      testing::ViewText(dir / "scaling.db", "--view scaling", dir / "view.log", "1280x1600");
  ASSERT_FALSE(text.empty()) << test::Slurp(dir / "view.log");
  EXPECT_NE(text.find("2 finished runs ended after this fit: Recompute to include them."),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("Stored fit #"), std::string::npos) << text;
  EXPECT_EQ(text.find("fitted in"), std::string::npos) << text;
  EXPECT_EQ(Lower(text).find("nan"), std::string::npos) << text;
}

}  // namespace
}  // namespace moelab::gui
