// libFuzzer target: the run-config parser (core/config.h), as `moelab train CONFIG --set ...`
// drives it. Input: any number of leading lines "--set path=value" (ApplyOverride), then the
// JSON document, read by LoadConfigFile (the command's own entry point) from a scratch file.
// Findings: a crash, a sanitizer report, an exception other than ConfigError, a ConfigError
// without a path or reason, and an accepted config that does not survive ConfigToJson ->
// ConfigFromJson with the same hash.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "core/config.h"
#include "fuzz/fuzz_util.h"

namespace {

using moelab::ConfigError;
using nlohmann::json;

constexpr std::string_view kSet = "--set ";

void CheckRoundTrip(const moelab::RunConfig& c) {
  const json j = moelab::ConfigToJson(c);
  moelab::CanonicalJson(j);
  moelab::RunConfig back;
  try {
    back = moelab::ConfigFromJson(j);
  } catch (const ConfigError& e) {
    moelab::fuzz::Finding(std::string("an accepted config is refused after ConfigToJson: ") +
                          e.what());
  }
  if (moelab::ConfigHash(back) != moelab::ConfigHash(c)) {
    moelab::fuzz::Finding("ConfigToJson -> ConfigFromJson changes the config hash");
  }
  moelab::BranchHash(c);
  c.total_steps();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  std::vector<std::string> overrides;
  while (text.substr(0, kSet.size()) == kSet) {
    const size_t nl = text.find('\n');
    overrides.emplace_back(
        text.substr(kSet.size(), nl == text.npos ? text.npos : nl - kSet.size()));
    text = nl == text.npos ? std::string_view() : text.substr(nl + 1);
  }
  try {
    const std::string path = moelab::fuzz::WriteScratch(
        "config.json", reinterpret_cast<const uint8_t*>(text.data()), text.size());
    const moelab::RunConfig c = moelab::LoadConfigFile(path, overrides);
    CheckRoundTrip(c);
  } catch (const ConfigError& e) {
    moelab::fuzz::ExpectClear(e);
    if (e.path().empty() || e.reason().empty()) {
      moelab::fuzz::Finding(std::string("a ConfigError without a path or reason: ") + e.what());
    }
  }
  return 0;
}
