// The sweep spec's vocabulary, shared by its expansion (sweeps/spec.cc) and its derived
// expressions (sweeps/derived.cc): top-level keys, model quantities, the defaulted config's
// fields and types, and the check that a key names a config field or a variable.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "sweeps/spec.h"

namespace moelab::sweeps {

// 2^53: every integer up to it is a double. 2^63: the first double beyond int64.
constexpr double kMaxExactInteger = 9007199254740992.0;
constexpr double kInt64Bound = 9223372036854775808.0;

using Assignment = std::pair<std::string, ojson>;
using Point = std::vector<Assignment>;

inline bool IsConfigPath(const std::string& key) { return key.find('.') != std::string::npos; }

inline nlohmann::json ToJson(const ojson& v) { return nlohmann::json::parse(v.dump()); }

// The spec's top-level keys.
const std::vector<std::string>& TopLevelKeys();
// Quantities computed from the (partially built) config, available to derived expressions.
const std::vector<std::string>& ModelQuantities();
// Sweep variables with a meaning of their own: the run's process count and layout shorthands.
bool IsLaunchKey(const std::string& key);
bool IsIdentifier(const std::string& s);
// The defaulted config as JSON: the type of each field comes from its default value.
const nlohmann::json& Defaults();
// The default at a dotted path, or null where the config has no such field.
const nlohmann::json* DefaultAt(const std::string& path);
// Checks that key names a config field (with the config's did-you-mean) or is a valid variable
// name; where: the spec location for the message. Throws SpecError.
void CheckKey(const std::string& key, const std::string& where);

}  // namespace moelab::sweeps
