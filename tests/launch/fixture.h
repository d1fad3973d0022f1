// Shared by the tests/launch suites: a tiny MoE base config, and a fixture that runs the
// moelab binary with fake cluster tools (mpirun, sbatch, srun, squeue, sacct) first on PATH.
#pragma once

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "sweeps/spec.h"

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

inline std::string Bin() {
  const char* dir = std::getenv("MOELAB_BIN_DIR");
  return std::string(dir ? dir : MOELAB_BIN_DIR_DEFAULT) + "/moelab";
}

inline std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

class LaunchRunTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("moelab_launch_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_ / "bin");
    db_ = (dir_ / "runs.db").string();
  }
  void TearDown() override {
    if (!HasFailure()) fs::remove_all(dir_);
  }
  // An executable script in dir_/bin (first on the PATH of Moelab()).
  void Tool(const std::string& name, const std::string& body) {
    const fs::path p = dir_ / "bin" / name;
    std::ofstream(p) << "#!/bin/bash\n" << body;
    fs::permissions(p, fs::perms::owner_all);
  }
  // Runs the moelab binary with PATH starting at dir_/bin; returns the exit code.
  int Moelab(const std::vector<std::string>& args, const std::string& log) {
    const pid_t pid = fork();
    if (pid == 0) {
      const std::string path = (dir_ / "bin").string() + ":" + std::getenv("PATH");
      setenv("PATH", path.c_str(), 1);
      FILE* f = std::freopen(log.c_str(), "w", stdout);
      (void)f;
      dup2(fileno(stdout), fileno(stderr));
      std::vector<std::string> copy = args;
      std::string bin = Bin();
      std::vector<char*> argv = {bin.data()};
      for (auto& a : copy) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv(bin.c_str(), argv.data());
      _exit(127);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }
  std::string WriteSpec(const ojson& spec) {
    const std::string p = (dir_ / "spec.json").string();
    std::ofstream(p) << spec.dump(2);
    return p;
  }
  fs::path dir_;
  std::string db_;
};

}  // namespace moelab::sweeps
