// Data-parallel training end to end: `mpirun -np N moelab train` against one process.
//
// Tolerance: ranks see the same global batch (the batch is a pure function of seed and step;
// rank r takes rows r·B/N ... (r+1)·B/N−1), so np = 1, 2, 4 differ only in the order of floating-
// point sums: each rank sums its rows' gradient contributions, the all-reduce adds the N partial
// sums (in rank order, identically on every rank). That rounding (~1e-7 relative per step) is
// amplified by training; over 30 steps the losses agree to kLossTolerance. AdamW's first steps
// are sign-like (m/√v ≈ ±1), so an element whose gradient is near eps (e.g. a router row of an
// expert few tokens chose) turns rounding noise into a full-size update: the configs use
// optimizer.eps = 1e-6 (measured with 1e-8: one router element differs by 4e-4 after step 1 and
// the MoE losses by up to 2e-3 after 30 steps; with 1e-6 by at most 2e-6).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "db/reader.h"
#include "tests/dist/dist_util.h"

namespace moelab::disttest {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr double kLossTolerance = 2e-5;

std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

class DistTrainTest : public ::testing::Test {
 protected:
  void SetUp() override {
#ifndef MOELAB_HAVE_MPI
    GTEST_SKIP() << "built without MPI";
#endif
    if (!HaveMpirun()) GTEST_SKIP() << "mpirun not found";
    dir_ = fs::temp_directory_path() /
           ("moelab_dist_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override {
    if (!HasFailure() && !dir_.empty()) fs::remove_all(dir_);
  }

  // Dense or MoE MuonClip config (tiny, 1 thread per rank); extra is merged in.
  std::string Config(const std::string& name, bool moe, json extra = json::object()) {
    json c = {
        {"model",
         {{"vocab_size", 64},
          {"d_model", 32},
          {"layers", 2},
          {"heads", 2},
          {"ffn_hidden", 64},
          {"seq_len", 16}}},
        {"optimizer", {{"name", "muonclip"}, {"lr", 0.02}, {"eps", 1e-6}, {"qk_clip_tau", 0.1}}},
        {"data", {{"source", "markov"}}},
        {"train", {{"batch_size", 8}, {"steps", 30}, {"threads", 1}}},
        {"schedule", {{"warmup_steps", 3}}},
        {"eval", {{"every", 10}, {"batches", 2}}},
        {"checkpoint", {{"every", 10}, {"keep", 5}}}};
    if (moe) {
      c["moe"] = {{"experts_total", 4},  {"experts_active", 2},   {"expert_hidden", 32},
                  {"shared_experts", 1}, {"balance", "aux_free"}, {"bias_update_rate", 1e-2}};
    }
    c.merge_patch(extra);
    const std::string path = (dir_ / (name + ".json")).string();
    std::ofstream(path) << c.dump(2);
    return path;
  }

  // `[mpirun -np N] moelab train cfg --db db --checkpoint-dir dir/<tag> args`; returns the exit
  // code, the output goes to dir/<tag>.log.
  int Train(int np, const std::string& cfg, const std::string& tag, const std::string& args = "") {
    const std::string cmd = Mpirun(np) + BinDir() + "/moelab train " + cfg + " --db " + Db(tag) +
                            " --checkpoint-dir " + Ckpt(tag) + " --no-progress " + args + " > " +
                            Log(tag) + " 2>&1";
    return Shell(cmd);
  }
  std::string Db(const std::string& tag) const { return (dir_ / (tag + ".db")).string(); }
  std::string Ckpt(const std::string& tag) const { return (dir_ / tag).string(); }
  std::string Log(const std::string& tag) const { return (dir_ / (tag + ".log")).string(); }

  // The database's only run (asserting there is exactly one) and its loss curve.
  db::RunRow OnlyRun(const std::string& tag) {
    std::vector<db::RunRow> runs = db::Reader(Db(tag)).ListRuns();
    EXPECT_EQ(runs.size(), 1u) << tag;
    return runs.empty() ? db::RunRow{} : runs[0];
  }
  db::Series Series(const std::string& tag, const std::string& key) {
    const db::RunRow r = OnlyRun(tag);
    return db::Reader(Db(tag)).GetSeries(r.id, key);
  }
  // Largest |a − b| over the steps of two loss curves (which must have the same steps).
  double MaxDiff(const db::Series& a, const db::Series& b) {
    EXPECT_EQ(a.steps, b.steps);
    double d = 0;
    for (size_t i = 0; i < std::min(a.values.size(), b.values.size()); ++i) {
      d = std::max(d, std::abs(a.values[i] - b.values[i]));
    }
    return d;
  }

  void SameLossesAtOneTwoFour(bool moe) {
    const std::string cfg = Config("run", moe);
    for (int np : {1, 2, 4}) {
      const std::string tag = "np" + std::to_string(np);
      ASSERT_EQ(Train(np, cfg, tag), 0) << Slurp(Log(tag));
      const db::RunRow r = OnlyRun(tag);
      EXPECT_EQ(r.status, "done");
      EXPECT_EQ(r.ranks, np);
      EXPECT_EQ(r.dp_size, np);
      EXPECT_EQ(r.ep_size, 1);
      EXPECT_EQ(r.last_step, 30);
      EXPECT_EQ(r.tokens, 30 * 8 * 16);  // the global batch, whatever the rank count
    }
    const db::Series ref = Series("np1", "loss");
    ASSERT_EQ(ref.values.size(), 30u);
    for (int np : {2, 4}) {
      const std::string tag = "np" + std::to_string(np);
      const double loss = MaxDiff(ref, Series(tag, "loss"));
      const double val = MaxDiff(Series("np1", "val_loss"), Series(tag, "val_loss"));
      const double gn = MaxDiff(Series("np1", "grad_norm"), Series(tag, "grad_norm"));
      std::printf(
          "%s np=%d vs np=1 over 30 steps: max |loss diff| %.3g, val %.3g, grad norm %.3g\n",
          moe ? "MoE" : "dense", np, loss, val, gn);
      EXPECT_LT(loss, kLossTolerance) << "np=" << np;
      EXPECT_LT(val, kLossTolerance) << "np=" << np;
    }
    // QK-Clip acted (S_max reaches ~0.17 in 30 steps), on the MAX-reduced S_max.
    db::Reader reader(Db("np2"));
    EXPECT_FALSE(reader.ClipEvents(OnlyRun("np2").id).empty());
  }

  fs::path dir_;
};

TEST_F(DistTrainTest, DenseMuonClipSameLossesAtOneTwoFourRanks) { SameLossesAtOneTwoFour(false); }

TEST_F(DistTrainTest, MoeMuonClipSameLossesAtOneTwoFourRanks) { SameLossesAtOneTwoFour(true); }

// A checkpoint written at one rank count resumes at another on the same trajectory.
TEST_F(DistTrainTest, ResumeAtOtherRankCounts) {
  const std::string cfg = Config("run", true);
  ASSERT_EQ(Train(2, cfg, "ref"), 0) << Slurp(Log("ref"));
  const db::Series ref = Series("ref", "loss");
  for (auto [first, second] : {std::pair{1, 2}, std::pair{2, 1}}) {
    const std::string tag = "r" + std::to_string(first) + std::to_string(second);
    ASSERT_EQ(Train(first, cfg, tag, "--stop-at-step 20"), 4) << Slurp(Log(tag));
    EXPECT_EQ(OnlyRun(tag).status, "stopped");
    ASSERT_EQ(Train(second, cfg, tag, "--resume"), 0) << Slurp(Log(tag));
    const db::RunRow r = OnlyRun(tag);
    EXPECT_EQ(r.status, "done");
    EXPECT_EQ(r.ranks, second);
    const db::Series s = Series(tag, "loss");
    const double d = MaxDiff(ref, s);
    std::printf("resume np=%d -> np=%d: max |loss diff| vs uninterrupted np=2 %.3g\n", first,
                second, d);
    EXPECT_LT(d, kLossTolerance);
  }
}

// The newest checkpoint is corrupt: resume falls back to the one before with a warning and
// records nothing twice.
TEST_F(DistTrainTest, CorruptNewestCheckpointFallsBackToNewestValid) {
  const std::string cfg = Config("run", false, {{"checkpoint", {{"every", 5}}}});
  ASSERT_EQ(Train(2, cfg, "ref"), 0) << Slurp(Log("ref"));
  ASSERT_EQ(Train(2, cfg, "c", "--stop-at-step 20"), 4) << Slurp(Log("c"));
  const fs::path newest = fs::path(Ckpt("c")) / "step_000000020.ckpt";
  ASSERT_TRUE(fs::exists(newest));
  {
    std::fstream f(newest, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(fs::file_size(newest) / 2));
    f.write("corrupt!", 8);
  }
  ASSERT_EQ(Train(2, cfg, "c", "--resume"), 0) << Slurp(Log("c"));
  const std::string log = Slurp(Log("c"));
  EXPECT_NE(log.find("warning: skipping checkpoint"), std::string::npos) << log;
  EXPECT_NE(log.find("checksum mismatch"), std::string::npos) << log;
  const db::Series s = Series("c", "loss");
  ASSERT_EQ(s.steps.size(), 30u);
  for (size_t i = 0; i < s.steps.size(); ++i) EXPECT_EQ(s.steps[i], static_cast<int64_t>(i + 1));
  EXPECT_LT(MaxDiff(Series("ref", "loss"), s), kLossTolerance);
}

// Misuse is a config error before anything trains.
TEST_F(DistTrainTest, LayoutMisuseExitsTwo) {
  const std::string cfg = Config("run", true, {{"train", {{"batch_size", 6}}}});
  EXPECT_EQ(Train(4, cfg, "batch"), 2);
  EXPECT_NE(Slurp(Log("batch")).find("does not split evenly over 4"), std::string::npos)
      << Slurp(Log("batch"));
  EXPECT_FALSE(fs::exists(Db("batch")));
  const std::string ep = Config("ep", true, {{"dist", {{"expert_parallel", 2}}}});
  EXPECT_EQ(Train(3, ep, "ep"), 2);
  EXPECT_NE(Slurp(Log("ep")).find("not divisible by the expert-parallel size 2"), std::string::npos)
      << Slurp(Log("ep"));
  const std::string many = Config("many", true, {{"dist", {{"expert_parallel", 8}}}});
  EXPECT_EQ(Train(0, many, "many"), 2);
  EXPECT_NE(Slurp(Log("many")).find("exceed the 4 experts"), std::string::npos)
      << Slurp(Log("many"));
}

}  // namespace
}  // namespace moelab::disttest
