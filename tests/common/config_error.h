// The ConfigError a call throws, for tests that check which field a refusal names and why.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "core/config.h"

namespace moelab::test {

// The ConfigError that run() throws. When it throws none, the test fails with
// `failure_message` and the result is an empty error (path and reason ""), so the checks on it
// fail too. Any other exception passes through.
template <typename F>
ConfigError ConfigErrorOf(F&& run, const std::string& failure_message) {
  try {
    run();
  } catch (const ConfigError& e) {
    return e;
  }
  ADD_FAILURE() << failure_message;
  return ConfigError("", "");
}

}  // namespace moelab::test
