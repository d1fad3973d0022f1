#include "analysis/compute_optimal.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <sstream>

namespace moelab::analysis {

using nlohmann::json;

std::vector<double> ParseBudgets(const std::string& csv) {
  std::vector<double> out;
  std::stringstream ss(csv);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item.empty()) continue;
    char* end = nullptr;
    const double v = std::strtod(item.c_str(), &end);
    if (end == item.c_str() || *end != '\0' || !std::isfinite(v) || v <= 0)
      throw AnalysisError(fmt::format("budget '{}' is not a positive number of FLOPs", item));
    out.push_back(v);
  }
  if (out.empty()) throw AnalysisError("no budgets given (e.g. --budgets 1e15,3e15)");
  return out;
}

std::vector<Observation> ObservationsFromJson(const json& inputs) {
  std::vector<Observation> out;
  if (!inputs.is_array()) return out;
  auto num = [](const json& j, const char* key) {
    const auto it = j.find(key);
    return it != j.end() && it->is_number() ? it->get<double>() : NAN;
  };
  for (const json& p : inputs) {
    Observation o;
    o.run = p.value("run", std::string());
    o.family = p.value("family", std::string());
    o.flops = num(p, "flops");
    o.tokens = num(p, "tokens");
    o.params = num(p, "params");
    o.loss = num(p, "loss");
    out.push_back(std::move(o));
  }
  return out;
}

FitOptions FitOptionsFromJson(const json& j) {
  FitOptions o;
  if (!j.is_object()) return o;
  o.huber_delta = j.value("huber_delta", o.huber_delta);
  o.flops_unit = j.value("flops_unit", o.flops_unit);
  o.bootstrap_resamples = j.value("bootstrap_resamples", o.bootstrap_resamples);
  o.seed = j.value("seed", o.seed);
  o.level = j.value("level", o.level);
  o.min_units = j.value("min_units", o.min_units);
  o.final_only = j.value("final_only", o.final_only);
  o.expanded_percentile = j.value("expanded_percentile", o.expanded_percentile);
  o.skip_failed_families = j.value("skip_failed_families", o.skip_failed_families);
  o.max_iterations = j.value("max_iterations", o.max_iterations);
  return o;
}

double EffectiveFlopsPerParamToken(const std::vector<Observation>& obs) {
  std::vector<double> k;
  for (const Observation& o : obs) {
    const double v = o.flops / (o.params * o.tokens);
    if (std::isfinite(v) && v > 0) k.push_back(v);
  }
  if (k.empty()) return 6.0;
  std::nth_element(k.begin(), k.begin() + k.size() / 2, k.end());
  return k[k.size() / 2];
}

ChinchillaFit FitComputeOptimal(const std::vector<Observation>& obs, const FitOptions& fit,
                                const std::vector<double>& budgets,
                                const ComputeOptimalOptions& options) {
  ChinchillaOptions co;
  co.fit = fit;
  co.budgets = budgets;
  co.flops_per_param_token = options.effective_k ? EffectiveFlopsPerParamToken(obs) : options.k;
  return FitChinchilla(obs, co);
}

}  // namespace moelab::analysis
