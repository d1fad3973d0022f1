// Test support shared by the test folders: start processes and wait for them with one exit
// convention, find the built binaries, and give each test its own temporary folder.
#pragma once

#include <sys/types.h>

#include <cstdlib>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace moelab::test {

// The folder holding the built binaries: $MOELAB_BIN_DIR (ctest sets it), else this build's
// bin/ (compiled in), so a test binary run by hand finds them too.
std::string BinDir();
// The source tree: $MOELAB_SOURCE_DIR, else the one this build was configured from.
std::string SourceDir();
// BinDir()/name.
std::string BinPath(const std::string& name);

// Starts BinDir()/argv[0] (argv[0] as given when it contains a '/'), stdout and stderr written
// to `log` (truncated; "" keeps the test's own). Returns the pid.
pid_t Spawn(const std::vector<std::string>& argv, const std::string& log = "");
// Runs `body` in a forked child that exits with its return value (99, with the message on
// stderr, when it throws).
pid_t SpawnFunction(const std::function<int()>& body);
// Waits for pid: its exit code, or 128 + the signal that killed it (the shell's convention).
int Wait(pid_t pid);
// Spawn + Wait.
int Run(const std::vector<std::string>& argv, const std::string& log = "");
// The whole file ("" when missing).
std::string Slurp(const std::string& path);
// Runs a shell command line: its stdout, and its exit code in *exit_code (-1 when killed).
std::string RunCapture(const std::string& cmd, int* exit_code);

// A fresh folder <tmp>/moelab_<prefix>_<pid>_<test name>, removed at destruction unless the
// test failed or $MOELAB_KEEP_TEST_DIR is set (so its logs and databases stay for a look).
class TempDir {
 public:
  explicit TempDir(const std::string& prefix = "test");
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }
  std::string operator/(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

// Sets (value) or unsets (nullptr) an environment variable and restores its previous state on
// scope exit, so a test never clobbers a switch the whole binary runs under (the GPU check runs
// every test binary again with its opt-in switches set).
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    Set(value);
  }
  ~ScopedEnv() { Set(old_ ? old_->c_str() : nullptr); }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;
  void Set(const char* value) const {
    if (value) {
      setenv(name_.c_str(), value, 1);
    } else {
      unsetenv(name_.c_str());
    }
  }

 private:
  std::string name_;
  std::optional<std::string> old_;
};

// A tiny MoE run config on the synthetic Markov source (~1 ms a step, so a sweep of them is
// quick); slow = true gives a few ms a step so a stop or kill lands mid-run. Checkpoints every
// ckpt_every steps (0: none) into ckpt_dir.
nlohmann::json TinyRunConfig(const std::string& ckpt_dir, int steps, int ckpt_every, bool slow);

}  // namespace moelab::test
