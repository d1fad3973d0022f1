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
#include <thread>

#include "db/reader.h"
#include "db/schema.h"
#include "tests/common/test_util.h"

namespace moelab {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

using test::Slurp;
using test::Wait;

// Starts `moelab args...` with stdout/stderr to log; returns the pid.
pid_t Spawn(const std::vector<std::string>& args, const std::string& log) {
  std::vector<std::string> argv = {"moelab"};
  argv.insert(argv.end(), args.begin(), args.end());
  return test::Spawn(argv, log);
}

class CliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    tmp_ = std::make_unique<test::TempDir>("cli");
    dir_ = tmp_->path();
    db_ = (dir_ / "runs.db").string();
  }
  void TearDown() override { tmp_.reset(); }  // kept when the test failed

  std::string WriteConfig(int steps, json extra = json::object()) {
    json c = {{"model",
               {{"vocab_size", 64},
                {"d_model", 32},
                {"layers", 2},
                {"heads", 2},
                {"ffn_hidden", 64},
                {"seq_len", 32}}},
              {"moe", {{"experts_total", 4}, {"experts_active", 2}, {"expert_hidden", 32}}},
              {"data", {{"source", "markov"}}},
              {"train", {{"batch_size", 4}, {"steps", steps}, {"threads", 1}}},
              {"schedule", {{"warmup_steps", 2}}},
              {"eval", {{"every", 10}, {"batches", 1}}},
              {"checkpoint", {{"every", 10}, {"dir", (dir_ / "ckpt").string()}}}};
    c.merge_patch(extra);
    const std::string path = (dir_ / "run.json").string();
    std::ofstream(path) << c.dump(2);
    return path;
  }
  std::string Log() const { return (dir_ / "log.txt").string(); }

  std::unique_ptr<test::TempDir> tmp_;
  fs::path dir_;
  std::string db_;
};

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
    c.Exec("ALTER TABLE steps DROP COLUMN norm_gain_rms");
    c.Exec("DROP INDEX runs_uuid");
    c.Exec("ALTER TABLE runs DROP COLUMN uuid");
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

}  // namespace
}  // namespace moelab
