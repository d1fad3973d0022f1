// An environment variable set (or unset) for a scope, its previous state restored after. The GPU
// check reruns every test binary with opt-in implementation switches in the environment
// (scripts/gpu-check.sh, MOELAB_GPU_OPT_IN): a test that sets a switch must not clear it for the
// tests after it.
#pragma once

#include <cstdlib>
#include <string>

namespace moelab::test {

class ScopedEnv {
 public:
  // value null: unset.
  ScopedEnv(const char* name, const char* value) : name_(name) {
    const char* old = std::getenv(name);
    had_ = old != nullptr;
    if (had_) old_ = old;
    Set(value);
  }
  ~ScopedEnv() { Set(had_ ? old_.c_str() : nullptr); }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

  void Set(const char* value) {
    if (value) {
      setenv(name_.c_str(), value, 1);
    } else {
      unsetenv(name_.c_str());
    }
  }

 private:
  std::string name_, old_;
  bool had_ = false;
};

}  // namespace moelab::test
