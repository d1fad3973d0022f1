#include <gtest/gtest.h>

#include <string>

#include "core/optim/optimizer.h"
#include "core/train/progress.h"

namespace moelab {
namespace {

TEST(Schedule, WarmupThenShapes) {
  ScheduleConfig s;
  s.warmup_steps = 10;
  s.min_lr_ratio = 0.1;
  for (const char* type : {"constant", "cosine", "linear", "wsd"}) {
    s.type = type;
    EXPECT_DOUBLE_EQ(ScheduledLr(s, 1.0, 5, 100), 0.5) << type;
    EXPECT_DOUBLE_EQ(ScheduledLr(s, 1.0, 10, 100), 1.0) << type;
  }
  s.type = "constant";
  EXPECT_DOUBLE_EQ(ScheduledLr(s, 1.0, 100, 100), 1.0);
  s.type = "cosine";
  EXPECT_NEAR(ScheduledLr(s, 1.0, 55, 100), 0.55, 1e-12);  // halfway: (1 + 0.1) / 2
  EXPECT_NEAR(ScheduledLr(s, 1.0, 100, 100), 0.1, 1e-12);
  s.type = "linear";
  EXPECT_NEAR(ScheduledLr(s, 1.0, 55, 100), 0.55, 1e-12);
  EXPECT_NEAR(ScheduledLr(s, 1.0, 100, 100), 0.1, 1e-12);
}

TEST(Schedule, WsdStableThenDecay) {
  const ScheduleConfig s{
      .type = "wsd", .warmup_steps = 10, .min_lr_ratio = 0.0, .decay_fraction = 0.2};
  EXPECT_DOUBLE_EQ(ScheduledLr(s, 2.0, 80, 100), 2.0);  // last stable step
  EXPECT_NEAR(ScheduledLr(s, 2.0, 90, 100), 1.0, 1e-12);
  EXPECT_NEAR(ScheduledLr(s, 2.0, 100, 100), 0.0, 1e-12);
  // Runs differing only in length share the stable phase.
  for (int step = 1; step <= 80; ++step) {
    EXPECT_DOUBLE_EQ(ScheduledLr(s, 2.0, step, 100), ScheduledLr(s, 2.0, step, 200));
  }
}

}  // namespace
}  // namespace moelab

namespace moelab {
namespace {

// A run stopped part-way ends on a bar that shows how far it got, not a full one (issue 24).
TEST(ProgressBar, StoppedRunShowsHowFarItGot) {
  ::testing::internal::CaptureStderr();
  {
    ProgressBar bar("train", 100, true);
    bar.Finish("stopped at step 40", 40);
  }
  const std::string out = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(out.find("40/100"), std::string::npos) << out;
  EXPECT_NE(out.find(" 40%"), std::string::npos) << out;
  EXPECT_EQ(out.find("100%"), std::string::npos) << out;
  ::testing::internal::CaptureStderr();
  {
    ProgressBar bar("train", 100, true);
    bar.Finish("done");
  }
  EXPECT_NE(::testing::internal::GetCapturedStderr().find("100/100"), std::string::npos);
}

}  // namespace
}  // namespace moelab
