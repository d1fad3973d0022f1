// The fixture of the `moelab` binary's end-to-end tests: a temp folder, a database path in it
// and a small MoE config writer.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
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
  void SetUp() override {
    tmp_ = std::make_unique<test::TempDir>("cli");
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
  std::string Log() const { return (dir_ / "log.txt").string(); }

  std::unique_ptr<test::TempDir> tmp_;
  std::filesystem::path dir_;
  std::string db_;
};

}  // namespace moelab
