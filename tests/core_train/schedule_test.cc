#include <gtest/gtest.h>

#include "core/optim/optimizer.h"

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
  ScheduleConfig s;
  s.type = "wsd";
  s.warmup_steps = 10;
  s.decay_fraction = 0.2;
  s.min_lr_ratio = 0.0;
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
