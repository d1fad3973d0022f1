// Shared by the tests/launch suites: a tiny MoE base config, and a fixture that runs the
// moelab binary with fake cluster tools (mpirun, sbatch, srun, squeue, sacct) first on PATH.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "sweeps/spec.h"
#include "tests/common/test_util.h"

namespace moelab::sweeps {

#define EXPECT_HAS(haystack, needle) \
  EXPECT_NE(std::string(haystack).find(needle), std::string::npos) << (haystack)

namespace fs = std::filesystem;

inline ojson Base(int steps = 20) {
  ojson b = ojson::parse(R"({
    "model": {"vocab_size": 32, "d_model": 16, "layers": 1, "heads": 2, "ffn_hidden": 32,
              "seq_len": 16},
    "moe": {"experts_total": 4, "experts_active": 2, "expert_hidden": 16},
    "data": {"source": "markov"},
    "train": {"batch_size": 4, "steps": 20, "threads": 1},
    "schedule": {"warmup_steps": 2},
    "eval": {"every": 0, "batches": 1}
  })");
  b["train"]["steps"] = steps;
  return b;
}

inline ojson Spec(const std::string& extra) {
  ojson s = ojson::parse(extra);
  if (!s.contains("name")) s["name"] = "t";
  if (!s.contains("base")) s["base"] = Base();
  return s;
}

using test::Slurp;

inline std::string Bin() { return test::BinPath("moelab"); }

class LaunchRunTest : public ::testing::Test {
 protected:
  void SetUp() override { fs::create_directories(dir_ / "bin"); }
  // An executable script in dir_/bin (first on the PATH of Moelab()).
  void Tool(const std::string& name, const std::string& body) {
    const fs::path p = dir_ / "bin" / name;
    std::ofstream(p) << "#!/bin/bash\n" << body;
    fs::permissions(p, fs::perms::owner_all);
  }
  // Runs the moelab binary with PATH starting at dir_/bin (env(1) sets it for the child only),
  // output to `log`; returns the exit code (test::Wait's convention).
  int Moelab(const std::vector<std::string>& args, const std::string& log) {
    std::vector<std::string> argv = {
        "/usr/bin/env", "PATH=" + (dir_ / "bin").string() + ":" + std::getenv("PATH"), Bin()};
    argv.insert(argv.end(), args.begin(), args.end());
    return test::Run(argv, log);
  }
  std::string WriteSpec(const ojson& spec) {
    const std::string p = (dir_ / "spec.json").string();
    std::ofstream(p) << spec.dump(2);
    return p;
  }
  test::TempDir tmp_{"launch"};  // kept when the test fails
  const fs::path dir_ = tmp_.path();
  const std::string db_ = (dir_ / "runs.db").string();
};

}  // namespace moelab::sweeps
