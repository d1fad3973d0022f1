// The fixture of the `moelab` binary's end-to-end tests (tests/cli, and tests/sweeps' runs): a
// temp folder, a database path in it, a log path and a small MoE config writer.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "tests/common/test_util.h"

namespace moelab {

// Starts `moelab args...` with stdout/stderr to log; returns the pid.
inline pid_t Spawn(const std::vector<std::string>& args, const std::string& log) {
  std::vector<std::string> argv = {"moelab"};
  argv.insert(argv.end(), args.begin(), args.end());
  return test::Spawn(argv, log);
}

inline std::string IndexedKey(const std::string& prefix, int i) {
  return prefix + std::to_string(i);
}

class CliTest : public ::testing::Test {
 protected:
  // `prefix` names the temp folder, which is kept when the test failed.
  explicit CliTest(std::string prefix = "cli") : prefix_(std::move(prefix)) {}
  void SetUp() override {
    tmp_ = std::make_unique<test::TempDir>(prefix_);
    dir_ = tmp_->path();
    db_ = (dir_ / "runs.db").string();
  }
  void TearDown() override { tmp_.reset(); }  // kept when the test failed

  std::string WriteConfig(int steps, nlohmann::json extra = nlohmann::json::object()) {
    nlohmann::json c = {
        {"model",
         {{"vocab_size", 64},
          {"d_model", 32},
          {"layers", 2},
          {"heads", 2},
          {"ffn_hidden", 64},
          {"seq_len", 32}}},
        {"moe", {{"experts_total", 4}, {"experts_active", 2}, {"expert_hidden", 32}}},
        {"data", {{"source", "markov"}}},
        {"train", {{"batch_size", 4}, {"steps", steps}, {"threads", 1}}},
        {"schedule", {{"warmup_steps", 2}}},
        {"eval", {{"every", 10}, {"batches", 1}}},
        {"checkpoint", {{"every", 10}, {"dir", (dir_ / "ckpt").string()}}}};
    c.merge_patch(extra);
    const std::string path = (dir_ / "run.json").string();
    std::ofstream(path) << c.dump(2);
    return path;
  }
  std::string Log(const std::string& name = "log.txt") const { return (dir_ / name).string(); }
  // An imported token shard of vocabulary 64 (`tokens` tokens of a learnable periodic stream
  // in llm.c's format), as `moelab data import` makes it.
  std::string ImportedData(int tokens = 4000) {
    std::vector<int32_t> header(256, 0);
    header[0] = 20240520;
    header[1] = 1;
    header[2] = tokens;
    {
      std::ofstream f(dir_ / "tiny_train.bin", std::ios::binary);
      f.write(reinterpret_cast<const char*>(header.data()), 1024);
      for (int i = 0; i < tokens; ++i) {
        const uint16_t t = static_cast<uint16_t>((i * 7 + i / 13) % 64);
        f.write(reinterpret_cast<const char*>(&t), 2);
      }
    }
    const std::string data = (dir_ / "imported").string();
    EXPECT_EQ(test::Wait(Spawn({"data", "import", "--input", (dir_ / "tiny_train.bin").string(),
                                "--vocab", "64", "--val-fraction", "0.05", "--out", data},
                               Log())),
              0)
        << test::Slurp(Log());
    return data;
  }

  std::string prefix_;
  std::unique_ptr<test::TempDir> tmp_;
  std::filesystem::path dir_;
  std::string db_;
};

}  // namespace moelab
