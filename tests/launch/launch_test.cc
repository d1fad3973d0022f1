// Launching multi-rank runs: layout validation with errors that name the spec location, the
// mpirun command line, the launcher-environment checks, and a sweep whose runs go through a
// fake `mpirun` on PATH (the scheduler's slots, arguments and environment, without MPI).
#include "sweeps/launch.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>

#include "db/reader.h"
#include "tests/common/test_util.h"
#include "tests/launch/fixture.h"
#include "tests/sweeps/spec_fixture.h"

namespace moelab::sweeps {
namespace {

using test_specs::ErrorOf;

RunConfig Moe(int experts) {
  ojson b = Base();
  b["moe"]["experts_total"] = experts;
  return ConfigFromJson(nlohmann::json::parse(b.dump()));
}

TEST(LayoutTest, ErrorsNameTheOriginAndTheRule) {
  const RunConfig moe = Moe(4);
  EXPECT_EQ(LayoutError(moe, 1), "");
  EXPECT_EQ(LayoutError(moe, 4), "");
  EXPECT_HAS(LayoutError(moe, 0), "ranks: 0 ranks; a run needs at least 1");
  EXPECT_HAS(LayoutError(moe, kMaxRanks + 1), "more than the cap");
  LayoutOrigin o{"runs[3].ranks", "runs[3].dist.expert_parallel"};
  EXPECT_EQ(LayoutError(moe, Layout{4, 2, false}, o), "");
  EXPECT_EQ(Layout({4, 2, false}).data_parallel(), 2);
  // World size not divisible by the expert-parallel size.
  const std::string odd = LayoutError(moe, Layout{3, 2, false}, o);
  EXPECT_HAS(odd, "runs[3].ranks: world size 3 is not divisible by the expert-parallel size 2");
  EXPECT_HAS(odd, "runs[3].dist.expert_parallel");
  // More expert-parallel ranks than experts.
  EXPECT_HAS(LayoutError(moe, Layout{8, 8, false}, o),
             "runs[3].dist.expert_parallel: 8 expert-parallel ranks but only 4 experts");
  // Experts that do not split evenly over the expert-parallel ranks.
  EXPECT_HAS(LayoutError(Moe(6), Layout{4, 4, false}, o),
             "runs[3].dist.expert_parallel: 6 experts (moe.experts_total) do not split evenly "
             "over 4 expert-parallel ranks");
  // Expert parallelism of a dense model.
  ojson dense = Base();
  dense["moe"]["experts_total"] = 0;
  dense.erase("moe");
  const RunConfig d = ConfigFromJson(nlohmann::json::parse(dense.dump()));
  ASSERT_FALSE(d.moe.enabled());
  EXPECT_HAS(LayoutError(d, Layout{2, 2, false}, o), "needs an MoE model");
  EXPECT_EQ(LayoutError(d, Layout{2, 1, false}, o), "");
}

TEST(LayoutTest, SpecRanksPerRunAndPerSweep) {
  const Sweep s =
      ExpandSpec(Spec(R"({"ranks": 2, "runs": [{"train.seed": 1}, {"train.seed": 2, "ranks": 4},
                                    {"train.seed": 1, "ranks": 1}]})"));
  ASSERT_EQ(s.runs.size(), 3u);
  EXPECT_EQ(s.ranks, 2);
  EXPECT_EQ(s.runs[0].ranks, 2);
  EXPECT_EQ(s.runs[1].ranks, 4);
  EXPECT_EQ(s.runs[2].ranks, 1);
  EXPECT_EQ(s.runs[1].runs_index, 1);
  EXPECT_HAS(s.runs[1].name, "ranks=4");
  // The process count is not part of the run's identity: the same config at 1 and 2 ranks is
  // one run (the trajectory does not depend on the layout), trained once.
  EXPECT_EQ(s.runs[2].hash, s.runs[0].hash);
  EXPECT_EQ(s.runs[2].duplicate_of, 0);
  // "ranks" is no stray variable.
  for (const std::string& w : s.warnings) EXPECT_EQ(w.find("'ranks'"), std::string::npos) << w;
  // Grid over ranks with seeds: every run knows its own.
  const Sweep g = ExpandSpec(Spec(R"({"grid": {"ranks": [1, 2]}, "seeds": [5, 6]})"));
  ASSERT_EQ(g.runs.size(), 4u);
  EXPECT_EQ(g.runs[0].ranks, 1);
  EXPECT_EQ(g.runs[3].ranks, 2);
}

TEST(LayoutTest, SpecErrorsNameTheJsonPath) {
  EXPECT_HAS(ErrorOf(Spec(R"({"ranks": 0})")), "ranks: expected an integer from 1 to 65536");
  EXPECT_HAS(ErrorOf(Spec(R"({"ranks": "2"})")), "ranks: expected an integer");
  const std::string e = ErrorOf(Spec(
      R"({"runs": [{"train.seed": 1}, {"train.seed": 2}, {"train.seed": 3},
                   {"train.seed": 4, "ranks": 0}], "seeds": [7, 8]})"));
  // runs × seeds: runs[3] makes points 6 and 7; both name runs[3].ranks.
  EXPECT_HAS(e, "2 of 8 runs are invalid; nothing was started");
  EXPECT_HAS(e, "run #6 (");
  EXPECT_HAS(e, "runs[3].ranks: expected an integer from 1");
  EXPECT_HAS(ErrorOf(Spec(R"({"grid": {"ranks": [1, 100000]}})")), "grid.ranks: expected");
  EXPECT_HAS(ErrorOf(Spec(R"({"zip": {"ranks": [2, -1], "train.seed": [1, 2]}})")),
             "zip[0].ranks: expected");
}

TEST(LayoutTest, KeyOriginFindsTheSpecLocation) {
  const ojson s = ojson::parse(R"({
    "ranks": 2,
    "base": {"dist": {"expert_parallel": 2}},
    "set": {"train.steps": 4},
    "runs": [{"ranks": 4}, {"expert_parallel": 4}, {"dist.zero1": true}],
    "grid": {"optimizer.lr": [1]},
    "derived": ["train.tokens = 100"]
  })");
  EXPECT_EQ(KeyOrigin(s, "ranks", 0), "runs[0].ranks");
  EXPECT_EQ(KeyOrigin(s, "ranks", 1), "ranks");
  EXPECT_EQ(KeyOrigin(s, "dist.expert_parallel", 1), "runs[1].expert_parallel");
  EXPECT_EQ(KeyOrigin(s, "dist.expert_parallel", 0), "base.dist.expert_parallel");
  EXPECT_EQ(KeyOrigin(s, "zero1", 2), "runs[2].dist.zero1");
  EXPECT_EQ(KeyOrigin(s, "train.steps", 0), "set.train.steps");
  EXPECT_EQ(KeyOrigin(s, "optimizer.lr", 0), "grid.optimizer.lr");
  EXPECT_EQ(KeyOrigin(s, "train.tokens", 0), "derived[0]");
  EXPECT_EQ(KeyOrigin(s, "model.layers", -1), "model.layers");
}

TEST(LayoutTest, RanksOverride) {
  Sweep s = ExpandSpec(Spec(R"({"ranks": 2, "seeds": [1, 2]})"));
  OverrideRanks(&s, 4);
  EXPECT_EQ(s.runs[0].ranks, 4);
  EXPECT_EQ(s.runs[1].ranks, 4);
  auto error = [&](int ranks) -> std::string {
    try {
      OverrideRanks(&s, ranks);
    } catch (const SpecError& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_HAS(error(0), "--ranks: 0 ranks");
  EXPECT_HAS(error(0), "nothing was started");
  // The global batch (4 sequences) must split evenly over the ranks.
  EXPECT_HAS(error(3),
             "--ranks: the global batch of 4 sequences (train.batch_size) does not "
             "split evenly over 3 ranks");
}

TEST(LayoutTest, ExpertParallelSpecErrorsNameTheirOrigin) {
  // World size not divisible by the EP size, both locations named.
  EXPECT_HAS(ErrorOf(Spec(R"({"runs": [{"ranks": 4}, {"ranks": 2, "expert_parallel": 4}]})")),
             "runs[1].ranks: world size 2 is not divisible by the expert-parallel size 4 "
             "(runs[1].expert_parallel)");
  // More EP ranks than experts, from the base config.
  ojson s = Spec(R"({"ranks": 8})");
  s["base"]["train"]["batch_size"] = 8;
  s["base"]["dist"] = {{"expert_parallel", 8}};
  EXPECT_HAS(ErrorOf(s), "base.dist.expert_parallel: 8 expert-parallel ranks exceed the 4 experts");
  // Expert parallelism of a dense model, from the sweep-wide shorthand.
  ojson dense = Spec(R"({"ranks": 2, "expert_parallel": 2})");
  dense["base"].erase("moe");
  EXPECT_HAS(ErrorOf(dense), "): expert_parallel: expert parallelism needs an MoE model");
  // A valid DP 2 × EP 2 layout and ZeRO-1 per run.
  const Sweep ok =
      ExpandSpec(Spec(R"({"ranks": 4, "runs": [{"expert_parallel": 2}, {"zero1": true}]})"));
  EXPECT_EQ(ok.runs[0].config.dist.expert_parallel, 2);
  EXPECT_EQ(LayoutOf(ok.runs[0].config, 4).data_parallel(), 2);
  EXPECT_TRUE(ok.runs[1].config.dist.zero1);
  // The layout is not part of the run's identity (the trajectory does not depend on it).
  EXPECT_EQ(ok.runs[0].hash, ok.runs[1].hash);
}

TEST(LaunchCommandTest, MpirunArguments) {
  const std::vector<std::string> train = {"/bin/moelab", "train", "c.json"};
  EXPECT_EQ(MpirunCommand(1, train, 2, true), train);
  const auto two = MpirunCommand(2, train, 2, false);
  EXPECT_EQ(std::vector<std::string>(two.begin(), two.begin() + 5),
            (std::vector<std::string>{"mpirun", "-np", "2", "--bind-to", "none"}));
  EXPECT_EQ(std::find(two.begin(), two.end(), "--oversubscribe"), two.end());
  EXPECT_EQ(std::find(two.begin(), two.end(), "--allow-run-as-root"), two.end());
  EXPECT_EQ(std::vector<std::string>(two.end() - 3, two.end()), train);
  const auto four = MpirunCommand(4, train, 2, true);
  EXPECT_NE(std::find(four.begin(), four.end(), "--oversubscribe"), four.end());
  EXPECT_NE(std::find(four.begin(), four.end(), "--allow-run-as-root"), four.end());
  EXPECT_EQ(MpirunEnvironment(false).size(), 0u);
  const auto env = MpirunEnvironment(true);
  ASSERT_EQ(env.size(), 2u);
  EXPECT_EQ(env[0].first, "OMPI_ALLOW_RUN_AS_ROOT");
}

using test::ScopedEnv;

TEST(LaunchEnvironmentTest, SeveralRanksNeedAnMpiBuild) {
  ScopedEnv a("OMPI_COMM_WORLD_SIZE", nullptr), b("PMI_SIZE", nullptr);
  EXPECT_EQ(LaunchEnvironmentError(), "");
  ScopedEnv w("OMPI_COMM_WORLD_SIZE", "3");
  if (BuildHasMpi()) {
    EXPECT_EQ(LaunchEnvironmentError(), "");
  } else {
    EXPECT_HAS(LaunchEnvironmentError(), "built without MPI");
  }
}

TEST(LaunchEnvironmentTest, LocalLaunchChecksBeforeAnythingStarts) {
  Sweep one = ExpandSpec(Spec(R"({"seeds": [1]})"));
  EXPECT_NO_THROW(CheckLocalLaunch(one));  // one rank needs neither MPI nor mpirun
  Sweep wide = ExpandSpec(Spec(R"({"runs": [{"ranks": 1}, {"train.seed": 3, "ranks": 2}]})"));
  auto error = [&](const Sweep& s) -> std::string {
    try {
      CheckLocalLaunch(s);
    } catch (const SpecError& e) {
      return e.what();
    }
    return "";
  };
  if (!BuildHasMpi()) {
    EXPECT_HAS(error(wide), "built without MPI");
    return;
  }
  {
    ScopedEnv path("PATH", "/nonexistent");
    EXPECT_HAS(error(wide), "mpirun is not on PATH");
  }
  if (!FindOnPath("mpirun").empty()) {
    EXPECT_EQ(error(wide), "");
  }
  for (SweepRun& r : wide.runs) r.ranks = LocalRankCap() + 1;
  EXPECT_HAS(error(wide), "this machine starts at most");
  EXPECT_HAS(error(wide), "moelab sweep slurm");
}

// The scheduler starts a multi-rank run as `mpirun -np N ... moelab train ...`. A fake mpirun
// records its arguments and environment and runs the trainer once, so this checks the launch
// itself on any build; tests/dist trains real multi-rank runs.
TEST_F(LaunchRunTest, SweepStartsMultiRankRunsThroughMpirun) {
  if (!BuildHasMpi()) GTEST_SKIP() << "built without MPI: multi-rank sweeps are refused";
  const std::string args_log = (dir_ / "mpirun.log").string();
  {
    std::ofstream f(dir_ / "bin" / "mpirun");
    f << "#!/bin/bash\n"
      << "echo \"ARGS $* ROOT=${OMPI_ALLOW_RUN_AS_ROOT:-} OMP=${OMP_NUM_THREADS:-}\" >> '"
      << args_log << "'\n"
      << "while [ $# -gt 0 ]; do case \"$1\" in -np|--bind-to|-x) shift 2;; -*) shift;; "
         "*) break;; esac; done\n"
      << "exec \"$@\"\n";
  }
  fs::permissions(dir_ / "bin" / "mpirun", fs::perms::owner_all);
  ojson spec = Spec(R"({"name": "wide", "runs": [{"train.seed": 1, "ranks": 2},
                                                  {"train.seed": 2}]})");
  spec["base"] = Base(6);
  const std::string log = (dir_ / "log.txt").string();
  ASSERT_EQ(
      Moelab({"sweep", "run", WriteSpec(spec), "--db", db_, "-j", "2", "-t", "1", "--no-live"},
             log),
      0)
      << Slurp(log);
  const std::string calls = Slurp(args_log);
  // Only the 2-rank run went through mpirun.
  EXPECT_EQ(std::count(calls.begin(), calls.end(), '\n'), 1) << calls;
  EXPECT_HAS(calls, "ARGS -np 2 --bind-to none");
  EXPECT_HAS(calls, "train ");
  EXPECT_HAS(calls, "--run-id");
  EXPECT_HAS(calls, "OMP=1");
  EXPECT_HAS(calls, ::geteuid() == 0 ? "--allow-run-as-root" : "-x OPENBLAS_NUM_THREADS");
  if (::geteuid() == 0) {
    EXPECT_HAS(calls, "ROOT=1");
  }
  EXPECT_HAS(Slurp(log), "(2 ranks)");
  db::Reader reader(db_);
  const auto runs = reader.ListRuns();
  ASSERT_EQ(runs.size(), 2u);
  for (const auto& r : runs) EXPECT_EQ(r.status, RunStatus::kDone) << r.name << r.error;

  // --ranks on resume overrides the spec: a new seed now starts with 4 ranks, oversubscribed
  // on a machine with fewer cores; the done runs are reused.
  spec["runs"].push_back(ojson::parse(R"({"train.seed": 3})"));
  ASSERT_EQ(Moelab({"sweep", "run", WriteSpec(spec), "--db", db_, "-j", "4", "-t", "1", "--no-live",
                    "--ranks", "4"},
                   log),
            0)
      << Slurp(log);
  const std::string calls2 = Slurp(args_log);
  EXPECT_EQ(std::count(calls2.begin(), calls2.end(), '\n'), 2) << calls2;
  EXPECT_HAS(calls2, "ARGS -np 4 --bind-to none");
  if (std::thread::hardware_concurrency() < 4) {
    EXPECT_HAS(calls2, "--oversubscribe");
  }
  EXPECT_HAS(Slurp(log), "3 done (2 reused");

  // Misuse stops before anything trains: exit 2 with the location.
  spec["runs"].push_back(ojson::parse(R"({"train.seed": 9, "ranks": 0})"));
  EXPECT_EQ(Moelab({"sweep", "run", WriteSpec(spec), "--db", db_, "--no-live"}, log), 2);
  EXPECT_HAS(Slurp(log), "runs[3].ranks: expected an integer from 1");
  EXPECT_EQ(db::Reader(db_).ListRuns().size(), 3u);
}

}  // namespace
}  // namespace moelab::sweeps
