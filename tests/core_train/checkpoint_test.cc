#include "core/train/checkpoint.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "tests/common/fresh_dir_test.h"

namespace moelab {
namespace {

namespace fs = std::filesystem;

// A format-1 checkpoint (before runs had UUIDs), byte for byte as the old writer made it.
void WriteFormat1(const std::string& path, const std::string& hash, int64_t step,
                  const std::vector<float>& params, const std::vector<float>& bias) {
  std::string b = "MOECKPT1";
  const auto raw = [&](const void* p, size_t n) { b.append(static_cast<const char*>(p), n); };
  const auto str = [&](const std::string& v) {
    const uint64_t n = v.size();
    raw(&n, 8);
    raw(v.data(), n);
  };
  const auto floats = [&](const std::vector<float>& v) {
    const uint64_t n = v.size();
    raw(&n, 8);
    raw(v.data(), n * sizeof(float));
  };
  str(hash);
  str("fam");
  const int64_t tokens = step * 100;
  const double flops = 0;
  raw(&step, 8);
  raw(&tokens, 8);
  raw(&flops, 8);
  floats(params);
  floats(bias);
  const uint64_t buffers = 0;
  raw(&buffers, 8);
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : b) h = (h ^ c) * 1099511628211ull;
  raw(&h, 8);
  std::ofstream(path, std::ios::binary) << b;
}

std::vector<int64_t> Steps(const std::vector<std::string>& paths) {
  std::vector<int64_t> out;
  for (const std::string& p : paths) out.push_back(CheckpointStepOf(p));
  return out;
}

class CheckpointTest : public test::FreshDirTest {
 protected:
  CheckpointTest() : FreshDirTest("ckpt") {}
};

TEST_F(CheckpointTest, RoundTripAndKeep) {
  std::vector<float> params = {1, 2, 3, 4}, bias = {0.5f}, m = {9, 8}, out(4), out_bias(1), m2(2);
  std::vector<StateBuffer> state = {{"m", &m}};
  for (int step : {10, 20, 30}) {
    params[0] = step;
    WriteCheckpoint(dir_.string(), {"abc", "fam", step, step * 100, step * 1e9, ""}, params, bias,
                    state, 2);
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
  const std::string path =
      WriteCheckpoint(dir_.string(), {"abc", "fam", 1, 0, 0, ""}, params, bias, {}, 3);
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

// Two runs in one folder (an explicit --checkpoint-dir, or the old per-config layout): each
// prunes only its own files, never overwrites the other's at the same step, and resume lists
// only its own, saying why it passes over the other's. Before run UUIDs, B's second write
// pruned A's newest checkpoint and a resume of B took A's step 30.
TEST_F(CheckpointTest, PruningAndResumeArePerRun) {
  const std::string a = "aaaaaaaa-0000-4000-8000-000000000001";
  const std::string b = "bbbbbbbb-0000-4000-8000-000000000002";
  std::vector<float> params = {1, 2}, bias;
  for (int step : {10, 20, 30}) {
    WriteCheckpoint(dir_.string(), {"abc", "fam", step, 0, 0, a}, params, bias, {}, 2);
  }
  for (int step : {10, 15, 25}) {
    WriteCheckpoint(dir_.string(), {"abc", "fam", step, 0, 0, b}, params, bias, {}, 2);
  }
  std::vector<std::string> warnings;
  const auto warn = [&](const std::string& w) { warnings.push_back(w); };
  EXPECT_EQ(Steps(ResumeCandidates(dir_.string(), {a, "abc", "", -1}, warn)),
            (std::vector<int64_t>{30, 20}));
  ASSERT_EQ(warnings.size(), 2u);
  EXPECT_NE(warnings[0].find("skipping foreign checkpoint"), std::string::npos) << warnings[0];
  EXPECT_NE(warnings[0].find("belongs to run bbbbbbbb"), std::string::npos) << warnings[0];
  warnings.clear();
  EXPECT_EQ(Steps(ResumeCandidates(dir_.string(), {b, "abc", "", -1}, warn)),
            (std::vector<int64_t>{25, 15}));
  // The database recorded run A only up to step 25: its step 30 is passed over, with the reason.
  warnings.clear();
  EXPECT_EQ(Steps(ResumeCandidates(dir_.string(), {a, "abc", "", 25}, warn)),
            (std::vector<int64_t>{20}));
  EXPECT_EQ(warnings.size(), 3u);
  // Anonymous callers (no UUID) adopt nobody's.
  EXPECT_TRUE(ResumeCandidates(dir_.string(), {"", "abc", "", -1}, nullptr).empty());
  // Reading the newest candidate gives this run's state; the header names the run.
  std::vector<float> out(2);
  CheckpointHeader h;
  const std::string got =
      ReadNewestValidCheckpoint(ResumeCandidates(dir_.string(), {b, "abc", "", -1}, nullptr), "abc",
                                out, bias, {}, &h, nullptr);
  EXPECT_EQ(h.step, 25);
  EXPECT_EQ(h.run_uuid, b);
  EXPECT_EQ(ReadCheckpointHeader(got).run_uuid, b);
}

// Garbage over the 8-byte step field at `offset` of a checkpoint file.
void OverwriteStep(const std::string& path, std::streamoff offset) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(offset);
  f.write("XXXXXXXX", 8);
}

// Reading the header of `path` fails, naming it corrupt (`read_message` when it is read).
void ExpectHeaderCorrupt(const std::string& path, const std::string& read_message) {
  try {
    ReadCheckpointHeader(path);
    FAIL() << read_message;
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("header is corrupt"), std::string::npos) << e.what();
  }
}

// Bytes overwritten in a checkpoint's header (the step field) make it corrupt, named so, and
// resume passes it over for the run's newest valid one. Before the header had its own checksum
// the garbage step read as a step beyond the database ("recorded this run only up to step 25").
TEST_F(CheckpointTest, ADamagedHeaderIsReportedCorrupt) {
  const std::string a = "aaaaaaaa-0000-4000-8000-000000000001";
  std::vector<float> params = {1, 2}, bias;
  WriteCheckpoint(dir_.string(), {"abc", "fam", 10, 0, 0, a}, params, bias, {}, 5);
  const std::string newest =
      WriteCheckpoint(dir_.string(), {"abc", "fam", 20, 0, 0, a}, params, bias, {}, 5);
  // magic (8), then three length-prefixed strings ("abc", "fam", the UUID), then the step.
  OverwriteStep(newest, 8 + (8 + 3) + (8 + 3) + (8 + 36));
  ASSERT_NO_FATAL_FAILURE(ExpectHeaderCorrupt(newest, "a damaged header was read"));
  std::vector<std::string> warnings;
  const auto warn = [&](const std::string& w) { warnings.push_back(w); };
  EXPECT_EQ(Steps(ResumeCandidates(dir_.string(), {a, "abc", "", 25}, warn)),
            (std::vector<int64_t>{10}));
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find(newest), std::string::npos) << warnings[0];
  EXPECT_NE(warnings[0].find("corrupt"), std::string::npos) << warnings[0];
  EXPECT_EQ(warnings[0].find("recorded this run only"), std::string::npos) << warnings[0];
  std::vector<float> out(2);
  EXPECT_THROW(ReadCheckpoint(newest, "abc", out, bias, {}), std::runtime_error);

  // A legacy file (no header checksum) whose step disagrees with its name is corrupt too.
  const std::string legacy = (dir_ / "step_000000012.ckpt").string();
  WriteFormat1(legacy, "abc", 12, {1, 2, 3}, {0.5f});
  OverwriteStep(legacy, 8 + (8 + 3) + (8 + 3));
  ASSERT_NO_FATAL_FAILURE(ExpectHeaderCorrupt(legacy, "a damaged legacy header was read"));
}

// A legacy checkpoint (format 1, no UUID) is read as before, and adopted by a run with a UUID
// only when it is the checkpoint that run recorded; an anonymous caller adopts it.
TEST_F(CheckpointTest, LegacyCheckpointIsAdoptedOnlyByTheRunThatRecordedIt) {
  fs::create_directories(dir_);
  const std::string legacy = (dir_ / "step_000000012.ckpt").string();
  WriteFormat1(legacy, "abc", 12, {1, 2, 3}, {0.5f});
  std::vector<float> out(3), bias(1);
  const CheckpointHeader h = ReadCheckpoint(legacy, "abc", out, bias, {});
  EXPECT_EQ(h.step, 12);
  EXPECT_EQ(h.tokens, 1200);
  EXPECT_TRUE(h.run_uuid.empty());
  EXPECT_EQ(out, (std::vector<float>{1, 2, 3}));
  const std::string mine = "cccccccc-0000-4000-8000-000000000003";
  std::vector<std::string> warnings;
  const auto warn = [&](const std::string& w) { warnings.push_back(w); };
  EXPECT_TRUE(ResumeCandidates(dir_.string(), {mine, "abc", "", -1}, warn).empty());
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("legacy checkpoint"), std::string::npos) << warnings[0];
  // Recorded by this run (runs.checkpoint_path): adopted, also from another folder.
  EXPECT_EQ(ResumeCandidates(dir_.string(), {mine, "abc", legacy, -1}, nullptr),
            std::vector<std::string>{legacy});
  EXPECT_EQ(ResumeCandidates((dir_ / "new").string(), {mine, "abc", legacy, -1}, nullptr),
            std::vector<std::string>{legacy});
  EXPECT_EQ(ResumeCandidates(dir_.string(), {"", "abc", "", -1}, nullptr),
            std::vector<std::string>{legacy});
}

// Found by the checkpoint fuzz target (fuzz/checkpoint_fuzz.cc): names read from a damaged or
// foreign file reached resume's warnings and the reader's errors raw (an escape sequence drives
// the terminal, a NUL cuts the message short); they are escaped.
TEST_F(CheckpointTest, NamesReadFromTheFileAreEscapedInMessages) {
  const std::string evil = "\x1b[31m\x01zzzzzz";
  std::vector<float> params = {1, 2}, bias, moment = {0, 0};
  WriteCheckpoint(dir_.string(), {"abc", "fam", 10, 0, 0, evil}, params, bias,
                  {{std::string("m\0v", 3), &moment}}, 2);
  std::vector<std::string> warnings;
  ResumeCandidates(dir_.string(), {"aaaaaaaa-0000", "abc", "", -1},
                   [&](const std::string& w) { warnings.push_back(w); });
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("belongs to run \\u001b[31m\\u0001zz (config abc)"), std::string::npos)
      << warnings[0];
  std::vector<float> out(2), other = {0, 0};
  try {
    ReadCheckpoint(CheckpointsNewestFirst(dir_.string()).at(0), "abc", out, bias, {{"m", &other}});
    ADD_FAILURE() << "no error";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("optimizer buffer 'm\\u0000v' where 'm' was expected"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace moelab
