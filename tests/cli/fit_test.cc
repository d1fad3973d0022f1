// `moelab fit` end to end: a database with a synthetic sparsity sweep whose true FLOPs
// multiplier is known, fitted through the CLI, stored in the fits table.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
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

TEST(FitCli, RecoversKnownMultiplierAndStoresIt) {
  test::TempDir tmp("fit");
  const fs::path dir = tmp.path();
  const std::string path = (dir / "fit.db").string();
  int64_t sweep_id = 0;
  {
    db::Connection c = db::OpenForWrite(path);
    c.Exec("INSERT INTO sweeps (name, created_at) VALUES ('law', 0)");
    sweep_id = c.last_insert_rowid();
  }
  // L = E + A·(C/1e15)^-α·S^-β: C_8(L)/C_48(L) = 6^(β/α) = 1.69.
  const double E = 1.8, A = 2.0, alpha = 0.3, beta = alpha * std::log(1.69) / std::log(6.0);
  std::mt19937_64 rng(7);
  std::normal_distribution<double> noise(0.0, 0.002);
  for (int s : {8, 48}) {
    for (int size = 0; size < 5; ++size) {
      db::RunInfo info;
      info.name = "s" + std::to_string(s) + "-" + std::to_string(size);
      // One seed, five model sizes: five trunks per family (intervals over them), one seed
      // for the model-free estimate (its point only).
      info.config_json = json{{"moe", {{"experts_total", 8 * s}, {"experts_active", 8}}},
                              {"model", {{"d_model", 64 * (size + 1)}}}}
                             .dump();
      info.config_hash = info.name;
      info.sweep_id = sweep_id;
      info.shape.params_active = 1000000 * (size + 1);
      auto w = db::RunWriter::Create(path, info);
      db::RunWriter::SetRunVar(path, w->run_id(), "sparsity", std::to_string(s));
      for (int k = 1; k <= 4; ++k) {
        const double flops = 1e15 * std::pow(2.0, size * 1.5 + k * 0.4);
        const double loss =
            (E + A * std::pow(flops / 1e15, -alpha) * std::pow(s, -beta)) * std::exp(noise(rng));
        w->OnEval(k * 10, k * 1000, flops, loss);
      }
      w->OnEnd(RunStatus::kDone, "");
    }
  }
  int code = 0;
  const auto moelab = [&](const std::string& args) {
    return RunCapture(test::BinPath("moelab") + " " + args + " 2>&1", &code);
  };
  // The database fit and the fits of its export below take the same options.
  const std::string fit_options = " --by sparsity --resamples 200 --target-loss 2.2";
  const std::string out = moelab("fit --db " + path + " --sweep law" + fit_options + " --json");
  ASSERT_EQ(code, 0) << out;
  const json r = json::parse(out.substr(out.find('{')));
  const json& rows = r["multipliers"]["rows"];
  bool found = false;
  for (const json& row : rows) {
    if (row["family"] != "8") continue;
    found = true;
    ASSERT_TRUE(row["ok"].get<bool>()) << row.dump();
    const double m = row["multiplier"]["estimate"];
    EXPECT_NEAR(m, 1.69, 0.1) << row.dump();
    EXPECT_LE(row["multiplier"]["lo"].get<double>(), m);
    EXPECT_GE(row["multiplier"]["hi"].get<double>(), m);
  }
  EXPECT_TRUE(found) << out;
  // The model-free estimate is stored beside the fit and is what the verdict rests on: at
  // L* = 2.2 the seed's interpolated FLOPs ratio is close to the true 1.69; one seed gives no
  // interval (null ends).
  ASSERT_TRUE(r.contains("model_free")) << out;
  EXPECT_EQ(r["verdict_basis"].get<std::string>().rfind("model-free", 0), 0u);
  const json& mf = r["model_free"]["rows"];
  ASSERT_EQ(mf.size(), 1u) << r["model_free"].dump();
  EXPECT_EQ(mf[0]["seeds"].size(), 1u);
  EXPECT_NEAR(mf[0]["flops_ratio"]["estimate"].get<double>(), 1.69, 0.15) << mf.dump();
  EXPECT_TRUE(mf[0]["flops_ratio"]["lo"].is_null());
  EXPECT_NE(mf[0]["interval_note"].get<std::string>().find("1 seed: too few"), std::string::npos);
  const auto fits = db::ListFits(path, sweep_id);
  ASSERT_EQ(fits.size(), 1u);
  EXPECT_EQ(fits[0].form, "power");
  EXPECT_EQ(fits[0].family_key, "sparsity");
  EXPECT_TRUE(json::parse(fits[0].result_json).contains("model_free"));
  EXPECT_EQ(json::parse(fits[0].inputs_json).size(), 40u);

  // A family key no run has gives a clear error.
  const std::string bad = moelab("fit --db " + path + " --sweep law --by nothing");
  EXPECT_NE(code, 0);
  EXPECT_NE(bad.find("--by"), std::string::npos) << bad;

  // `moelab db export` + `moelab fit --inputs` reproduce the database fit exactly (same data,
  // same bootstrap seed), so a committed export checks an experiment's tables.
  const std::string exported = (dir / "law.json").string();
  const std::string ex = moelab("db export --db " + path + " --sweep law -o " + exported);
  ASSERT_EQ(code, 0) << ex;
  const std::string again = moelab("fit --inputs " + exported + fit_options + " --json");
  ASSERT_EQ(code, 0) << again;
  const json r2 = json::parse(again.substr(again.find('{')));
  EXPECT_EQ(r2["multipliers"].dump(), r["multipliers"].dump());
  EXPECT_EQ(r2["fits"]["families"].dump(), r["fits"]["families"].dump());
  EXPECT_EQ(db::ListFits(path, sweep_id).size(), 1u);  // --inputs stores nothing
  // Five model sizes per family: the numbers are read on the compute-optimal frontier and say
  // so; each size alone follows as the fixed-size (training curve) contrast (issue 35.3).
  EXPECT_EQ(r["model_free"]["estimand"], "frontier (compute-optimal)");
  ASSERT_TRUE(r2.contains("frontier")) << again;
  EXPECT_EQ(r2["frontier"]["fixed_size"].size(), 5u);
  const std::string text = moelab("fit --inputs " + exported + fit_options);
  ASSERT_EQ(code, 0) << text;
  EXPECT_NE(text.find("Model-free (primary), estimand frontier (compute-optimal)"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("Frontier composition"), std::string::npos) << text;
  EXPECT_NE(text.find("fixed size (training curve) at size 1"), std::string::npos) << text;
  const std::string csv = moelab("db export --db " + path + " --sweep law --format csv");
  ASSERT_EQ(code, 0) << csv;
  EXPECT_EQ(csv.rfind("run_id,run_name,status,config_hash,sparsity,", 0), 0u) << csv;
  EXPECT_EQ(std::count(csv.begin(), csv.end(), '\n'), 41);  // header + 40 evaluation points
}

}  // namespace
}  // namespace moelab
