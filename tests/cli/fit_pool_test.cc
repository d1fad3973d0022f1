// `moelab fit` and `moelab promote` on a sparsity × heads sweep (issue 37.2): a family is the
// runs that share every swept key but the fitted one, so neither silently pools the heads;
// --where fits one arm, --pool pools on purpose; a single family's verdict says why there is no
// model-free estimate (issue 39).
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>

#include "db/fits.h"
#include "db/schema.h"
#include "db/writer.h"
#include "tests/common/test_util.h"

namespace moelab {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

using test::RunCapture;

#define EXPECT_HAS(haystack, needle) \
  EXPECT_NE(std::string(haystack).find(needle), std::string::npos) << (haystack)

class FitPoolTest : public ::testing::Test {
 protected:
  void SetUp() override {
    db_ = (tmp_.path() / "pool.db").string();
    int64_t sweep_id = 0;
    {
      db::Connection c = db::OpenForWrite(db_);
      c.Exec("INSERT INTO sweeps (name, created_at) VALUES ('sh', 0)");
      sweep_id = c.last_insert_rowid();
    }
    std::mt19937_64 rng(3);
    std::normal_distribution<double> noise(0.0, 0.002);
    // Sparsity × heads at one width (same active parameters), 3 seeds, 4 budgets per trunk.
    for (int s : {8, 48})
      for (int h : {2, 4})
        for (int seed : {1, 2, 3})
          for (int steps : {100, 200, 400, 800}) {
            db::RunInfo info;
            info.name = fmt::format("s{}-h{}-seed{}-{}", s, h, seed, steps);
            info.config_json = json{{"moe", {{"experts_total", 8 * s}, {"experts_active", 8}}},
                                    {"model", {{"heads", h}}},
                                    {"train", {{"seed", seed}, {"steps", steps}}}}
                                   .dump();
            info.config_hash = info.name;
            info.sweep_id = sweep_id;
            info.shape.params_active = 1000000;
            auto w = db::RunWriter::Create(db_, info);
            db::RunWriter::SetRunVar(db_, w->run_id(), "sparsity", std::to_string(s));
            db::RunWriter::SetRunVar(db_, w->run_id(), "model.heads", std::to_string(h));
            db::RunWriter::SetRunVar(db_, w->run_id(), "train.seed", std::to_string(seed));
            db::RunWriter::SetRunVar(db_, w->run_id(), "train.steps", std::to_string(steps));
            const double flops = 1e12 * steps;
            const double loss = (1.8 + 2.0 * std::pow(flops / 1e15, -0.3) * std::pow(s, -0.05) *
                                           (h == 4 ? 0.99 : 1.0)) *
                                std::exp(noise(rng));
            w->OnEval(steps, steps * 1000, flops, loss);
            w->OnEnd(RunStatus::kDone, "");
          }
  }

  std::string Moelab(const std::string& args, int* code) {
    return RunCapture(test::BinPath("moelab") + " " + args + " 2>&1", code);
  }
  // `moelab COMMAND --db DB --sweep sh ARGS`: every test reads the one sweep of SetUp.
  std::string OnSweep(const std::string& command, const std::string& args, int* code) {
    return Moelab(command + " --db " + db_ + " --sweep sh " + args, code);
  }

  test::TempDir tmp_{"fitpool"};
  std::string db_;
};

TEST_F(FitPoolTest, FitRefusesToPoolAnotherSweptKeyNamingEveryFamily) {
  int code = 0;
  const std::string out = OnSweep("fit", "--by sparsity", &code);
  EXPECT_EQ(code, 1) << out;
  EXPECT_HAS(out, "2 of 2 families by 'sparsity'");
  EXPECT_HAS(out, "sparsity=8: its runs differ in model.heads");
  EXPECT_HAS(out, "sparsity=48: its runs differ in model.heads");
  EXPECT_HAS(out, "--pool model.heads");
  EXPECT_TRUE(db::ListFits(db_, std::nullopt).empty());
  // The heads form pooled the sparsities (its "equal FLOPs" then mixed them): refused too.
  const std::string heads =
      OnSweep("fit", "--by model.heads --form heads --base 2 --treatment 4", &code);
  EXPECT_EQ(code, 1) << heads;
  EXPECT_HAS(heads, "model.heads=2: its runs differ in sparsity");
}

TEST_F(FitPoolTest, WhereFitsOneArmAndPoolPoolsOnPurpose) {
  int code = 0;
  const std::string one =
      OnSweep("fit", "--by sparsity --where model.heads=2 --resamples 100 --no-store", &code);
  ASSERT_EQ(code, 0) << one;
  EXPECT_HAS(one, "24 runs, 24 evaluation points");
  EXPECT_HAS(one, "only runs with model.heads=2");
  EXPECT_HAS(one, "verdict rests on: model-free");
  const std::string pooled =
      OnSweep("fit", "--by sparsity --pool model.heads --resamples 100", &code);
  ASSERT_EQ(code, 0) << pooled;
  EXPECT_HAS(pooled, "pooled on purpose: model.heads");
  const auto fits = db::ListFits(db_, std::nullopt);
  ASSERT_EQ(fits.size(), 1u);
  EXPECT_EQ(json::parse(fits[0].options_json)["pool"], json::array({"model.heads"}));
}

TEST_F(FitPoolTest, PromoteRefusesAFitThatPooledAnotherSweptKey) {
  int code = 0;
  const std::string pooled =
      OnSweep("fit", "--by sparsity --pool model.heads --resamples 100", &code);
  ASSERT_EQ(code, 0) << pooled;
  // A fit stored without saying it pooled (as every fit before --pool did): promote refuses.
  db::FitRecord old = db::ListFits(db_, std::nullopt).front();
  json options = json::parse(old.options_json);
  options.erase("pool");
  old.options_json = options.dump();
  db::SaveFit(db_, old);
  const std::string out =
      OnSweep("promote", "--family sparsity=8 --budget-flops 2e15 --plan-only", &code);
  EXPECT_NE(code, 0) << out;
  EXPECT_HAS(out, "moelab promote");
  EXPECT_HAS(out, "sparsity=8: its runs differ in model.heads");
}

TEST_F(FitPoolTest, OneFamilyVerdictNamesWhyThereIsNoModelFreeEstimate) {
  int code = 0;
  const std::string out = OnSweep(
      "fit", "--by sparsity --where model.heads=2 --where sparsity=8 --resamples 100 --no-store",
      &code);
  ASSERT_EQ(code, 0) << out;
  EXPECT_EQ(out.find("no model-free estimate: )"), std::string::npos) << out;
  EXPECT_HAS(out, "verdict rests on: fitted law (no model-free estimate: one family (sparsity=8)");
}

}  // namespace
}  // namespace moelab
