// Slurm launching with fake sbatch/srun/squeue/sacct/scontrol scripts on PATH (so it runs where
// Slurm is not installed; slurm_real_test.sh runs the same path on a real Slurm): one script per
// rank count with srun steps of the right --ntasks, submission
// with job tracking that `sweep status` follows, and runs trained "on the cluster" joining their
// sweep after `moelab db merge` (adoption by config hash) so `sweep run` trains nothing again.
#include "sweeps/slurm.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <nlohmann/json.hpp>

#include "db/reader.h"
#include "db/schema.h"
#include "sweeps/adopt.h"
#include "sweeps/launch.h"
#include "sweeps/store.h"
#include "tests/launch/fixture.h"

namespace moelab::sweeps {
namespace {

TEST_F(LaunchRunTest, SlurmScriptsPerRankCountUseSrun) {
  ojson spec = Spec(R"({"name": "mixed", "runs": [{"train.seed": 1}, {"train.seed": 2, "ranks": 2},
                                                   {"train.seed": 3, "ranks": 2}]})");
  const Sweep s = ExpandSpec(spec);
  SlurmOptions o;
  o.db_path = "/scratch/c-{task}.db";
  o.out_dir = (dir_ / "slurm").string();
  o.threads_per_run = 3;
  o.srun_mpi = "pmix";
  o.resources.partition = "cpu";
  o.resources.time_limit = "02:00:00";
  o.resources.mem = "8G";
  o.resources.account = "proj";
  o.resources.gres = "gpu:1";
  const std::vector<SlurmScript> scripts = WriteSlurmScripts(s, o);
  EXPECT_HAS(Slurp(scripts[0].path),
             "#SBATCH --partition=cpu\n#SBATCH --time=02:00:00\n#SBATCH --mem=8G\n"
             "#SBATCH --account=proj\n#SBATCH --gres=gpu:1\n");
  ASSERT_EQ(scripts.size(), 2u);
  EXPECT_EQ(scripts[0].ranks, 1);
  EXPECT_EQ(scripts[0].tasks, 1);
  EXPECT_EQ(scripts[1].ranks, 2);
  EXPECT_EQ(scripts[1].tasks, 2);
  EXPECT_HAS(scripts[1].path, "mixed.r2.sbatch");
  const std::string two = Slurp(scripts[1].path);
  EXPECT_HAS(two, "#SBATCH --array=0-1\n");
  EXPECT_HAS(two, "#SBATCH --ntasks=2\n");
  EXPECT_HAS(two, "#SBATCH --cpus-per-task=3\n");
  EXPECT_HAS(two,
             "srun --ntasks=2 --cpus-per-task=$OMP_NUM_THREADS --kill-on-bad-exit=1 "
             "--mpi=pmix \"$MOELAB\" train");
  // Train or continue; a preempted or timed-out task checkpoints (SIGTERM) and is requeued.
  EXPECT_HAS(two, "--resume --no-progress &\n");
  EXPECT_HAS(two, "#SBATCH --requeue\n#SBATCH --signal=B:USR1@120\n");
  // Real Slurm truncates a requeued task's log: the earlier attempts' output is kept.
  EXPECT_HAS(two, "#SBATCH --open-mode=append\n");
  EXPECT_HAS(two, "scontrol requeue \"${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}\"");
  EXPECT_HAS(two, "trap 'kill -USR1 \"$step\" 2>/dev/null || true' TERM\n");
  EXPECT_HAS(two, "cd \"${MOELAB_ROOT:-${SLURM_SUBMIT_DIR:-.}}\"\n");
  // Databases of the two scripts' tasks do not collide.
  EXPECT_HAS(two, "/r2_$TASK}");
  EXPECT_HAS(Slurp(scripts[0].path), "#SBATCH --ntasks=1\n");
  for (const SlurmScript& sc : scripts) {
    EXPECT_EQ(std::system(("bash -n '" + sc.path + "'").c_str()), 0) << sc.path;
  }
  // --ranks puts every run in one script (its old name), and checks the layout.
  o.ranks = 4;
  const auto one = WriteSlurmScripts(s, o);
  ASSERT_EQ(one.size(), 1u);
  EXPECT_HAS(one[0].path, "mixed.sbatch");
  EXPECT_HAS(Slurp(one[0].path), "srun --ntasks=4 ");
  o.ranks = kMaxRanks + 1;
  try {
    WriteSlurmScripts(s, o);
    FAIL() << "accepted " << o.ranks << " ranks";
  } catch (const SpecError& e) {
    EXPECT_HAS(e.what(), "--ranks: 65537 ranks per run is more than the cap");
  }
}

TEST_F(LaunchRunTest, SubmitAndFollowJobsWithSqueueAndSacct) {
  const std::string calls = (dir_ / "calls.log").string();
  // sbatch answers like the real one with --parsable: "<job id>[;cluster]".
  Tool("sbatch", "echo \"sbatch $*\" >> '" + calls + "'\nn=$(grep -c sbatch '" + calls +
                     "')\necho \"$((4240 + n));cluster\"\n");
  const std::string local = (dir_ / "local.db").string();
  ojson spec = Spec(R"({"name": "follow", "runs": [{"train.seed": 1}, {"train.seed": 2},
                                                    {"train.seed": 3, "ranks": 2}]})");
  const std::string log = (dir_ / "log.txt").string();
  ASSERT_EQ(Moelab({"sweep", "slurm", WriteSpec(spec), "--db", "/scratch/c-{task}.db", "--out",
                    (dir_ / "slurm").string(), "--submit", "--local-db", local},
                   log),
            0)
      << Slurp(log);
  EXPECT_HAS(Slurp(log), "as Slurm job 4241");
  EXPECT_HAS(Slurp(log), "as Slurm job 4242");
  EXPECT_HAS(Slurp(calls), "sbatch --parsable " + (dir_ / "slurm" / "follow.r1.sbatch").string());

  // Without squeue/sacct the status says it cannot follow.
  ASSERT_EQ(Moelab({"sweep", "status", "follow", "--db", local}, log), 0) << Slurp(log);
  if (FindOnPath("squeue").empty() && FindOnPath("sacct").empty()) {
    EXPECT_HAS(Slurp(log), "squeue/sacct not on PATH");
  }
  // sacct knows finished tasks, squeue the live ones (and wins where both answer).
  Tool("sacct",
       "echo \"sacct $*\" >> '" + calls +
           "'\nprintf '4241_0|COMPLETED\\n4241_1|RUNNING\\n4242_0|FAILED\\n4242_1|CANCELLED by "
           "0\\n'\n");
  Tool("squeue", "echo \"squeue $*\" >> '" + calls + "'\nprintf '4241_1 COMPLETING\\n'\n");
  ASSERT_EQ(Moelab({"sweep", "status", "follow", "--db", local}, log), 0) << Slurp(log);
  const std::string out = Slurp(log);
  EXPECT_HAS(out,
             "slurm job 4241 (follow.r1.sbatch, 2 task(s) x 1 rank(s)): 1 COMPLETED, 1 "
             "COMPLETING");
  EXPECT_HAS(out,
             "slurm job 4242 (follow.r2.sbatch, 1 task(s) x 2 rank(s)): 1 CANCELLED, 1 "
             "FAILED");
  EXPECT_HAS(out, "moelab db merge");
  EXPECT_HAS(Slurp(calls), "sacct -n -X -P -j 4241,4242 -o JobID,State");
  // -t all: real squeue drops ended tasks otherwise, and sacct fails without accounting.
  EXPECT_HAS(Slurp(calls), "squeue -h -r -t all -j 4241,4242 -o %i %T");
  EXPECT_EQ(LoadSlurmJobs(local, "follow").size(), 2u);

  // Without accounting, real sacct fails with a complaint on stderr: status falls back on
  // squeue and does not print the complaint.
  Tool("sacct", "echo 'Slurm accounting storage is disabled' >&2\nexit 1\n");
  ASSERT_EQ(Moelab({"sweep", "status", "follow", "--db", local}, log), 0) << Slurp(log);
  EXPECT_EQ(Slurp(log).find("accounting storage"), std::string::npos) << Slurp(log);
  EXPECT_HAS(Slurp(log), "slurm job 4241 (follow.r1.sbatch, 2 task(s) x 1 rank(s)): 1 COMPLETING");

  // A failing sbatch is an error that carries what it said on stderr, where the real one says it.
  Tool("sbatch", "echo 'sbatch: error: invalid partition' >&2\nexit 1\n");
  EXPECT_EQ(Moelab({"sweep", "slurm", WriteSpec(spec), "--db", "c.db", "--out",
                    (dir_ / "slurm").string(), "--submit", "--local-db", local},
                   log),
            1);
  EXPECT_HAS(Slurp(log), "failed (exit 1): sbatch: error: invalid partition");
}

// The full round trip: `sweep slurm` records the sweep locally, the array tasks train on "the
// cluster" (the script run by hand with a fake srun), `db merge` brings each task's database
// back and the runs join the sweep; `sweep run` then reuses all of them.
TEST_F(LaunchRunTest, MergedRunsJoinTheirSweep) {
  Tool("srun",
       "while [ $# -gt 0 ]; do case \"$1\" in --*) shift;; *) break;; esac; done\n"
       "exec \"$@\"\n");
  const std::string local = (dir_ / "local.db").string();
  ojson spec = Spec(R"({"name": "trip", "seeds": [1, 2, 3]})");
  spec["base"] = Base(6);
  spec["base"]["checkpoint"] = {{"dir", (dir_ / "ckpt").string()}};
  const std::string spec_path = WriteSpec(spec);
  const std::string log = (dir_ / "log.txt").string();
  const std::string cluster = (dir_ / "cluster-{task}.db").string();
  ASSERT_EQ(Moelab({"sweep", "slurm", spec_path, "--db", cluster, "--out",
                    (dir_ / "slurm").string(), "--local-db", local, "-t", "1", "--moelab", Bin()},
                   log),
            0)
      << Slurp(log);
  const std::string script = (dir_ / "slurm" / "trip.sbatch").string();
  for (int task = 0; task < 3; ++task) {
    const std::string cmd = "PATH='" + (dir_ / "bin").string() +
                            "':$PATH SLURM_ARRAY_TASK_ID=" + std::to_string(task) + " bash '" +
                            script + "' > '" + log + "' 2>&1";
    ASSERT_EQ(std::system(cmd.c_str()), 0) << Slurp(log);
    // A requeued or resubmitted task continues its run: here, finished, it trains nothing.
    ASSERT_EQ(std::system(cmd.c_str()), 0) << Slurp(log);
    EXPECT_HAS(Slurp(log), "is already done at step 6");
  }
  // Two tasks come back now, the third later.
  for (int task : {0, 2}) {
    const std::string db = (dir_ / ("cluster-" + std::to_string(task) + ".db")).string();
    ASSERT_EQ(Moelab({"db", "merge", db, "--db", local}, log), 0) << Slurp(log);
    EXPECT_HAS(Slurp(log), "imported 1 run(s)");
    EXPECT_HAS(Slurp(log), "joined sweep 'trip' as #" + std::to_string(task));
  }
  db::Connection c = db::OpenForRead(local);
  EXPECT_EQ(c.QueryInt("SELECT COUNT(*) FROM sweep_runs"), 2);
  EXPECT_EQ(c.QueryInt("SELECT COUNT(*) FROM runs WHERE sweep_id IS NOT NULL"), 2);
  ASSERT_EQ(Moelab({"sweep", "status", "trip", "--db", local}, log), 0) << Slurp(log);
  EXPECT_HAS(Slurp(log), "sweep trip (id 1): 2 runs: 2 done");
  // Adopting again changes nothing.
  EXPECT_TRUE(AdoptRuns(local).empty());
  ASSERT_EQ(Moelab({"db", "merge", (dir_ / "cluster-1.db").string(), "--db", local}, log), 0);
  EXPECT_HAS(Slurp(log), "joined sweep 'trip' as #1");
  // Nothing left to train: `sweep run` reuses the three merged runs.
  ASSERT_EQ(Moelab({"sweep", "run", spec_path, "--db", local, "--no-live"}, log), 0) << Slurp(log);
  EXPECT_HAS(Slurp(log), "3 done (3 reused");
  EXPECT_EQ(db::OpenForRead(local).QueryInt("SELECT COUNT(*) FROM runs"), 3);
}

// The time-limit warning (USR1 to the batch shell) mid-run: the trainer gets USR1 through srun
// (real srun SIGKILLs the ranks on TERM, so the script must not send that), checkpoints, exits
// 4, and the script requeues its own array task: "77_1", not $SLURM_JOB_ID, which for one task
// of an array equals the array's id and would requeue every task (both seen on real Slurm).
TEST_F(LaunchRunTest, TimeLimitWarningCheckpointsAndRequeuesOnlyItsTask) {
  Tool("srun",
       "while [ $# -gt 0 ]; do case \"$1\" in --*) shift;; *) break;; esac; done\n"
       "exec \"$@\"\n");
  const std::string calls = (dir_ / "calls.log").string();
  Tool("scontrol", "echo \"scontrol $*\" >> '" + calls + "'\n");
  ojson spec = Spec(R"({"name": "warn", "seeds": [1, 2]})");
  spec["base"] = Base(1000000);  // stopped long before its end
  spec["base"]["checkpoint"] = {{"dir", (dir_ / "ckpt").string()}};
  const std::string log = (dir_ / "log.txt").string();
  const std::string db = (dir_ / "c-1.db").string();
  ASSERT_EQ(Moelab({"sweep", "slurm", WriteSpec(spec), "--db", (dir_ / "c-{task}.db").string(),
                    "--out", (dir_ / "slurm").string(), "-t", "1", "--moelab", Bin()},
                   log),
            0)
      << Slurp(log);
  const std::string driver = (dir_ / "driver.sh").string();
  std::ofstream(driver) << "export PATH='" << (dir_ / "bin").string() << "':$PATH\n"
                        << "SLURM_JOB_ID=77 SLURM_ARRAY_JOB_ID=77 SLURM_ARRAY_TASK_ID=1 bash '"
                        << (dir_ / "slurm" / "warn.sbatch").string() << "' &\npid=$!\n"
                        << "for i in $(seq 600); do\n"
                        << "  n=$(sqlite3 '" << db
                        << "' 'SELECT COUNT(*) FROM steps' 2>/dev/null)\n"
                        << "  [ \"${n:-0}\" -ge 3 ] && break; sleep 0.1\ndone\n"
                        << "kill -USR1 $pid\nwait $pid\n";
  EXPECT_EQ(test::Run({"/bin/bash", driver}, log), 4) << Slurp(log);
  EXPECT_HAS(Slurp(log), "stopped at step");
  EXPECT_EQ(Slurp(calls), "scontrol requeue 77_1\n");
  db::Connection c = db::OpenForRead(db);
  EXPECT_EQ(c.QueryInt("SELECT status = 'stopped' FROM runs"), 1);
  EXPECT_GE(c.QueryInt("SELECT checkpoint_step FROM runs"), 3);
}

}  // namespace
}  // namespace moelab::sweeps
