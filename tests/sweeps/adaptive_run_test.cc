// `moelab sweep run --adaptive` end to end on tiny runs: the sweep is killed with -9 in the
// middle of its first batch and resumed by name; the resumed sweep finishes that batch (its runs
// continue, nothing is trained twice), looks, and goes on choosing from the same database.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "db/reader.h"
#include "db/schema.h"
#include "sweeps/adaptive_store.h"
#include "tests/cli/cli_fixture.h"
#include "tests/common/test_util.h"

namespace moelab {
namespace {

using nlohmann::json;
using test::Slurp;
using test::Wait;

class AdaptiveRunTest : public CliTest {
 protected:
  AdaptiveRunTest() : CliTest("adaptive") {}

  json Spec(double budget) {
    json base = test::TinyRunConfig((dir_ / "ckpt").string(), 40, 5, /*slow=*/true);
    base["schedule"] = {{"type", "wsd"}, {"warmup_steps", 2}, {"decay_fraction", 0.25}};
    return {{"name", "adaptive"},
            {"base", base},
            {"grid", {{"moe.experts_total", {4, 8}}, {"train.steps", {10, 20, 30, 40}}}},
            {"seeds", {1, 2, 3, 4}},
            {"adaptive",
             {{"estimand",
               {{"key", "moe.experts_total"}, {"arm", 8}, {"reference", 4}, {"target_loss", 2.1}}},
              {"budget", {{"flops", budget}}},
              {"stop", {{"width", 0.01}}},
              {"min_seeds", 2}}}};
  }
};

TEST_F(AdaptiveRunTest, KillNineMidBatchResumesItsOwnChoices) {
  const std::string spec = (dir_ / "spec.json").string();
  std::ofstream(spec) << Spec(3.2e10).dump(2);  // two batches: seed 1 explores, seed 2 follows
  // The plan names the first batch and the bound without training anything.
  ASSERT_EQ(Wait(Spawn({"sweep", "plan", spec, "--no-calibrate"}, Log("plan.txt"))), 0)
      << Slurp(Log("plan.txt"));
  EXPECT_NE(Slurp(Log("plan.txt")).find("first batch: 8 runs"), std::string::npos)
      << Slurp(Log("plan.txt"));

  const pid_t sweep =
      Spawn({"sweep", "run", spec, "--adaptive", "--db", db_, "-j", "2", "-t", "1"}, Log());
  // Kill once a trainer of the first batch has checkpointed a few steps.
  bool running = false;
  for (int i = 0; i < 3000 && !running; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    try {
      if (!std::filesystem::exists(db_)) continue;
      for (const auto& r : db::Reader(db_).ListRuns()) running |= r.last_step >= 6;
    } catch (const std::exception&) {
    }
  }
  ASSERT_TRUE(running) << Slurp(Log());
  ::kill(sweep, SIGKILL);
  EXPECT_EQ(Wait(sweep), 128 + SIGKILL);
  std::vector<sweeps::AdaptiveBatchRow> before;
  {
    db::Connection c = db::OpenForWrite(db_);
    before = sweeps::AdaptiveStore(c).Batches(1);
    ASSERT_EQ(before.size(), 1u);  // recorded before its runs started
    EXPECT_EQ(before[0].runs.size(), 8u);
    EXPECT_TRUE(sweeps::AdaptiveStore(c).Looks(1).empty());
  }
  ASSERT_EQ(Wait(Spawn({"sweep", "resume", "adaptive", "--db", db_, "-j", "2", "-t", "1"},
                       Log("resume.txt"))),
            0)
      << Slurp(Log("resume.txt"));
  const std::string out = Slurp(Log("resume.txt"));
  EXPECT_NE(out.find("look 1:"), std::string::npos) << out;

  db::Connection c = db::OpenForWrite(db_);
  sweeps::AdaptiveStore store(c);
  const auto batches = store.Batches(1);
  const auto looks = store.Looks(1);
  ASSERT_GE(batches.size(), 1u);
  EXPECT_EQ(batches[0].runs, before[0].runs);  // the resumed sweep kept its own first choice
  EXPECT_EQ(looks.size(), batches.size());     // every batch looked at once
  EXPECT_NE(looks.back().decision, "continue");
  // Seed 1 explored the ladder, seed 2 followed on the rungs where seed 1 crossed L* = 2.1 (the
  // tiny runs' final losses fall from ≈ 2.6 at 10 steps to ≈ 1.9 at 40), then the budget ended it.
  ASSERT_EQ(batches.size(), 2u) << out;
  EXPECT_LT(batches[1].runs.size(), 8u) << out;
  EXPECT_NE(looks.back().decision.find("budget is spent"), std::string::npos) << out;
  // Every chosen run trained exactly once, no other run trained, every step recorded once.
  std::set<int> chosen;
  for (const auto& b : batches) chosen.insert(b.runs.begin(), b.runs.end());
  db::Reader reader(db_);
  const auto runs = reader.ListRuns();
  EXPECT_EQ(runs.size(), chosen.size());
  std::set<std::string> hashes;
  for (const auto& r : runs) {
    EXPECT_EQ(r.status, RunStatus::kDone) << r.name;
    EXPECT_TRUE(hashes.insert(r.config_hash).second) << "trained twice: " << r.name;
    const db::Series loss = reader.GetSeries(r.id, "loss");
    ASSERT_EQ(static_cast<int64_t>(loss.steps.size()), r.shape.total_steps) << r.name;
    for (size_t i = 0; i < loss.steps.size(); ++i) EXPECT_EQ(loss.steps[i], int64_t(i + 1));
  }
  // Resuming a finished adaptive sweep trains nothing more.
  ASSERT_EQ(Wait(Spawn({"sweep", "resume", "adaptive", "--db", db_}, Log("again.txt"))), 0)
      << Slurp(Log("again.txt"));
  EXPECT_EQ(db::Reader(db_).ListRuns().size(), runs.size());
  EXPECT_EQ(store.Batches(1).size(), batches.size());
}

}  // namespace
}  // namespace moelab
