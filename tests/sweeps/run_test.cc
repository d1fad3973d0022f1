// End-to-end tests of `moelab sweep`: dedupe across restarts, kill -9 of the sweep and of a
// trainer with resume, Ctrl-C, concurrent runs with a polling reader, bad specs, WSD branching,
// the Slurm script. Tiny Markov-data runs keep the whole suite well under a minute.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <thread>

#include "db/reader.h"
#include "db/schema.h"
#include "sweeps/slurm.h"
#include "sweeps/spec.h"
#include "tests/cli/cli_fixture.h"
#include "tests/common/test_util.h"

namespace moelab {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using Clock = std::chrono::steady_clock;

using test::Slurp;
using test::Wait;

class SweepRunTest : public CliTest {
 protected:
  SweepRunTest() : CliTest("sweep") {}

  json Base(int steps, int ckpt_every = 10, bool slow = false) {
    return test::TinyRunConfig((dir_ / "ckpt").string(), steps, ckpt_every, slow);
  }
  std::string WriteSpec(const json& spec, const std::string& file = "spec.json") {
    const std::string path = (dir_ / file).string();
    std::ofstream(path) << spec.dump(2);
    return path;
  }
  int Sweep(const std::vector<std::string>& args, const std::string& log = "") {
    std::vector<std::string> a = {"sweep"};
    a.insert(a.end(), args.begin(), args.end());
    return Wait(Spawn(a, log.empty() ? Log() : log));
  }

  // Every run of the database is done and recorded each of its steps exactly once.
  void ExpectAllDoneOnce(size_t expected_runs) {
    db::Reader reader(db_);
    const auto runs = reader.ListRuns();
    ASSERT_EQ(runs.size(), expected_runs);
    std::set<std::string> hashes;
    for (const auto& r : runs) {
      EXPECT_EQ(r.status, RunStatus::kDone) << r.name << ": " << r.error;
      EXPECT_TRUE(hashes.insert(r.config_hash).second) << "duplicate run of " << r.name;
      const db::Series loss = reader.GetSeries(r.id, "loss");
      ASSERT_EQ(static_cast<int64_t>(loss.steps.size()), r.shape.total_steps) << r.name;
      for (size_t i = 0; i < loss.steps.size(); ++i) EXPECT_EQ(loss.steps[i], int64_t(i + 1));
      EXPECT_EQ(r.last_step, r.shape.total_steps);
    }
  }

  // Waits until some run of the database is running at step >= step; returns its row.
  std::optional<db::RunRow> WaitForStep(int64_t step, double timeout_s = 30) {
    const auto deadline = Clock::now() + std::chrono::duration<double>(timeout_s);
    while (Clock::now() < deadline) {
      if (fs::exists(db_)) {
        try {
          db::Reader reader(db_);
          for (const auto& r : reader.ListRuns())
            if (r.status == RunStatus::kRunning && r.last_step >= step && r.pid) return r;
        } catch (const std::exception&) {
          // The file may be mid-creation.
        }
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(30));
    }
    return std::nullopt;
  }

  int64_t SqlInt(const std::string& sql) {
    db::Connection c = db::OpenForRead(db_);
    return c.QueryInt(sql);
  }
};

TEST_F(SweepRunTest, DedupeAcrossRestartsAndGrowingSpec) {
  json spec = {{"name", "dedupe"}, {"base", Base(12)}, {"seeds", {1, 2}}};
  ASSERT_EQ(Sweep({"run", WriteSpec(spec), "--db", db_, "-j", "2", "-t", "1"}), 0) << Slurp(Log());
  ExpectAllDoneOnce(2);
  // The same sweep again: nothing retrained, nothing duplicated.
  ASSERT_EQ(Sweep({"run", WriteSpec(spec), "--db", db_}), 0) << Slurp(Log());
  EXPECT_NE(Slurp(Log()).find("2 done (2 reused"), std::string::npos) << Slurp(Log());
  ExpectAllDoneOnce(2);
  // A third seed adds exactly one run; vars are recorded.
  spec["seeds"] = {1, 2, 3};
  ASSERT_EQ(Sweep({"run", WriteSpec(spec), "--db", db_}), 0) << Slurp(Log());
  ExpectAllDoneOnce(3);
  db::Reader reader(db_);
  const auto runs = reader.ListRuns();
  EXPECT_EQ(reader.RunVars(runs[2].id).at("train.seed"), "3");
  EXPECT_EQ(SqlInt("SELECT COUNT(*) FROM sweeps"), 1);
  EXPECT_EQ(SqlInt("SELECT COUNT(*) FROM sweep_runs"), 3);
  // --rerun trains a new run next to the done one.
  spec["seeds"] = {1};
  ASSERT_EQ(Sweep({"run", WriteSpec(spec), "--db", db_, "--rerun"}), 0) << Slurp(Log());
  EXPECT_EQ(SqlInt("SELECT COUNT(*) FROM runs"), 4);
  // status lists the sweep.
  ASSERT_EQ(Sweep({"status", "dedupe", "--db", db_}), 0);
  EXPECT_NE(Slurp(Log()).find("sweep dedupe"), std::string::npos) << Slurp(Log());
}

// Checkpoints left on disk by a deleted database belong to other runs: a new database retrains
// its runs in full rather than "resuming" them at their last step with empty curves.
TEST_F(SweepRunTest, LeftoverCheckpointsOfADeletedDatabaseAreNotResumed) {
  const json spec = {{"name", "fresh"}, {"base", Base(12, 4)}, {"seeds", {1, 2}}};
  ASSERT_EQ(Sweep({"run", WriteSpec(spec), "--db", db_, "-t", "1"}), 0) << Slurp(Log());
  // Twice: the second database's runs have the same ids as the first's, so a folder named by
  // config hash and run id is taken too by the third time.
  for (int again = 0; again < 2; ++again) {
    for (const char* suffix : {"", "-wal", "-shm"}) fs::remove(db_ + suffix);
    fs::remove_all(db_ + ".sweeps");
    ASSERT_EQ(Sweep({"run", WriteSpec(spec), "--db", db_, "-t", "1"}), 0) << Slurp(Log());
    ExpectAllDoneOnce(2);
  }
}

TEST_F(SweepRunTest, KillNineOfTheSweepThenResume) {
  const json spec = {{"name", "crash"}, {"base", Base(300, 20, true)}, {"seeds", {1, 2, 3, 4}}};
  const std::string path = WriteSpec(spec);
  const pid_t sweep = Spawn({"sweep", "run", path, "--db", db_, "-j", "2", "-t", "1"}, Log());
  const auto row = WaitForStep(40);
  ASSERT_TRUE(row.has_value()) << Slurp(Log());
  ::kill(sweep, SIGKILL);
  EXPECT_EQ(Wait(sweep), 128 + SIGKILL);
  // Resume by name (the spec is stored in the database), right away: trainers that are still
  // checkpointing are waited for, not started twice.
  ASSERT_EQ(Sweep({"resume", "crash", "--db", db_, "-j", "2", "-t", "1"}, Log("resume.txt")), 0)
      << Slurp(Log("resume.txt"));
  ExpectAllDoneOnce(4);
  EXPECT_EQ(SqlInt("SELECT COUNT(*) FROM sweep_runs"), 4);
  // The killed sweep's trainers were told to stop (SIGTERM via PR_SET_PDEATHSIG), and resume
  // continued them from their checkpoints: some run log shows a stop and a second start.
  int stops = 0, restarts = 0;
  for (const auto& e : fs::directory_iterator(db_ + ".sweeps/crash/logs")) {
    const std::string log = Slurp(e.path().string());
    stops += log.find("stopped at step") != std::string::npos;
    size_t n = 0;
    for (size_t p = log.find("moelab train: run"); p != std::string::npos;
         p = log.find("moelab train: run", p + 1))
      ++n;
    restarts += n > 1;
  }
  EXPECT_GE(stops, 1);
  EXPECT_GE(restarts, 1);
}

TEST_F(SweepRunTest, KillNineOfATrainerIsRetriedFromItsCheckpoint) {
  const json spec = {{"name", "retry"}, {"base", Base(300, 20, true)}, {"seeds", {1}}};
  const pid_t sweep =
      Spawn({"sweep", "run", WriteSpec(spec), "--db", db_, "-t", "1", "--max-retries", "2"}, Log());
  const auto row = WaitForStep(40);
  ASSERT_TRUE(row.has_value()) << Slurp(Log());
  ::kill(static_cast<pid_t>(*row->pid), SIGKILL);
  ASSERT_EQ(Wait(sweep), 0) << Slurp(Log());
  ExpectAllDoneOnce(1);
  EXPECT_EQ(SqlInt("SELECT failures FROM sweep_runs"), 1);
  db::Connection c = db::OpenForRead(db_);
  db::Statement st = c.Prepare("SELECT errors_json FROM sweep_runs");
  ASSERT_TRUE(st.Step());
  EXPECT_NE(st.Text(0).find("signal 9"), std::string::npos) << st.Text(0);
  EXPECT_NE(Slurp(Log()).find("retrying from its last checkpoint"), std::string::npos);
}

TEST_F(SweepRunTest, CtrlCStopsGracefullyAndResumeFinishes) {
  const json spec = {{"name", "ctrlc"}, {"base", Base(300, 20, true)}, {"seeds", {1, 2}}};
  const std::string path = WriteSpec(spec);
  const pid_t sweep = Spawn({"sweep", "run", path, "--db", db_, "-j", "2", "-t", "1"}, Log());
  ASSERT_TRUE(WaitForStep(40).has_value()) << Slurp(Log());
  // A second process on the same sweep is refused while the first holds the sweep lock, with
  // its own exit code (1 is for failed runs, docs/sweeps.md).
  EXPECT_EQ(Sweep({"run", path, "--db", db_}, Log("second.txt")), 5);
  EXPECT_NE(Slurp(Log("second.txt")).find("already being run by another process"),
            std::string::npos)
      << Slurp(Log("second.txt"));
  ::kill(sweep, SIGINT);
  EXPECT_EQ(Wait(sweep), 4) << Slurp(Log());
  {
    db::Reader reader(db_);
    int stopped = 0;
    for (const auto& r : reader.ListRuns()) stopped += r.status == RunStatus::kStopped;
    EXPECT_GE(stopped, 1);
  }
  ASSERT_EQ(Sweep({"resume", path, "--db", db_, "-j", "2", "-t", "1"}), 0) << Slurp(Log());
  ExpectAllDoneOnce(2);
}

TEST_F(SweepRunTest, ParallelRunsWithAPollingReader) {
  // 8 trainers at once (oversubscribed on small machines, which only makes the writes
  // interleave more) on one fresh database file, and a reader polling it throughout.
  const json spec = {
      {"name", "parallel"}, {"base", Base(60, 20, true)}, {"seeds", {1, 2, 3, 4, 5, 6, 7, 8}}};
  const pid_t sweep =
      Spawn({"sweep", "run", WriteSpec(spec), "--db", db_, "-j", "8", "-t", "1"}, Log());
  std::atomic<bool> done{false};
  std::atomic<int> errors{0}, polls{0};
  std::string first_error;
  std::thread poller([&] {
    while (!done) {
      try {
        if (fs::exists(db_)) {
          db::Reader reader(db_);
          for (const auto& r : reader.ListRuns()) reader.GetSeries(r.id, "loss");
          ++polls;
        }
      } catch (const std::exception& e) {
        const std::string what = e.what();
        // A reader opening the file before the sweep created the schema is expected.
        if (what.find("not a moelab database") == std::string::npos &&
            what.find("schema version") == std::string::npos) {
          if (errors++ == 0) first_error = what;
        }
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  });
  const int rc = Wait(sweep);
  done = true;
  poller.join();
  ASSERT_EQ(rc, 0) << Slurp(Log());
  EXPECT_EQ(errors.load(), 0) << first_error;
  EXPECT_GT(polls.load(), 10);
  EXPECT_EQ(Slurp(Log()).find("locked"), std::string::npos);
  ExpectAllDoneOnce(8);
}

TEST_F(SweepRunTest, DivergedRunIsRecordedAndTheSweepGoesOn) {
  const json spec = {{"name", "diverge"},
                     {"base", Base(40)},
                     {"runs",
                      {{{"optimizer.lr", 1e6},
                        {"optimizer.grad_clip", 0},
                        {"schedule.type", "constant"},
                        {"moe.experts_total", 0}},
                       {{"optimizer.lr", 0.003}}}}};
  ASSERT_EQ(Sweep({"run", WriteSpec(spec), "--db", db_, "-t", "1"}), 0) << Slurp(Log());
  db::Reader reader(db_);
  const auto runs = reader.ListRuns();
  ASSERT_EQ(runs.size(), 2u);
  EXPECT_EQ(runs[0].status, RunStatus::kDiverged);
  EXPECT_TRUE(runs[0].diverged_step.has_value());
  EXPECT_EQ(runs[1].status, RunStatus::kDone);
  EXPECT_NE(Slurp(Log()).find("DIVERGED"), std::string::npos);
  // A diverged run is an outcome: not retried, not rerun by resume.
  EXPECT_EQ(SqlInt("SELECT SUM(failures) FROM sweep_runs"), 0);
  ASSERT_EQ(Sweep({"resume", "diverge", "--db", db_}), 0) << Slurp(Log());
  EXPECT_EQ(SqlInt("SELECT COUNT(*) FROM runs"), 2);
}

TEST_F(SweepRunTest, BadSpecStartsNothing) {
  json spec = {{"name", "bad"}, {"base", Base(10)}, {"grid", {{"moe.experts_active", {2, 9}}}}};
  const std::string path = WriteSpec(spec);
  EXPECT_EQ(Sweep({"run", path, "--db", db_}), 2);
  EXPECT_NE(Slurp(Log()).find("run #1 (moe.experts_active=9)"), std::string::npos) << Slurp(Log());
  EXPECT_FALSE(fs::exists(db_));
  EXPECT_EQ(Sweep({"plan", path}), 2);
  spec["grid"] = {{"model.layer", {1}}};
  EXPECT_EQ(Sweep({"run", WriteSpec(spec), "--db", db_}), 2);
  EXPECT_NE(Slurp(Log()).find("did you mean 'model.layers'"), std::string::npos) << Slurp(Log());
  EXPECT_FALSE(fs::exists(db_));
}

TEST_F(SweepRunTest, PlanPrintsTheTable) {
  json spec = {{"name", "plan"},
               {"base", Base(10)},
               {"grid", {{"sparsity", {2, 4}}}},
               {"derived", {"moe.experts_total = sparsity * moe.experts_active"}}};
  ASSERT_EQ(Sweep({"plan", WriteSpec(spec), "-t", "1"}), 0) << Slurp(Log());
  const std::string out = Slurp(Log());
  EXPECT_NE(out.find("sparsity"), std::string::npos) << out;
  EXPECT_NE(out.find("moe.experts_total"), std::string::npos) << out;
  EXPECT_NE(out.find("total: 2 unique runs"), std::string::npos) << out;
  EXPECT_NE(out.find("measured:"), std::string::npos) << out;
}

// WSD branching: the short run starts its decay from the long run's checkpoint; its recorded
// curve is complete and equal, bit for bit, to the same run trained from scratch.
TEST_F(SweepRunTest, WsdBranchEqualsScratch) {
  json base = Base(24, 0);
  base["schedule"] = {{"type", "wsd"}, {"warmup_steps", 2}, {"decay_fraction", 0.25}};
  json spec = {{"name", "wsd"}, {"base", base}, {"grid", {{"train.steps", {16, 24}}}}};
  ASSERT_EQ(Sweep({"run", WriteSpec(spec), "--db", db_, "-t", "1"}), 0) << Slurp(Log());
  EXPECT_NE(Slurp(Log()).find("branch of run"), std::string::npos) << Slurp(Log());
  ExpectAllDoneOnce(2);
  const std::string scratch_db = (dir_ / "scratch.db").string();
  spec["branching"] = false;
  spec["base"]["checkpoint"]["dir"] = (dir_ / "ckpt2").string();  // not hashed
  ASSERT_EQ(Sweep({"run", WriteSpec(spec, "scratch.json"), "--db", scratch_db, "-t", "1"}), 0)
      << Slurp(Log());
  EXPECT_EQ(Slurp(Log()).find("branch of run"), std::string::npos);
  db::Reader branched(db_), scratch(scratch_db);
  for (const auto& b : branched.ListRuns()) {
    std::optional<db::RunRow> s;
    for (const auto& r : scratch.ListRuns())
      if (r.config_hash == b.config_hash) s = r;
    ASSERT_TRUE(s.has_value());
    const db::Series lb = branched.GetSeries(b.id, "loss"), ls = scratch.GetSeries(s->id, "loss");
    ASSERT_EQ(lb.steps.size(), ls.steps.size()) << b.name;
    for (size_t i = 0; i < lb.steps.size(); ++i) {
      EXPECT_EQ(lb.steps[i], ls.steps[i]);
      EXPECT_EQ(lb.values[i], ls.values[i]) << b.name << " step " << lb.steps[i];
    }
    const db::Series rb = branched.GetSeries(b.id, "lr"), rs = scratch.GetSeries(s->id, "lr");
    EXPECT_EQ(rb.values, rs.values) << b.name;
  }
  EXPECT_EQ(SqlInt("SELECT COUNT(*) FROM sweep_runs WHERE branch_step = 12"), 1);
}

// WSD extension (--extendable): a 16-step run keeps its checkpoint at its decay start (12); the
// grown spec's 24-step run continues from it (its steps 1-12 are the short run's) and ends equal,
// bit for bit, to the same 24-step run trained from scratch. Without the flag it starts over.
TEST_F(SweepRunTest, WsdExtensionEqualsScratch) {
  json base = Base(24, 0);
  base["schedule"] = {{"type", "wsd"}, {"warmup_steps", 2}, {"decay_fraction", 0.25}};
  json spec = {{"name", "grow"}, {"base", base}, {"grid", {{"train.steps", {16}}}}};
  ASSERT_EQ(Sweep({"run", WriteSpec(spec), "--db", db_, "-t", "1", "--extendable"}), 0)
      << Slurp(Log());
  spec["grid"]["train.steps"] = {16, 24};
  const std::string grown_log = (dir_ / "grown.log").string();
  ASSERT_EQ(Sweep({"run", WriteSpec(spec), "--db", db_, "-t", "1", "--extendable"}, grown_log), 0)
      << Slurp(grown_log);
  EXPECT_NE(Slurp(grown_log).find("(extends run 1: its stable phase to step 12)"),
            std::string::npos)
      << Slurp(grown_log);
  ExpectAllDoneOnce(2);
  EXPECT_EQ(SqlInt("SELECT COUNT(*) FROM sweep_runs WHERE branch_of = 1 AND branch_step = 12"), 1);

  // The same 24-step run from scratch, in another database and checkpoint folder.
  const std::string scratch_db = (dir_ / "scratch.db").string();
  json alone = spec;
  alone["grid"]["train.steps"] = {24};
  alone["base"]["checkpoint"]["dir"] = (dir_ / "ckpt2").string();  // not hashed
  const std::string alone_log = (dir_ / "alone.log").string();
  ASSERT_EQ(
      Sweep({"run", WriteSpec(alone, "alone.json"), "--db", scratch_db, "-t", "1"}, alone_log), 0)
      << Slurp(alone_log);
  EXPECT_EQ(Slurp(alone_log).find("extends"), std::string::npos);
  db::Reader extended(db_), scratch(scratch_db);
  std::optional<db::RunRow> e, f;
  for (const auto& r : extended.ListRuns())
    if (r.shape.total_steps == 24) e = r;
  for (const auto& r : scratch.ListRuns())
    if (r.shape.total_steps == 24) f = r;
  ASSERT_TRUE(e && f);
  EXPECT_EQ(e->config_hash, f->config_hash);
  const db::Series le = extended.GetSeries(e->id, "loss"), ls = scratch.GetSeries(f->id, "loss");
  ASSERT_EQ(le.steps.size(), 24u);
  ASSERT_EQ(le.steps.size(), ls.steps.size());
  for (size_t i = 0; i < le.steps.size(); ++i) {
    EXPECT_EQ(le.steps[i], ls.steps[i]);
    EXPECT_EQ(le.values[i], ls.values[i]) << "step " << le.steps[i];
  }
  EXPECT_EQ(extended.GetSeries(e->id, "lr").values, scratch.GetSeries(f->id, "lr").values);
}

// A done run of another sweep in the same database is extended too: an adaptive sweep's short
// runs, then the grid that contains them (experiments/adaptive-sparsity, then the frontier).
TEST_F(SweepRunTest, WsdExtensionContinuesAnotherSweepsRun) {
  json base = Base(24, 0);
  base["schedule"] = {{"type", "wsd"}, {"warmup_steps", 2}, {"decay_fraction", 0.25}};
  json first = {{"name", "first"}, {"base", base}, {"grid", {{"train.steps", {16}}}}};
  ASSERT_EQ(Sweep({"run", WriteSpec(first, "first.json"), "--db", db_, "-t", "1", "--extendable"}),
            0)
      << Slurp(Log());
  json grid = {{"name", "grid"}, {"base", base}, {"grid", {{"train.steps", {16, 24}}}}};
  const std::string grid_log = (dir_ / "grid.log").string();
  ASSERT_EQ(Sweep({"run", WriteSpec(grid, "grid.json"), "--db", db_, "-t", "1", "--extendable"},
                  grid_log),
            0)
      << Slurp(grid_log);
  EXPECT_NE(Slurp(grid_log).find("(extends run 1: its stable phase to step 12)"), std::string::npos)
      << Slurp(grid_log);
  EXPECT_EQ(SqlInt("SELECT COUNT(*) FROM runs WHERE status = 'done'"), 2);
  EXPECT_EQ(SqlInt("SELECT COUNT(*) FROM sweep_runs WHERE branch_of = 1 AND branch_step = 12"), 1);
}

// Without --extendable the grown spec's longer run trains from scratch (the short run kept no
// checkpoint at its decay start).
TEST_F(SweepRunTest, GrownSpecWithoutExtendableStartsOver) {
  json base = Base(24, 0);
  base["schedule"] = {{"type", "wsd"}, {"warmup_steps", 2}, {"decay_fraction", 0.25}};
  json spec = {{"name", "grow"}, {"base", base}, {"grid", {{"train.steps", {16}}}}};
  ASSERT_EQ(Sweep({"run", WriteSpec(spec), "--db", db_, "-t", "1"}), 0) << Slurp(Log());
  spec["grid"]["train.steps"] = {16, 24};
  const std::string grown_log = (dir_ / "grown.log").string();
  ASSERT_EQ(Sweep({"run", WriteSpec(spec), "--db", db_, "-t", "1", "--extendable"}, grown_log), 0)
      << Slurp(grown_log);
  EXPECT_EQ(Slurp(grown_log).find("extends"), std::string::npos) << Slurp(grown_log);
  ExpectAllDoneOnce(2);
}

TEST_F(SweepRunTest, SlurmScript) {
  const json spec = {{"name", "cluster"}, {"base", Base(10)}, {"seeds", {1, 2, 3}}};
  const sweeps::Sweep s = sweeps::LoadSweep(WriteSpec(spec));
  sweeps::SlurmOptions o;
  o.db_path = "/scratch/me/cluster-{task}.db";
  o.out_dir = (dir_ / "slurm").string();
  o.threads_per_run = 4;
  const std::string script = sweeps::WriteSlurmScript(s, o);
  const std::string text = Slurp(script);
  EXPECT_NE(text.find("#SBATCH --array=0-2"), std::string::npos) << text;
  EXPECT_NE(text.find("#SBATCH --cpus-per-task=4"), std::string::npos);
  EXPECT_NE(text.find("--resume"), std::string::npos);
  EXPECT_NE(text.find("cluster-{task}.db"), std::string::npos);
  EXPECT_EQ(
      std::distance(fs::directory_iterator(dir_ / "slurm" / "configs"), fs::directory_iterator{}),
      3);
  // The script parses (bash -n).
  EXPECT_EQ(std::system(("bash -n '" + script + "'").c_str()), 0);
}

// `sweep slurm` without --submit: writes scripts and nothing else (no moelab.db where it runs),
// says that Slurm trains WSD branches from scratch and at what cost, and the script `cd`s to the
// submit folder so relative data and checkpoint paths mean the same on the cluster.
TEST_F(SweepRunTest, SlurmWithoutSubmitWritesNoDatabaseAndSaysWhatItDoesNotDo) {
  json base = Base(24);
  base["schedule"] = {{"type", "wsd"}, {"warmup_steps", 2}, {"decay_fraction", 0.25}};
  base["checkpoint"]["dir"] = "ckpt";  // relative: resolved in the folder the script cds to
  const std::string spec =
      WriteSpec({{"name", "wsd-slurm"}, {"base", base}, {"grid", {{"train.steps", {16, 24}}}}});
  const fs::path work = dir_ / "work";
  fs::create_directories(work);
  const std::string cmd = "cd '" + work.string() + "' && '" + test::BinPath("moelab") +
                          "' sweep slurm '" + spec + "' --db '/scratch/c-{task}.db' --out '" +
                          (dir_ / "slurm").string() + "' > '" + Log() + "' 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << Slurp(Log());
  const std::string log = Slurp(Log());
  EXPECT_FALSE(fs::exists(work / "moelab.db")) << log;
  EXPECT_EQ(log.find("recorded sweep"), std::string::npos) << log;
  EXPECT_NE(log.find("warning: WSD branching is not done on Slurm: 1 shorter run(s) train from "
                     "scratch"),
            std::string::npos)
      << log;
  // 16 + 24 steps from scratch against 24 + the 16-step run's decay (4 steps): 40/28.
  EXPECT_NE(log.find("(1.43x)"), std::string::npos) << log;
  const std::string script = Slurp((dir_ / "slurm" / "wsd-slurm.sbatch").string());
  // Every task cds to the submit folder (or $MOELAB_ROOT) before training.
  EXPECT_NE(script.find("cd \"${MOELAB_ROOT:-${SLURM_SUBMIT_DIR:-.}}\"\n"), std::string::npos)
      << script;
  EXPECT_NE(script.find("# Note: WSD branching is not done on Slurm"), std::string::npos);
  // --local-db asks for the record.
  ASSERT_EQ(Sweep({"slurm", spec, "--db", "/scratch/c.db", "--out", (dir_ / "slurm").string(),
                   "--local-db", db_}),
            0)
      << Slurp(Log());
  EXPECT_NE(Slurp(Log()).find("recorded sweep 'wsd-slurm'"), std::string::npos);
  EXPECT_TRUE(fs::exists(db_));
}

// Two sweeps with different names and the same configs, started at the same moment: every
// config is trained once (one run row each, shared by both sweeps), and both sweeps finish with
// every run done.
TEST_F(SweepRunTest, TwoSweepsWithTheSameConfigsTrainEachOnce) {
  const json base = Base(60, 20, true);
  const std::string a = WriteSpec({{"name", "first"}, {"base", base}, {"seeds", {1, 2}}}, "a.json");
  const std::string b =
      WriteSpec({{"name", "second"}, {"base", base}, {"seeds", {1, 2}}}, "b.json");
  const pid_t pa = Spawn({"sweep", "run", a, "--db", db_, "-t", "1", "--no-live"}, Log("a.txt"));
  const pid_t pb = Spawn({"sweep", "run", b, "--db", db_, "-t", "1", "--no-live"}, Log("b.txt"));
  ASSERT_EQ(Wait(pa), 0) << Slurp(Log("a.txt"));
  ASSERT_EQ(Wait(pb), 0) << Slurp(Log("b.txt"));
  ExpectAllDoneOnce(2);
  EXPECT_EQ(SqlInt("SELECT COUNT(*) FROM sweep_runs"), 4);
  EXPECT_EQ(SqlInt("SELECT COUNT(DISTINCT run_id) FROM sweep_runs"), 2);
  ASSERT_EQ(Sweep({"status", "second", "--db", db_}), 0);
  EXPECT_NE(Slurp(Log()).find("2 runs: 2 done"), std::string::npos) << Slurp(Log());
}

// `sweep status` while a run waits for its slot: the queued run has recorded nothing, shown as
// "-" (it printed "nan").
TEST_F(SweepRunTest, StatusShowsNoNanForUnstartedRuns) {
  const std::string path =
      WriteSpec({{"name", "waiting"}, {"base", Base(400, 50, true)}, {"seeds", {1, 2}}});
  const pid_t sweep = Spawn({"sweep", "run", path, "--db", db_, "-j", "1", "-t", "1"}, Log());
  ASSERT_TRUE(WaitForStep(5).has_value()) << Slurp(Log());
  EXPECT_EQ(Sweep({"status", "waiting", "--db", db_}, Log("status.txt")), 0);
  const std::string status = Slurp(Log("status.txt"));
  EXPECT_NE(status.find("queued"), std::string::npos) << status;
  EXPECT_EQ(status.find("nan"), std::string::npos) << status;
  ::kill(sweep, SIGINT);
  EXPECT_EQ(Wait(sweep), 4) << Slurp(Log());
}

}  // namespace
}  // namespace moelab
