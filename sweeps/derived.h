// A sweep's derived fields ("derived": ["train.steps = 20 * params_active / tokens_per_step"]):
// parsed from the spec and evaluated per run with muParser against the run's variables, its
// config so far and the model quantities (sweeps/spec_keys.h). Used by sweeps/spec.cc.
#pragma once

#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "sweeps/spec.h"

namespace moelab::sweeps {

struct Derived {
  std::string target;
  std::string expr;
  std::string where;  // "derived[i]"
};

// The spec's "derived" entries in order (a list of "path = expression" strings or one-key
// objects, or an object). Throws SpecError naming the entry.
std::vector<Derived> ParseDerived(const ojson& spec);

// Evaluates one derived expression against the run's variables and current config.
double Evaluate(const Derived& d, const nlohmann::json& config,
                const std::map<std::string, ojson>& vars);

// Converts a derived number to the JSON type of its target field.
nlohmann::json TypedResult(const Derived& d, double x);

}  // namespace moelab::sweeps
