// A sweep's derived fields (sweeps/derived.h).
#include "sweeps/derived.h"

#include <fmt/format.h>
#include <muParser.h>

#include <algorithm>
#include <cctype>
#include <cmath>

#include "core/config.h"
#include "core/did_you_mean.h"
#include "core/flops.h"
#include "sweeps/spec_keys.h"

namespace moelab::sweeps {

using nlohmann::json;

namespace {

// Every numeric leaf of a config JSON as "section.field" -> value (bools as 0/1).
void Flatten(const json& j, const std::string& prefix, std::map<std::string, double>* out) {
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string path = prefix.empty() ? it.key() : prefix + "." + it.key();
    if (it.value().is_object()) {
      Flatten(it.value(), path, out);
    } else if (it.value().is_number()) {
      (*out)[path] = it.value().get<double>();
    } else if (it.value().is_boolean()) {
      (*out)[path] = it.value().get<bool>() ? 1.0 : 0.0;
    }
  }
}

double Round(double x) { return std::round(x); }
double Floor(double x) { return std::floor(x); }
double Ceil(double x) { return std::ceil(x); }

}  // namespace

std::vector<Derived> ParseDerived(const ojson& spec) {
  std::vector<Derived> out;
  if (!spec.contains("derived")) return out;
  const ojson& d = spec["derived"];
  auto add = [&](const std::string& target, const ojson& expr, const std::string& where) {
    if (!expr.is_string()) {
      throw SpecError(fmt::format("{}: the expression for '{}' must be a string", where, target));
    }
    CheckKey(target, where);
    out.push_back({target, expr.get<std::string>(), where});
  };
  if (d.is_object()) {
    for (auto it = d.begin(); it != d.end(); ++it) {
      add(it.key(), it.value(), fmt::format("derived.{}", it.key()));
    }
    return out;
  }
  if (!d.is_array()) throw SpecError("derived: expected a list of \"path = expression\" strings");
  for (size_t i = 0; i < d.size(); ++i) {
    const std::string where = fmt::format("derived[{}]", i);
    if (d[i].is_string()) {
      const std::string s = d[i].get<std::string>();
      const size_t eq = s.find('=');
      if (eq == std::string::npos) {
        throw SpecError(fmt::format("{}: '{}' should look like \"path = expression\"", where, s));
      }
      auto trim = [](std::string t) {
        const size_t b = t.find_first_not_of(" \t");
        const size_t e = t.find_last_not_of(" \t");
        return b == std::string::npos ? std::string() : t.substr(b, e - b + 1);
      };
      add(trim(s.substr(0, eq)), ojson(trim(s.substr(eq + 1))), where);
    } else if (d[i].is_object() && d[i].size() == 1) {
      add(d[i].begin().key(), d[i].begin().value(), where);
    } else {
      throw SpecError(
          fmt::format("{}: expected \"path = expression\" or {{\"path\": \"expression\"}}", where));
    }
  }
  return out;
}

// Evaluates one derived expression against the run's variables and current config.
double Evaluate(const Derived& d, const json& config, const std::map<std::string, ojson>& vars) {
  std::map<std::string, double> values;
  json full = Defaults();
  full.merge_patch(config);
  Flatten(full, "", &values);
  for (const auto& [k, v] : vars) {
    if (v.is_number()) values[k] = v.get<double>();
    if (v.is_boolean()) values[k] = v.get<bool>() ? 1.0 : 0.0;
  }
  // Model quantities need a valid config; an invalid one is only an error when the expression
  // actually uses them (an earlier derived field may be what makes it valid).
  std::string model_error;
  try {
    const RunConfig c = ConfigFromJson(config);
    const ParamCounts pc = CountParams(c);
    values["params_active"] = static_cast<double>(pc.active);
    values["params_total"] = static_cast<double>(pc.total);
    values["params_embedding"] = static_cast<double>(pc.embedding);
    values["flops_per_token"] = ForwardFlopsPerToken(c).training();
    values["tokens_per_step"] = static_cast<double>(TokensPerStep(c));
    values["total_steps"] = c.total_steps();
  } catch (const ConfigError& e) {
    model_error = e.what();
    for (const std::string& q : ModelQuantities()) values[q] = std::nan("");
  }

  mu::Parser parser;
  try {
    parser.DefineNameChars("0123456789_.abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ");
    parser.DefineFun("round", Round);
    parser.DefineFun("floor", Floor);
    parser.DefineFun("ceil", Ceil);
    for (auto& [name, value] : values) parser.DefineVar(name, &value);
    parser.SetExpr(d.expr);
    const double result = parser.Eval();
    for (const auto& [name, ptr] : parser.GetUsedVar()) {
      const auto& q = ModelQuantities();
      if (!model_error.empty() && std::find(q.begin(), q.end(), name) != q.end()) {
        throw SpecError(fmt::format("{} '{} = {}': {} needs a valid config at this point, but: {}",
                                    d.where, d.target, d.expr, name, model_error));
      }
    }
    if (!std::isfinite(result)) {
      throw SpecError(
          fmt::format("{} '{} = {}': the result is {}", d.where, d.target, d.expr, result));
    }
    return result;
  } catch (const mu::Parser::exception_type& e) {
    std::string hint;
    const std::string token = e.GetToken();
    auto it = vars.find(token);
    if (it != vars.end() && !it->second.is_number()) {
      hint = fmt::format(" (variable '{}' is {}, not a number)", token, it->second.dump());
    } else if (!token.empty() && !values.count(token) &&
               token.find_first_not_of("0123456789_.abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTU"
                                       "VWXYZ") == std::string::npos &&
               !std::isdigit(static_cast<unsigned char>(token[0]))) {
      // muParser calls an undefined name an "unexpected token": say what it is and what was meant.
      std::vector<std::string> names;
      for (const auto& [name, value] : values) names.push_back(name);
      const std::string near = ClosestName(token, names);
      hint = fmt::format(" ('{}' is not a sweep variable, config field or model quantity{})", token,
                         near.empty() ? "" : fmt::format("; did you mean '{}'?", near));
    }
    throw SpecError(fmt::format("{} '{} = {}': expression error: {}{}", d.where, d.target, d.expr,
                                e.GetMsg(), hint));
  }
}

// Converts a derived number to the JSON type of its target field.
json TypedResult(const Derived& d, double x) {
  if (!IsConfigPath(d.target)) {
    if (std::fabs(x - std::round(x)) <= 1e-9 * std::max(1.0, std::fabs(x)) && std::fabs(x) < 9e15) {
      return static_cast<int64_t>(std::llround(x));
    }
    return x;
  }
  const json* def = DefaultAt(d.target);
  if (def && (def->is_number_integer() || def->is_number_unsigned())) {
    // Relative tolerance: 20 * params_active is exact, but products of non-representable
    // decimals (0.1 * 30) carry rounding noise of a few ulps.
    if (std::fabs(x - std::round(x)) > 1e-9 * std::max(1.0, std::fabs(x))) {
      throw SpecError(fmt::format(
          "{} '{} = {}': {} is an integer field but the expression gives {} (not integral; "
          "use round(), floor() or ceil())",
          d.where, d.target, d.expr, d.target, x));
    }
    // llround beyond int64 gives INT64_MIN, which the config then reported as the value (found
    // by fuzzing). Narrower fields (int) say so themselves.
    if (std::fabs(x) >= kInt64Bound) {
      throw SpecError(fmt::format("{} '{} = {}': {} is beyond the integer range", d.where, d.target,
                                  d.expr, x));
    }
    return static_cast<int64_t>(std::llround(x));
  }
  if (def && def->is_number()) return x;
  throw SpecError(fmt::format("{} '{}': is a {} field; expressions only produce numbers", d.where,
                              d.target, def ? def->type_name() : "non-numeric"));
}

}  // namespace moelab::sweeps
