// Compute-optimal model size and tokens (N_opt, D_opt) from a Chinchilla fit L(N, D) at given
// FLOPs budgets, and the helpers that turn a stored fit (the fits table's inputs and options)
// back into something the analysis functions take, so a stored fit can be re-derived exactly
// (same observations, same options, same bootstrap seed).
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "analysis/scaling.h"

namespace moelab::analysis {

// "1e18,3e18" → {1e18, 3e18}. Throws AnalysisError on an empty list, a non-number or C <= 0.
std::vector<double> ParseBudgets(const std::string& csv);

// The observations stored in a fit's inputs_json (`moelab fit` writes them).
std::vector<Observation> ObservationsFromJson(const nlohmann::json& inputs);
// The FitOptions stored in a fit's options_json (fields missing take their defaults).
FitOptions FitOptionsFromJson(const nlohmann::json& j);

// The FLOPs per (parameter · token) the engine actually counts for these observations: the
// median of flops / (params · tokens). C = 6·N·D ignores attention scores and the LM head's
// share; budgets given in the engine's FLOPs are converted with this k, not with 6.
double EffectiveFlopsPerParamToken(const std::vector<Observation>& obs);

struct ComputeOptimalOptions {
  // When true (default) the Chinchilla identity C = k·N·D uses the effective k of the data.
  bool effective_k = true;
  double k = 6;  // used when effective_k is false
};

// Fits L(N, D) and reports N_opt, D_opt and L(N_opt, D_opt) with bootstrap intervals at each
// budget (FitChinchilla with the budgets filled in).
ChinchillaFit FitComputeOptimal(const std::vector<Observation>& obs, const FitOptions& fit,
                                const std::vector<double>& budgets,
                                const ComputeOptimalOptions& options = {});

}  // namespace moelab::analysis
