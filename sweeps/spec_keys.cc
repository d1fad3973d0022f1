// The sweep spec's vocabulary (sweeps/spec_keys.h): its top-level keys, the model quantities
// derived expressions may read, the defaulted config's fields and the check that a key names one.
#include "sweeps/spec_keys.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>

#include "core/config.h"

namespace moelab::sweeps {

using nlohmann::json;

const std::vector<std::string>& TopLevelKeys() {
  static const std::vector<std::string> keys = {
      "name",  "description", "base",  "set",     "vars",  "grid",      "zip",
      "runs",  "random",      "seeds", "derived", "ranks", "branching", "expert_parallel",
      "zero1", "adaptive"};
  return keys;
}

// Quantities computed from the (partially built) config, available to derived expressions.
const std::vector<std::string>& ModelQuantities() {
  static const std::vector<std::string> names = {"params_active",    "params_total",
                                                 "params_embedding", "flops_per_token",
                                                 "tokens_per_step",  "total_steps"};
  return names;
}

// Sweep variables with a meaning of their own: the run's process count and layout shorthands.
bool IsLaunchKey(const std::string& key) {
  return key == "ranks" || key == "expert_parallel" || key == "zero1";
}

bool IsIdentifier(const std::string& s) {
  if (s.empty() || !(std::isalpha(static_cast<unsigned char>(s[0])) || s[0] == '_')) return false;
  return std::all_of(s.begin(), s.end(), [](char ch) {
    return std::isalnum(static_cast<unsigned char>(ch)) || ch == '_';
  });
}

// The defaulted config as JSON: the type of each field (integer, number, bool, string) comes
// from its default value.
const json& Defaults() {
  static const json defaults = ConfigToJson(RunConfig{});
  return defaults;
}

const json* DefaultAt(const std::string& path) {
  const json* node = &Defaults();
  size_t start = 0;
  while (true) {
    const size_t dot = path.find('.', start);
    const std::string key = path.substr(start, dot == std::string::npos ? dot : dot - start);
    if (!node->is_object() || !node->contains(key)) return nullptr;
    node = &(*node)[key];
    if (dot == std::string::npos) return node;
    start = dot + 1;
  }
}

// Checks that key names a config field (with the config's did-you-mean) or is a valid variable
// name. where: the spec location for the message.
void CheckKey(const std::string& key, const std::string& where) {
  if (IsConfigPath(key)) {
    json scratch = json::object();
    try {
      ApplyOverride(scratch, key + "=0");
    } catch (const ConfigError& e) {
      throw SpecError(fmt::format("{}: '{}' is not a config path: {}", where, key, e.reason()));
    }
    return;
  }
  if (!IsIdentifier(key)) {
    throw SpecError(fmt::format(
        "{}: '{}' is neither a config path (section.field) nor a variable name", where, key));
  }
  if (Defaults().contains(key)) {
    throw SpecError(
        fmt::format("{}: '{}' is a config section, not a field; name a field such as "
                    "'{}.{}'",
                    where, key, key, Defaults()[key].begin().key()));
  }
  const auto& q = ModelQuantities();
  if (std::find(q.begin(), q.end(), key) != q.end()) {
    throw SpecError(
        fmt::format("{}: '{}' is computed from the config and cannot be assigned", where, key));
  }
}

}  // namespace moelab::sweeps
