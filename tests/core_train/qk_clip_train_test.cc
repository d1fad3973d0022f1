// The trainer-level QK-Clip wiring: the events the trainer reports must be exactly the heads
// whose step-t forward logits exceeded τ, with γ = τ / S_max, in per-head and global mode, and
// no event at all when τ is above every logit or QK-Clip is off.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <set>
#include <tuple>

#include "core/train/trainer.h"
#include "tests/common/fresh_dir_test.h"
#include "tests/common/tiny_configs.h"

namespace moelab {
namespace {

class ClipSink : public MetricsSink {
 public:
  void OnStep(const StepRecord&, const StepStats& s) override { raw.push_back(s.max_logit_raw); }
  void OnEval(int64_t, int64_t, double, double) override {}
  void OnClip(const std::vector<ClipEvent>& e) override {
    calls++;
    clips.insert(clips.end(), e.begin(), e.end());
  }
  void OnHeartbeat() override {}
  void OnCheckpoint(int64_t, const std::string&) override {}
  void OnEnd(RunStatus, const std::string&) override {}
  std::vector<std::vector<float>> raw;  // per step, [layers * heads]
  std::vector<ClipEvent> clips;
  int calls = 0;
};

RunConfig Small(const std::string& optimizer) {
  RunConfig c = test::SmallMoeConfig();
  c.model.seq_len = 32;
  test::UseShortMarkovRun(&c, /*batch_size=*/4, /*steps=*/6);
  c.train.threads = 1;
  c.schedule.warmup_steps = 2;
  c.optimizer.name = optimizer;
  c.optimizer.lr = 1e-2;
  return c;
}

class QkClipTrain : public test::FreshDirTest {
 protected:
  QkClipTrain() : FreshDirTest("qkclip") {}
  ClipSink Run(RunConfig c, const std::string& sub) {
    ValidateConfig(c);
    TrainOptions o;
    o.checkpoint_dir = (dir_ / sub).string();
    o.progress = false;
    ClipSink sink;
    const TrainResult r = Train(c, &sink, o);
    EXPECT_EQ(r.status, RunStatus::kDone) << r.error;
    return sink;
  }
};

// Step 1's forward does not depend on τ (the clip edits the weights after the step), so the
// unclipped run's step-1 logits predict exactly which heads the clipped run rescales.
TEST_F(QkClipTrain, PerHeadEventsAreTheHeadsAboveTau) {
  RunConfig c = Small("muon");  // Muon without the clip; MuonClip below
  const ClipSink off = Run(c, "off");
  EXPECT_TRUE(off.clips.empty());
  EXPECT_EQ(off.calls, 0);
  ASSERT_FALSE(off.raw.empty());
  std::vector<float> s1 = off.raw.front();
  ASSERT_EQ(s1.size(), 2u * 4);
  std::vector<float> sorted = s1;
  std::sort(sorted.begin(), sorted.end());
  const double tau = 0.5 * (sorted[3] + sorted[4]);  // half the heads above τ at step 1
  ASSERT_GT(tau, 0);

  c.optimizer.name = "muonclip";
  c.optimizer.qk_clip_tau = tau;
  c.optimizer.qk_clip_mode = "per_head";
  const ClipSink on = Run(c, "on");
  std::set<std::pair<int, int>> expected, got;
  for (int l = 0; l < 2; ++l)
    for (int h = 0; h < 4; ++h)
      if (s1[l * 4 + h] > tau) expected.insert({l, h});
  ASSERT_FALSE(expected.empty());
  ASSERT_FALSE(on.clips.empty());
  for (const ClipEvent& e : on.clips) {
    EXPECT_GE(e.step, 1);
    EXPECT_LE(e.step, c.train.steps);
    ASSERT_GE(e.layer, 0);
    ASSERT_LT(e.layer, 2);
    ASSERT_GE(e.head, 0);
    ASSERT_LT(e.head, 4);
    EXPECT_GT(e.s_max, tau);
    EXPECT_NEAR(e.gamma, tau / e.s_max, 1e-12);
    EXPECT_LT(e.gamma, 1.0);
    // The event's S_max is the step's recorded forward statistic of that head.
    EXPECT_FLOAT_EQ(static_cast<float>(e.s_max), on.raw.at(e.step - 1).at(e.layer * 4 + e.head));
    if (e.step == 1) got.insert({e.layer, e.head});
  }
  EXPECT_EQ(got, expected);
  // Clipping changed the run: the next step's logits differ from the unclipped run's.
  EXPECT_NE(on.raw.at(1), off.raw.at(1));
}

TEST_F(QkClipTrain, GlobalModeRescalesEveryHeadOfAClippedLayer) {
  RunConfig c = Small("adamw");    // QK-Clip is independent of the optimizer
  c.optimizer.qk_clip_tau = 1e-3;  // below every logit: every layer clips at every step
  c.optimizer.qk_clip_mode = "global";
  const ClipSink on = Run(c, "global");
  ASSERT_EQ(on.clips.size(), static_cast<size_t>(c.train.steps) * 2 * 4);
  std::map<std::pair<int64_t, int>, std::vector<ClipEvent>> by_layer;
  for (const ClipEvent& e : on.clips) by_layer[{e.step, e.layer}].push_back(e);
  ASSERT_EQ(by_layer.size(), static_cast<size_t>(c.train.steps) * 2);
  for (const auto& [key, events] : by_layer) {
    ASSERT_EQ(events.size(), 4u);
    double s_max = 0;
    for (const ClipEvent& e : events) s_max = std::max(s_max, e.s_max);
    for (const ClipEvent& e : events) EXPECT_NEAR(e.gamma, 1e-3 / s_max, 1e-15);
  }
}

TEST_F(QkClipTrain, TauAboveEveryLogitNeverClips) {
  RunConfig c = Small("muonclip");
  c.optimizer.qk_clip_tau = 1e6;
  const ClipSink on = Run(c, "high");
  EXPECT_TRUE(on.clips.empty());
  EXPECT_EQ(on.calls, 0);
}

}  // namespace
}  // namespace moelab
