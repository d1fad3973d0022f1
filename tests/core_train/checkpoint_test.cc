#include "core/train/checkpoint.h"

#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

namespace moelab {
namespace {

namespace fs = std::filesystem;

class CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("moelab_ckpt_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

TEST_F(CheckpointTest, RoundTripAndKeep) {
  std::vector<float> params = {1, 2, 3, 4}, bias = {0.5f}, m = {9, 8}, out(4), out_bias(1),
                     m2(2);
  std::vector<StateBuffer> state = {{"m", &m}};
  for (int step : {10, 20, 30}) {
    params[0] = step;
    WriteCheckpoint(dir_.string(), {"abc", "fam", step, step * 100, step * 1e9}, params, bias, state, 2);
  }
  // Only the newest two are kept.
  EXPECT_TRUE(CheckpointAtStep(dir_.string(), 10).empty());
  EXPECT_FALSE(CheckpointAtStep(dir_.string(), 20).empty());
  const std::string latest = LatestCheckpoint(dir_.string());
  EXPECT_EQ(CheckpointStepOf(latest), 30);
  std::vector<StateBuffer> state2 = {{"m", &m2}};
  const CheckpointHeader h = ReadCheckpoint(latest, "abc", out, out_bias, state2);
  EXPECT_EQ(h.step, 30);
  EXPECT_EQ(h.tokens, 3000);
  EXPECT_EQ(out, (std::vector<float>{30, 2, 3, 4}));
  EXPECT_EQ(out_bias, bias);
  EXPECT_EQ(m2, m);
  // No temp files left behind.
  for (const auto& e : fs::directory_iterator(dir_)) EXPECT_EQ(e.path().extension(), ".ckpt");
}

TEST_F(CheckpointTest, DetectsCorruptionWrongConfigAndShape) {
  std::vector<float> params = {1, 2, 3}, bias, out(3), wrong(4);
  const std::string path = WriteCheckpoint(dir_.string(), {"abc", "fam", 1, 0, 0}, params, bias, {}, 3);
  EXPECT_THROW(ReadCheckpoint(path, "other", out, bias, {}), std::runtime_error);
  EXPECT_THROW(ReadCheckpoint(path, "abc", wrong, bias, {}), std::runtime_error);
  {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(30);
    f.put('\x7f');
  }
  try {
    ReadCheckpoint(path, "abc", out, bias, {});
    FAIL();
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("checksum"), std::string::npos) << e.what();
  }
  fs::resize_file(path, 20);
  EXPECT_THROW(ReadCheckpoint(path, "abc", out, bias, {}), std::runtime_error);
}

}  // namespace
}  // namespace moelab
