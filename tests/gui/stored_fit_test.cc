// The Scaling view draws a fit `moelab fit` stored without refitting (issue 14): the row the
// real CLI writes is turned into the view's FitResult (curves from the stored parameters, the
// observations and the multiplier table; no bands, since the bootstrap draws are not stored).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>

#include "db/fits.h"
#include "gui/fits.h"
#include "tests/common/test_util.h"
#include "tests/gui/fixture.h"

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

}  // namespace
}  // namespace moelab::gui
