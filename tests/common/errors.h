// The error a call throws, for tests that check what a refusal says (and, for a ConfigError,
// which field it names).
#pragma once

#include <gtest/gtest.h>

#include <stdexcept>
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

// The message of the exception of type E that run() throws. When it throws none, the test fails
// with `failure_message` and the result is "", so the checks on it fail too. Any other exception
// passes through.
template <typename E = std::runtime_error, typename F>
std::string ErrorMessageOf(F&& run, const std::string& failure_message = "expected an error") {
  try {
    run();
  } catch (const E& e) {
    return e.what();
  }
  ADD_FAILURE() << failure_message;
  return "";
}

}  // namespace moelab::test
