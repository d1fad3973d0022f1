#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "core/device.h"
#include "db/reader.h"
#include "db/schema.h"
#include "tests/cli/cli_fixture.h"
#include "tests/common/test_util.h"
#include "tests/db/schema_rollback.h"

namespace moelab {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

using test::Slurp;
using test::Wait;

TEST_F(CliTest, ConfigErrorExitsTwoBeforeAnythingRuns) {
  const std::string cfg = WriteConfig(10, {{"model", {{"head", 3}}}});
  EXPECT_EQ(Wait(Spawn({"train", cfg, "--db", db_}, Log())), 2);
  const std::string log = Slurp(Log());
  EXPECT_NE(log.find("model.head"), std::string::npos) << log;
  EXPECT_NE(log.find("did you mean 'model.heads'"), std::string::npos) << log;
  EXPECT_FALSE(fs::exists(db_));
  EXPECT_EQ(
      Wait(Spawn({"train", WriteConfig(10), "--db", db_, "--set", "moe.experts_active=9"}, Log())),
      2);
  EXPECT_NE(Slurp(Log()).find("moe.experts_active"), std::string::npos);
}

TEST_F(CliTest, TrainsAndRecords) {
  ASSERT_EQ(Wait(Spawn({"train", WriteConfig(20), "--db", db_, "--name", "t1"}, Log())), 0)
      << Slurp(Log());
  db::Reader reader(db_);
  const auto runs = reader.ListRuns();
  ASSERT_EQ(runs.size(), 1u);
  EXPECT_EQ(runs[0].name, "t1");
  EXPECT_EQ(runs[0].effective_status, RunStatus::kDone);
  EXPECT_EQ(runs[0].last_step, 20);
  EXPECT_EQ(reader.GetSeries(runs[0].id, "loss").steps.size(), 20u);
  EXPECT_EQ(reader.GetSeries(runs[0].id, "val_loss").steps.size(), 2u);
  auto m = reader.GetMaxLogitMatrix(runs[0].id);
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->layers, 2);
  EXPECT_EQ(m->heads, 2);
  EXPECT_EQ(reader.GetExpertLoads(runs[0].id).steps.size(), 20u);
  // The build it ran on is recorded, as `moelab --version` names it.
  const std::string commit = reader.RunVars(runs[0].id)["build.commit"];
  EXPECT_FALSE(commit.empty());
  ASSERT_EQ(Wait(Spawn({"--version"}, Log())), 0);
  EXPECT_EQ(Slurp(Log()), "moelab " + commit + "\n");
  // --resume of a finished run does nothing.
  EXPECT_EQ(Wait(Spawn({"train", WriteConfig(20), "--db", db_, "--resume"}, Log())), 0);
  EXPECT_EQ(db::Reader(db_).ListRuns().size(), 1u);
}

// A database of an older schema: readers refuse it and name the command that upgrades it, and
// that command exists and works (the message once named a command that did not).
TEST_F(CliTest, OlderSchemaIsRefusedByReadersAndMigratedOnRequest) {
  ASSERT_EQ(Wait(Spawn({"train", WriteConfig(4), "--db", db_}, Log())), 0) << Slurp(Log());
  {  // Roll the file back to schema 5 (before steps.norm_gain_rms and runs.uuid).
    db::Connection c(db_, SQLITE_OPEN_READWRITE);
    db::test_schema::RollBackToSchema6(c);
    c.Exec("ALTER TABLE steps DROP COLUMN norm_gain_rms");
    c.Exec("PRAGMA user_version = 5");
  }
  EXPECT_NE(Wait(Spawn({"db", "runs", "--db", db_}, Log())), 0);
  EXPECT_NE(Slurp(Log()).find("`moelab db migrate --db"), std::string::npos) << Slurp(Log());
  ASSERT_EQ(Wait(Spawn({"db", "migrate", "--db", db_}, Log())), 0) << Slurp(Log());
  EXPECT_NE(Slurp(Log()).find("schema version 5 -> " + std::to_string(db::SchemaVersion())),
            std::string::npos)
      << Slurp(Log());
  ASSERT_EQ(Wait(Spawn({"db", "runs", "--db", db_}, Log())), 0) << Slurp(Log());
  db::Reader reader(db_);
  EXPECT_EQ(reader.ListRuns().size(), 1u);
  EXPECT_EQ(reader.GetSeries(reader.ListRuns()[0].id, "loss").steps.size(), 4u);
}

TEST_F(CliTest, DivergenceExitsThreeAndIsRecorded) {
  const std::string cfg =
      WriteConfig(300, {{"optimizer", {{"lr", 1e6}, {"grad_clip", 0}}},
                        {"schedule", {{"type", "constant"}, {"warmup_steps", 0}}}});
  EXPECT_EQ(Wait(Spawn({"train", cfg, "--db", db_}, Log())), 3) << Slurp(Log());
  EXPECT_NE(Slurp(Log()).find("DIVERGED"), std::string::npos);
  const auto runs = db::Reader(db_).ListRuns();
  ASSERT_EQ(runs.size(), 1u);
  EXPECT_EQ(runs[0].status, RunStatus::kDiverged);
  ASSERT_TRUE(runs[0].diverged_step.has_value());
  EXPECT_LT(*runs[0].diverged_step, 300);
}

// kill -9 mid-run while a reader polls: the database stays intact, the run shows as failed once
// its heartbeat is stale, and --resume finishes it with every step recorded exactly once.
TEST_F(CliTest, KillNineLeavesIntactDatabaseAndResumes) {
  const std::string cfg = WriteConfig(3000, {{"checkpoint", {{"every", 100}}}});
  const pid_t pid = Spawn({"train", cfg, "--db", db_, "--no-progress"}, Log());
  int64_t seen = 0;
  int polls = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (seen < 25 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    if (!fs::exists(db_)) continue;
    try {
      db::Reader reader(db_);  // a fresh read-only connection each poll, like a GUI restart
      for (const auto& r : reader.ListRuns()) seen = r.last_step;
      ++polls;
    } catch (const std::exception& e) {
      // The schema may not exist for the first few milliseconds; anything else is a failure.
      ASSERT_NE(std::string(e.what()).find("not a moelab database"), std::string::npos) << e.what();
    }
  }
  ASSERT_GE(seen, 25) << Slurp(Log());
  kill(pid, SIGKILL);
  EXPECT_EQ(Wait(pid), 128 + SIGKILL);
  EXPECT_GE(polls, 1);  // the reader really read while the trainer wrote
  EXPECT_EQ(db::IntegrityCheck(db_), "ok");
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  {
    db::Reader reader(db_);
    const auto runs = reader.ListRuns(/*stale_after_s=*/1.0);
    ASSERT_EQ(runs.size(), 1u);
    EXPECT_EQ(runs[0].status, RunStatus::kRunning);
    EXPECT_EQ(runs[0].effective_status, RunStatus::kFailed);
    EXPECT_TRUE(runs[0].stale);
  }
  ASSERT_EQ(Wait(Spawn({"train", cfg, "--db", db_, "--resume", "--no-progress"}, Log())), 0)
      << Slurp(Log());
  EXPECT_NE(Slurp(Log()).find("resuming run 1"), std::string::npos) << Slurp(Log());
  db::Reader reader(db_);
  const auto runs = reader.ListRuns();
  ASSERT_EQ(runs.size(), 1u);
  EXPECT_EQ(runs[0].effective_status, RunStatus::kDone);
  const db::Series loss = reader.GetSeries(runs[0].id, "loss");
  ASSERT_EQ(loss.steps.size(), 3000u);
  for (size_t i = 0; i < loss.steps.size(); ++i) EXPECT_EQ(loss.steps[i], int64_t(i + 1));
  EXPECT_EQ(db::IntegrityCheck(db_), "ok");
}

// Bring-your-own data, end to end through the binary: a JSON Lines file (gzip) prepared with
// a chosen text field, and an llm.c token shard imported in place, each trains a run.
TEST_F(CliTest, JsonLinesCorpusTrainsARun) {
  {
    std::ofstream f(dir_ / "docs.jsonl");
    const char* words[] = {"sparse", "experts", "route", "tokens", "to", "a", "few", "heads"};
    for (int i = 0; i < 1500; ++i) {
      std::string d;
      for (int w = 0; w < 4 + i % 9; ++w) d += std::string(w ? " " : "") + words[(i + 3 * w) % 8];
      f << json{{"meta", {{"id", i}}}, {"body", d}}.dump() << "\n";
    }
  }
  ASSERT_EQ(std::system(("gzip -f " + (dir_ / "docs.jsonl").string()).c_str()), 0);
  const std::string data = (dir_ / "data").string();
  ASSERT_EQ(Wait(Spawn({"data", "prepare", "--input", (dir_ / "docs.jsonl.gz").string(),
                        "--text-field", "body", "--vocab", "300", "--out", data},
                       Log())),
            0)
      << Slurp(Log());
  EXPECT_NE(Slurp(Log()).find("MB/s"), std::string::npos) << Slurp(Log());
  const std::string cfg = WriteConfig(
      12, {{"model", {{"vocab_size", 300}}}, {"data", {{"source", "corpus"}, {"path", data}}}});
  ASSERT_EQ(Wait(Spawn({"train", cfg, "--db", db_}, Log())), 0) << Slurp(Log());
  db::Reader reader(db_);
  const auto runs = reader.ListRuns();
  ASSERT_EQ(runs.size(), 1u);
  EXPECT_EQ(runs[0].effective_status, RunStatus::kDone);
  EXPECT_EQ(reader.GetSeries(runs[0].id, "loss").steps.size(), 12u);
  EXPECT_EQ(reader.GetSeries(runs[0].id, "val_loss").steps.size(), 2u);  // steps 10 and 12
}

TEST_F(CliTest, LlmcShardTrainsARun) {
  // A periodic token stream over 64 tokens in llm.c's format (header of 256 int32), imported.
  const std::string data = ImportedData(20000);
  ASSERT_FALSE(HasFailure());
  const std::string cfg = WriteConfig(20, {{"data", {{"source", "corpus"}, {"path", data}}}});
  ASSERT_EQ(Wait(Spawn({"train", cfg, "--db", db_}, Log())), 0) << Slurp(Log());
  db::Reader reader(db_);
  const auto runs = reader.ListRuns();
  ASSERT_EQ(runs.size(), 1u);
  EXPECT_EQ(runs[0].effective_status, RunStatus::kDone);
  const db::Series loss = reader.GetSeries(runs[0].id, "loss");
  ASSERT_EQ(loss.steps.size(), 20u);
  // The pattern is learnable: the last steps are below the first ones.
  EXPECT_LT(loss.values[17] + loss.values[18] + loss.values[19],
            loss.values[0] + loss.values[1] + loss.values[2]);
  EXPECT_EQ(reader.GetSeries(runs[0].id, "val_loss").steps.size(), 2u);
  // A model vocabulary below the shard's is refused before anything runs.
  const std::string small = WriteConfig(
      5, {{"model", {{"vocab_size", 32}}}, {"data", {{"source", "corpus"}, {"path", data}}}});
  EXPECT_EQ(Wait(Spawn({"train", small, "--db", (dir_ / "other.db").string()}, Log())), 2)
      << Slurp(Log());
}

// Per-step export: every recorded step of a run with the loss, LR and grad norm as recorded,
// S_max per head and each expert's share of its layer, as CSV and as JSON Lines.
TEST_F(CliTest, DbExportStepsWritesPerStepMetrics) {
  ASSERT_EQ(Wait(Spawn({"train", WriteConfig(12), "--db", db_, "--name", "a,\"b\""}, Log())), 0)
      << Slurp(Log());
  const std::string csv = (dir_ / "steps.csv").string(), jsonl = (dir_ / "steps.jsonl").string();
  ASSERT_EQ(Wait(Spawn({"db", "export", "--db", db_, "--steps", "-o", csv}, Log())), 0)
      << Slurp(Log());
  ASSERT_EQ(Wait(Spawn({"db", "export", "--db", db_, "--steps", "--format", "jsonl", "-o", jsonl},
                       Log())),
            0)
      << Slurp(Log());
  db::Reader reader(db_);
  const int64_t run = reader.ListRuns()[0].id;
  const db::Series loss = reader.GetSeries(run, "loss"), lr = reader.GetSeries(run, "lr");

  std::istringstream in(Slurp(csv));
  std::string line;
  std::getline(in, line);
  EXPECT_EQ(line.rfind("run_id,run_name,step,tokens,flops,loss,aux_loss,lr,grad_norm,val_loss,"
                       "max_logit,smax_l0_h0,smax_l0_h1,smax_l1_h0,smax_l1_h1,load_l0_e0,",
                       0),
            0u)
      << line;
  int rows = 0;
  while (std::getline(in, line)) {
    ++rows;
    EXPECT_EQ(line.rfind("1,\"a,\"\"b\"\"\",", 0), 0u) << line;  // quoted name
  }
  EXPECT_EQ(rows, 12);

  // CSV and JSON Lines hold the same numbers, to the last bit.
  {
    std::istringstream again(Slurp(csv));
    std::getline(again, line);
    std::getline(again, line);  // step 1
    const size_t loss_col = 5;  // run_id,run_name(quoted, holds a comma),step,tokens,flops,loss
    std::string rest = line.substr(line.find("\",") + 2);
    for (size_t c = 2; c < loss_col; ++c) rest = rest.substr(rest.find(',') + 1);
    EXPECT_EQ(std::stod(rest.substr(0, rest.find(','))), loss.values[0]) << line;
  }
  std::istringstream jl(Slurp(jsonl));
  std::vector<json> objs;
  while (std::getline(jl, line)) objs.push_back(json::parse(line));
  ASSERT_EQ(objs.size(), 12u);
  for (size_t i = 0; i < objs.size(); ++i) {
    const json& o = objs[i];
    EXPECT_EQ(o["step"], loss.steps[i]);
    EXPECT_NEAR(o["loss"].get<double>(), loss.values[i], 1e-12);
    EXPECT_NEAR(o["lr"].get<double>(), lr.values[i], 1e-15);
    EXPECT_TRUE(o["grad_norm"].is_number());
    // Evaluations every 10 steps and at the end.
    EXPECT_EQ(o["val_loss"].is_number(), loss.steps[i] == 10 || loss.steps[i] == 12) << o.dump();
    const double smax = o["max_logit"].get<double>();
    EXPECT_GE(smax, o["smax_l1_h0"].get<double>());
    double share = 0;
    for (int e = 0; e < 4; ++e) share += o[IndexedKey("load_l0_e", e)].get<double>();
    EXPECT_NEAR(share, 1.0, 1e-9);
  }
  // The run export has no jsonl, and --steps no json: both say so.
  EXPECT_NE(Wait(Spawn({"db", "export", "--db", db_, "--steps", "--format", "json"}, Log())), 0);
  EXPECT_NE(Slurp(Log()).find("csv or jsonl"), std::string::npos) << Slurp(Log());
}

// train.device "cuda" where no GPU is usable: `config check` and `sweep run` refuse it (exit 2,
// the reason named) as `moelab train` does; `sweep plan` prints the whole plan (arithmetic for
// the machine that will run it) with a warning that this one cannot (issue 37.4).
TEST_F(CliTest, CudaWithoutAGpuIsRefusedAtCheckAndRunTimeAndPlannedWithAWarning) {
  const std::string cfg = WriteConfig(5, {{"train", {{"device", "cuda"}}}});
  const std::string no_gpu = CudaSkipReason();
  const int check = Wait(Spawn({"config", "check", cfg}, Log()));
  if (!no_gpu.empty()) {
    EXPECT_EQ(check, 2) << Slurp(Log());
    EXPECT_NE(Slurp(Log()).find("train.device"), std::string::npos) << Slurp(Log());
  } else {
    EXPECT_EQ(check, 0) << Slurp(Log());  // a GPU machine: nothing to refuse
  }
  json spec = {{"name", "gpu"}, {"base", json::parse(Slurp(cfg))}, {"seeds", {1, 2}}};
  const std::string spec_path = (dir_ / "spec.json").string();
  std::ofstream(spec_path) << spec.dump(2);
  const int plan = Wait(Spawn({"sweep", "plan", spec_path, "--no-calibrate"}, Log()));
  if (!no_gpu.empty()) {
    EXPECT_EQ(plan, 0) << Slurp(Log());
    EXPECT_NE(Slurp(Log()).find("total: 2 unique runs"), std::string::npos) << Slurp(Log());
    EXPECT_NE(Slurp(Log()).find("warning: this machine cannot run 2 of the 2 unique runs"),
              std::string::npos)
        << Slurp(Log());
    EXPECT_EQ(Wait(Spawn({"sweep", "run", spec_path, "--db", db_}, Log())), 2) << Slurp(Log());
    EXPECT_FALSE(fs::exists(db_));  // nothing started
  }
}

// `sweep plan` says when `moelab fit` could not fit the design, and what fit needs.
TEST_F(CliTest, SweepPlanWarnsWhenTheDesignCannotBeFitted) {
  json base = json::parse(Slurp(WriteConfig(20)));
  json spec = {{"name", "small"},
               {"base", base},
               {"grid", {{"moe.experts_total", {4, 8}}, {"train.steps", {20, 40, 80}}}}};
  const std::string spec_path = (dir_ / "spec.json").string();
  std::ofstream(spec_path) << spec.dump(2);
  ASSERT_EQ(Wait(Spawn({"sweep", "plan", spec_path, "--no-calibrate"}, Log())), 0) << Slurp(Log());
  const std::string log = Slurp(Log());
  EXPECT_NE(log.find("warning: `moelab fit` gives no interval for 2 of 2 families and `moelab "
                     "promote` refuses them: the replicate is the seed"),
            std::string::npos)
      << log;
  EXPECT_NE(log.find("(moe.experts_total=4 has 1; moe.experts_total=8 has 1)"), std::string::npos)
      << log;
  // Three seeds per family: nothing to warn about.
  spec["grid"]["train.seed"] = {1, 2, 3};
  std::ofstream(spec_path) << spec.dump(2);
  ASSERT_EQ(Wait(Spawn({"sweep", "plan", spec_path, "--no-calibrate"}, Log())), 0) << Slurp(Log());
  EXPECT_EQ(Slurp(Log()).find("gives no interval"), std::string::npos) << Slurp(Log());
}

// Names are never cut so that two runs look the same: `db runs` and `sweep status`.
TEST_F(CliTest, LongRunNamesStayDistinguishable) {
  const std::string stem(70, 'x');
  for (const char* tail : {"-budget1e11", "-budget3e11"}) {
    ASSERT_EQ(Wait(Spawn({"train", WriteConfig(3), "--db", db_, "--name", stem + tail}, Log())), 0)
        << Slurp(Log());
  }
  ASSERT_EQ(Wait(Spawn({"db", "runs", "--db", db_}, Log())), 0) << Slurp(Log());
  const std::string log = Slurp(Log());
  EXPECT_NE(log.find("budget1e11"), std::string::npos) << log;
  EXPECT_NE(log.find("budget3e11"), std::string::npos) << log;
}

}  // namespace
}  // namespace moelab
