#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "core/train/checkpoint.h"
#include "core/train/trainer.h"
#include "tests/common/fresh_dir_test.h"
#include "tests/common/tiny_configs.h"

namespace moelab {
namespace {

// Keeps what the trainer reports, for comparison between runs.
class RecordingSink : public MetricsSink {
 public:
  void OnStep(const StepRecord& r, const StepStats& s) override {
    steps.push_back(r);
    max_logits.push_back(s.max_logit);
    counts.push_back(s.expert_counts);
  }
  void OnEval(int64_t step, int64_t, double, double v) override { evals.push_back({step, v}); }
  void OnClip(const std::vector<ClipEvent>& e) override {
    clips.insert(clips.end(), e.begin(), e.end());
  }
  void OnHeartbeat() override { ++heartbeats; }
  void OnCheckpoint(int64_t step, const std::string&) override { checkpoints.push_back(step); }
  void OnEnd(RunStatus s, const std::string& e) override {
    status = s;
    error = e;
  }
  std::vector<StepRecord> steps;
  std::vector<std::vector<float>> max_logits;
  std::vector<std::vector<int64_t>> counts;
  std::vector<std::pair<int64_t, double>> evals;
  std::vector<ClipEvent> clips;
  std::vector<int64_t> checkpoints;
  int heartbeats = 0;
  RunStatus status = RunStatus::kRunning;
  std::string error;
};

RunConfig SmallMoe() {
  RunConfig c = test::SmallMoeConfig();
  c.model.kv_heads = 2;
  c.model.seq_len = 32;
  c.moe.balance = "aux_free";
  test::UseShortMarkovRun(&c, /*batch_size=*/4, /*steps=*/24);
  c.eval.every = 8;
  c.eval.batches = 2;
  c.checkpoint.every = 8;
  c.train.threads = 2;
  c.schedule.warmup_steps = 4;
  c.optimizer.lr = 3e-3;
  ValidateConfig(c);
  return c;
}

class TrainTest : public test::FreshDirTest {
 protected:
  TrainTest() : FreshDirTest("train") {}
  TrainOptions Options(const std::string& sub) {
    TrainOptions o;
    o.checkpoint_dir = (dir_ / sub).string();
    o.progress = false;
    return o;
  }
};

TEST_F(TrainTest, LearnsAndReportsEverything) {
  const RunConfig c = SmallMoe();
  RecordingSink sink;
  const TrainResult r = Train(c, &sink, Options("a"));
  ASSERT_EQ(r.status, RunStatus::kDone) << r.error;
  ASSERT_EQ(sink.steps.size(), 24u);
  EXPECT_LT(sink.steps.back().loss, sink.steps.front().loss - 0.05);
  EXPECT_EQ(sink.steps.back().tokens, 24 * 4 * 32);
  EXPECT_GT(sink.steps.back().flops, 0);
  EXPECT_EQ(sink.evals.size(), 3u);  // steps 8, 16, 24
  EXPECT_EQ(sink.checkpoints, (std::vector<int64_t>{8, 16, 24}));
  EXPECT_EQ(sink.max_logits.back().size(), 2u * 4);
  EXPECT_EQ(sink.counts.back().size(), 1u * 4);
  int64_t assigned = 0;
  for (int64_t n : sink.counts.back()) assigned += n;
  EXPECT_EQ(assigned, 4 * 32 * 2);  // every token picks top-2
  EXPECT_GE(sink.heartbeats, 1);
  EXPECT_EQ(sink.status, RunStatus::kDone);
  // The attention norm gains start at 1 and AdamW moves them a little every step.
  for (const StepRecord& s : sink.steps) ASSERT_TRUE(std::isfinite(s.norm_gain_rms));
  EXPECT_NEAR(sink.steps.front().norm_gain_rms, 1.0, 0.01);
  EXPECT_GT(std::fabs(sink.steps.back().norm_gain_rms - 1.0), 1e-4);
}

TEST_F(TrainTest, SameSeedSameThreadsGivesIdenticalLosses) {
  const RunConfig c = SmallMoe();
  RecordingSink a, b;
  Train(c, &a, Options("a"));
  Train(c, &b, Options("b"));
  ASSERT_EQ(a.steps.size(), b.steps.size());
  for (size_t i = 0; i < a.steps.size(); ++i) {
    EXPECT_EQ(a.steps[i].loss, b.steps[i].loss) << "step " << i + 1;
    EXPECT_EQ(a.steps[i].grad_norm, b.steps[i].grad_norm) << "step " << i + 1;
  }
}

// N steps in one go and N/2 + resume + N/2 give bit-identical losses, for a dense AdamW run and
// a MoE run with aux-loss-free router biases (which live in the checkpoint too).
TEST_F(TrainTest, ResumeContinuesTheExactTrajectory) {
  for (bool moe : {false, true}) {
    RunConfig c = SmallMoe();
    if (!moe) c.moe.experts_total = 0;
    c.checkpoint.every = 0;  // only the stop and the end write checkpoints
    RecordingSink whole, first, second;
    Train(c, &whole, Options(moe ? "whole_moe" : "whole"));
    TrainOptions o = Options(moe ? "split_moe" : "split");
    o.stop_at_step = 12;
    const TrainResult r1 = Train(c, &first, o);
    ASSERT_EQ(r1.status, RunStatus::kStopped);
    ASSERT_EQ(r1.steps_done, 12);
    o.stop_at_step = -1;
    o.resume = true;
    const TrainResult r2 = Train(c, &second, o);
    ASSERT_EQ(r2.status, RunStatus::kDone) << r2.error;
    EXPECT_EQ(r2.start_step, 12);
    ASSERT_EQ(first.steps.size() + second.steps.size(), whole.steps.size());
    for (size_t i = 0; i < whole.steps.size(); ++i) {
      const StepRecord& s = i < 12 ? first.steps[i] : second.steps[i - 12];
      EXPECT_EQ(s.step, whole.steps[i].step);
      EXPECT_EQ(s.loss, whole.steps[i].loss) << "moe " << moe << " step " << i + 1;
      EXPECT_EQ(s.tokens, whole.steps[i].tokens);
    }
    EXPECT_EQ(second.evals.back().second, whole.evals.back().second);
  }
}

// WSD branching: a short run started from the long run's checkpoint at the short run's decay
// start gives the same losses as the short run trained from scratch.
TEST_F(TrainTest, WsdBranchEqualsTrainingFromScratch) {
  RunConfig long_run = SmallMoe();
  long_run.schedule.type = "wsd";
  long_run.schedule.decay_fraction = 0.25;
  long_run.train.steps = 24;
  RunConfig short_run = long_run;
  short_run.train.steps = 16;  // decays over steps 13..16
  ASSERT_EQ(BranchHash(long_run), BranchHash(short_run));
  ASSERT_NE(ConfigHash(long_run), ConfigHash(short_run));

  TrainOptions lo = Options("long");
  lo.branch_steps = {12};
  RecordingSink long_sink, scratch, branched;
  ASSERT_EQ(Train(long_run, &long_sink, lo).status, RunStatus::kDone);
  const std::string branch = CheckpointAtStep(BranchCheckpointDir(lo.checkpoint_dir), 12);
  ASSERT_FALSE(branch.empty());

  Train(short_run, &scratch, Options("scratch"));
  TrainOptions bo = Options("branched");
  bo.init_from = branch;
  const TrainResult r = Train(short_run, &branched, bo);
  ASSERT_EQ(r.status, RunStatus::kDone) << r.error;
  EXPECT_EQ(r.start_step, 12);
  ASSERT_EQ(branched.steps.size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(branched.steps[i].step, scratch.steps[12 + i].step);
    EXPECT_EQ(branched.steps[i].loss, scratch.steps[12 + i].loss) << "step " << 13 + i;
    EXPECT_EQ(branched.steps[i].lr, scratch.steps[12 + i].lr);
  }
  // The stable phases agree too, and a different family is refused.
  for (size_t i = 0; i < 12; ++i) EXPECT_EQ(long_sink.steps[i].loss, scratch.steps[i].loss);
  RunConfig other = short_run;
  other.optimizer.lr *= 2;
  RecordingSink refused;
  bo.checkpoint_dir = (dir_ / "other").string();
  EXPECT_EQ(Train(other, &refused, bo).status, RunStatus::kFailed);
}

TEST_F(TrainTest, StopFlagCheckpointsAndStops) {
  RunConfig c = SmallMoe();
  std::atomic<bool> stop{true};
  TrainOptions o = Options("s");
  o.stop_flag = &stop;
  RecordingSink sink;
  const TrainResult r = Train(c, &sink, o);
  EXPECT_EQ(r.status, RunStatus::kStopped);
  EXPECT_EQ(r.steps_done, 0);
  EXPECT_EQ(sink.status, RunStatus::kStopped);
}

TEST_F(TrainTest, NanLossMarksDiverged) {
  RunConfig c = SmallMoe();
  c.moe.experts_total = 0;
  c.optimizer.lr = 1e6;
  c.optimizer.grad_clip = 0;
  c.schedule.type = "constant";
  c.schedule.warmup_steps = 0;
  c.train.steps = 200;
  RecordingSink sink;
  const TrainResult r = Train(c, &sink, Options("d"));
  EXPECT_EQ(r.status, RunStatus::kDiverged);
  EXPECT_LT(r.steps_done, 200);
  EXPECT_NE(r.error.find("step"), std::string::npos);
  EXPECT_EQ(sink.status, RunStatus::kDiverged);
  EXPECT_FALSE(std::isfinite(sink.steps.back().loss) && std::isfinite(sink.steps.back().grad_norm));
}

TEST_F(TrainTest, MissingCorpusFailsClearly) {
  RunConfig c = SmallMoe();
  c.data.source = "corpus";
  c.data.path = (dir_ / "nothing").string();
  RecordingSink sink;
  const TrainResult r = Train(c, &sink, Options("m"));
  EXPECT_EQ(r.status, RunStatus::kFailed);
  EXPECT_NE(r.error.find("moelab data prepare"), std::string::npos) << r.error;
}

}  // namespace
}  // namespace moelab
