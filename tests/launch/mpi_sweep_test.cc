// A sweep with "ranks": 2 end to end through the real mpirun (--oversubscribe as needed, Open
// MPI's root variables set by the launcher): one run row per distributed run with its layout,
// every step recorded once, and dedupe against an earlier single-process run of the same config.
#include <gtest/gtest.h>

#include "db/reader.h"
#include "db/schema.h"
#include "sweeps/launch.h"
#include "tests/launch/fixture.h"

namespace moelab::sweeps {
namespace {

TEST_F(LaunchRunTest, TwoRankSweepRunsAndDedupesAgainstAnEarlierRun) {
  if (!BuildHasMpi()) GTEST_SKIP() << "built without MPI";
  if (FindOnPath("mpirun").empty()) GTEST_SKIP() << "mpirun not on PATH (openmpi-bin)";
  ojson spec = Spec(R"({"name": "single", "seeds": [1]})");
  spec["base"] = Base(8);
  spec["base"]["checkpoint"] = {{"dir", (dir_ / "ckpt").string()}, {"every", 4}};
  const std::string log = (dir_ / "log.txt").string();
  ASSERT_EQ(Moelab({"sweep", "run", WriteSpec(spec), "--db", db_, "-t", "1", "--no-live"}, log), 0)
      << Slurp(log);
  // The same config at 2 ranks is the same run (reused); the new seed trains on 2 ranks.
  spec["name"] = "wide";
  spec["ranks"] = 2;
  spec["seeds"] = {1, 2};
  ASSERT_EQ(
      Moelab({"sweep", "run", WriteSpec(spec), "--db", db_, "-j", "2", "-t", "1", "--no-live"},
             log),
      0)
      << Slurp(log) << Slurp((dir_ / "runs.db.sweeps" / "wide" / "logs" / "run2.log").string());
  EXPECT_HAS(Slurp(log), "2 done (1 reused");
  EXPECT_HAS(Slurp(log), "(2 ranks)");
  db::Reader reader(db_);
  const auto runs = reader.ListRuns();
  ASSERT_EQ(runs.size(), 2u);
  for (const auto& r : runs) {
    EXPECT_EQ(r.status, RunStatus::kDone) << r.name << r.error;
    const db::Series loss = reader.GetSeries(r.id, "loss");
    EXPECT_EQ(static_cast<int64_t>(loss.steps.size()), r.shape.total_steps) << r.name;
  }
  db::Connection c = db::OpenForRead(db_);
  EXPECT_EQ(c.QueryInt("SELECT COUNT(*) FROM steps"), 16);  // nothing recorded twice
  EXPECT_EQ(c.QueryInt("SELECT ranks FROM runs WHERE id = " + std::to_string(runs[1].id)), 2);
  EXPECT_EQ(c.QueryInt("SELECT ranks FROM runs WHERE id = " + std::to_string(runs[0].id)), 1);
  EXPECT_EQ(c.QueryInt("SELECT COUNT(*) FROM sweep_runs"), 3);  // run 1 is in both sweeps
  // sweep status shows each run's rank count.
  ASSERT_EQ(Moelab({"sweep", "status", "wide", "--db", db_}, log), 0) << Slurp(log);
  EXPECT_HAS(Slurp(log), "ranks fails");
  EXPECT_HAS(Slurp(log), "2     0  ");
}

}  // namespace
}  // namespace moelab::sweeps
