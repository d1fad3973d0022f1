// The watched wait behind every NCCL collective (core/comm/collective_wait.h): it returns once the
// poll says done, throws naming the wait and NCCL's reason when the poll fails, and throws naming
// the time-out instead of waiting forever for a peer that never comes. No GPU or NCCL needed: the
// poll is a fake.
#include "core/comm/collective_wait.h"

#include <gtest/gtest.h>

#include <chrono>
#include <stdexcept>
#include <string>

#include "tests/common/test_util.h"

namespace moelab {
namespace {

// A poll that is pending until its n-th call and done from then on, counting its calls in *polls.
auto DoneOnCall(int n, int* polls) {
  return [n, polls](std::string*) {
    return ++*polls < n ? CollectiveState::kPending : CollectiveState::kDone;
  };
}

TEST(CollectiveWait, ReturnsWhenThePollIsDone) {
  int polls = 0;
  WaitWatched(DoneOnCall(5, &polls), 1.0, "all-reduce");
  EXPECT_EQ(polls, 5);
}

TEST(CollectiveWait, AFailedPollThrowsNamingTheWaitAndTheReason) {
  int polls = 0;
  try {
    WaitWatched(
        [&](std::string* why) {
          if (++polls < 3) return CollectiveState::kPending;
          *why = "NCCL: remote process exited or there was a network error";
          return CollectiveState::kFailed;
        },
        0, "all-reduce of 12 floats");
    ADD_FAILURE() << "a failed collective returned";
  } catch (const std::runtime_error& e) {
    EXPECT_EQ(std::string(e.what()),
              "all-reduce of 12 floats: NCCL: remote process exited or there was a network error");
  }
  EXPECT_EQ(polls, 3);
}

// A peer that never arrives: the wait ends after the limit (here 50 ms) with the limit's variable
// named, instead of hanging; with no limit (0) the poll decides alone.
TEST(CollectiveWait, APendingCollectiveTimesOut) {
  const auto start = std::chrono::steady_clock::now();
  try {
    WaitWatched([](std::string*) { return CollectiveState::kPending; }, 0.05, "barrier");
    ADD_FAILURE() << "a collective pending forever returned";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("barrier: still pending after"), std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("MOELAB_NCCL_TIMEOUT_S"), std::string::npos) << e.what();
  }
  const double took =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_GE(took, 0.05);
  EXPECT_LT(took, 5.0);
  int polls = 0;
  WaitWatched(DoneOnCall(2000, &polls), 0, "no limit");
  EXPECT_EQ(polls, 2000);
}

TEST(CollectiveWait, TimeoutComesFromTheEnvironment) {
  test::ScopedEnv timeout("MOELAB_NCCL_TIMEOUT_S", nullptr);
  EXPECT_EQ(CollectiveTimeoutSeconds(), 1800);
  timeout.Set("90");
  EXPECT_EQ(CollectiveTimeoutSeconds(), 90);
  timeout.Set("0");
  EXPECT_EQ(CollectiveTimeoutSeconds(), 0);
  for (const char* bad : {"-1", "ten", "5s", "nan"}) {
    timeout.Set(bad);
    try {
      CollectiveTimeoutSeconds();
      ADD_FAILURE() << "accepted " << bad;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("MOELAB_NCCL_TIMEOUT_S"), std::string::npos);
    }
  }
}

}  // namespace
}  // namespace moelab
