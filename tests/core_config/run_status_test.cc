#include "core/run_status.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <sstream>
#include <stdexcept>
#include <string>

namespace moelab {
namespace {

using ::testing::HasSubstr;

// The spellings are the runs.status column's values: old databases hold exactly these.
TEST(RunStatus, StoredSpellingsAreStable) {
  EXPECT_STREQ(ToString(RunStatus::kQueued), "queued");
  EXPECT_STREQ(ToString(RunStatus::kRunning), "running");
  EXPECT_STREQ(ToString(RunStatus::kDone), "done");
  EXPECT_STREQ(ToString(RunStatus::kFailed), "failed");
  EXPECT_STREQ(ToString(RunStatus::kDiverged), "diverged");
  EXPECT_STREQ(ToString(RunStatus::kStopped), "stopped");
}

TEST(RunStatus, RoundTripsThroughItsString) {
  for (RunStatus s : kAllRunStatuses) {
    EXPECT_EQ(ParseRunStatus(ToString(s)), s);
    EXPECT_EQ(TryParseRunStatus(ToString(s)), s);
    std::ostringstream os;
    os << s;
    EXPECT_EQ(os.str(), ToString(s));
  }
}

TEST(RunStatus, UnknownStringIsAClearError) {
  EXPECT_THAT([] { ParseRunStatus("exploded"); },
              ::testing::ThrowsMessage<std::invalid_argument>(
                  HasSubstr("unknown run status 'exploded' (known: queued, running, done")));
  EXPECT_THROW(ParseRunStatus(""), std::invalid_argument);
  EXPECT_THROW(ParseRunStatus("Done"), std::invalid_argument);  // case matters, as in the db
  EXPECT_EQ(TryParseRunStatus("exploded"), std::nullopt);
}

TEST(RunStatus, OnlyQueuedAndRunningAreNotTerminal) {
  for (RunStatus s : kAllRunStatuses) {
    EXPECT_EQ(IsTerminal(s), s != RunStatus::kQueued && s != RunStatus::kRunning) << s;
  }
}

}  // namespace
}  // namespace moelab
