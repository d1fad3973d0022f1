// train.micro_batch: a step split into micro-batches equals the unsplit step (loss, gradients,
// S_max, expert counts, aux terms) up to float rounding, and a whole run follows the same
// trajectory.
#include "core/train/micro_batch.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "core/model/model.h"
#include "core/train/trainer.h"
#include "tests/common/tiny_configs.h"

namespace moelab {
namespace {

RunConfig MicroMoe(const std::string& balance) {
  RunConfig c = test::SmallMoeConfig();
  c.model.kv_heads = 2;
  c.model.z_loss = 1e-4;
  c.moe.balance = balance;
  c.data.source = "markov";
  c.train.batch_size = 8;
  c.train.threads = 1;
  return c;
}

double RelDiff(const float* a, const float* b, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; ++i) {
    num += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
    den += static_cast<double>(b[i]) * b[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

void ExpectStepMatches(const RunConfig& c, int micro) {
  Model<float> whole(c), split(c);
  whole.Init(3);
  split.Init(3);
  const std::vector<int32_t> tokens =
      test::RandomTokens<std::mt19937>(c.train.batch_size, c.model.seq_len, c.model.vocab_size, 11);
  StepStats sw, ss;
  const double ow = whole.ForwardBackward(tokens.data(), c.train.batch_size, &sw);
  RunConfig cm = c;
  cm.train.micro_batch = micro;
  const MicroBatchPlan plan = PlanMicroBatches(cm, c.train.batch_size);
  ASSERT_GT(plan.count(), 1);
  GradAccumulator acc(split.backend(), split.num_params());
  StepAuxStats aux{MoeBatchStatsHook{}};
  const bool switch_loss = c.moe.enabled() && c.moe.balance == "aux_loss";
  const double os = ForwardBackwardMicroBatched(split, tokens.data(), c.model.seq_len, plan, &ss,
                                                acc, switch_loss ? &aux : nullptr);
  EXPECT_NEAR(os, ow, 1e-5 * std::abs(ow));
  EXPECT_NEAR(ss.loss, sw.loss, 1e-5 * sw.loss);
  EXPECT_NEAR(ss.z_loss, sw.z_loss, 1e-5 * std::abs(sw.z_loss) + 1e-12);
  EXPECT_NEAR(ss.aux_loss, sw.aux_loss, 1e-5 * std::abs(sw.aux_loss) + 1e-12);
  // Per-row arithmetic, but GEMM blocking may differ with the row count: float tolerance.
  ASSERT_EQ(ss.max_logit.size(), sw.max_logit.size());
  for (size_t i = 0; i < sw.max_logit.size(); ++i) {
    EXPECT_NEAR(ss.max_logit[i], sw.max_logit[i], 1e-5 * std::abs(sw.max_logit[i]) + 1e-6);
    EXPECT_NEAR(ss.max_logit_raw[i], sw.max_logit_raw[i],
                1e-5 * std::abs(sw.max_logit_raw[i]) + 1e-6);
  }
  EXPECT_EQ(ss.expert_counts, sw.expert_counts);
  EXPECT_LT(RelDiff(split.grads(), whole.grads(), whole.num_params()), 1e-5);
}

TEST(MicroBatch, PlanCoversTheRowsOnce) {
  RunConfig c = MicroMoe("aux_free");
  c.train.micro_batch = 3;
  const MicroBatchPlan p = PlanMicroBatches(c, 8);
  ASSERT_EQ(p.count(), 3);
  EXPECT_EQ(p.size(0) + p.size(1) + p.size(2), 8);
  EXPECT_EQ(p.size(2), 2);
  EXPECT_DOUBLE_EQ(p.weight(0) + p.weight(1) + p.weight(2), 1.0);
  c.train.micro_batch = 0;
  EXPECT_EQ(PlanMicroBatches(c, 8).count(), 1);
}

TEST(MicroBatch, StepEqualsUnsplitAuxFree) { ExpectStepMatches(MicroMoe("aux_free"), 2); }
TEST(MicroBatch, StepEqualsUnsplitSwitchAuxLoss) { ExpectStepMatches(MicroMoe("aux_loss"), 2); }
TEST(MicroBatch, StepEqualsUnsplitSwitchAuxLossUneven) {
  RunConfig c = MicroMoe("aux_loss");
  c.moe.router = "sigmoid";
  ExpectStepMatches(c, 3);
}
TEST(MicroBatch, StepEqualsUnsplitUnevenSplit) { ExpectStepMatches(MicroMoe("none"), 3); }
TEST(MicroBatch, StepEqualsUnsplitDense) {
  RunConfig c = MicroMoe("none");
  c.moe.experts_total = 0;
  ExpectStepMatches(c, 1);
}

class MicroBatchRun : public ::testing::TestWithParam<const char*> {};

TEST_P(MicroBatchRun, FollowsTheUnsplitTrajectory) {
  RunConfig c = MicroMoe(GetParam());
  c.train.steps = 6;
  c.eval.every = 3;
  c.checkpoint.every = 0;
  c.optimizer.name = "muonclip";
  c.optimizer.qk_clip_tau = 5;
  struct Losses : NullSink {
    void OnStep(const StepRecord& r, const StepStats&) override { loss.push_back(r.loss); }
    void OnEval(int64_t, int64_t, double, double v) override { val.push_back(v); }
    std::vector<double> loss, val;
  };
  auto run = [&](int micro) {
    RunConfig cc = c;
    cc.train.micro_batch = micro;
    cc.checkpoint.dir = ::testing::TempDir() + "/micro_" + GetParam() + "_" + std::to_string(micro);
    Losses sink;
    TrainOptions o;
    o.progress = false;
    const TrainResult r = Train(cc, &sink, o);
    EXPECT_EQ(r.status, RunStatus::kDone) << r.error;
    return sink;
  };
  const Losses whole = run(0), split = run(2);
  EXPECT_GT(whole.loss.front(), 0);
  ASSERT_EQ(whole.loss.size(), 6u);
  ASSERT_EQ(split.loss.size(), 6u);
  for (size_t i = 0; i < whole.loss.size(); ++i)
    EXPECT_NEAR(split.loss[i], whole.loss[i], 1e-4 * whole.loss[i]) << "step " << i + 1;
  ASSERT_EQ(split.val.size(), whole.val.size());
  for (size_t i = 0; i < whole.val.size(); ++i)
    EXPECT_NEAR(split.val[i], whole.val[i], 1e-4 * whole.val[i]);
}

INSTANTIATE_TEST_SUITE_P(Balance, MicroBatchRun, ::testing::Values("aux_free", "aux_loss"));

}  // namespace
}  // namespace moelab
