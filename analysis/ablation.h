// Ablation analyses over scaling-law observations: heads-ablation deltas (iso-token and
// iso-FLOP), IsoFLOP pitfall checks, and analytic inference FLOPs per token.
//
// Inference-FLOPs convention: forward only, 2 FLOPs per multiply-accumulate. "decode" is the
// cost of ONE new token at position `context` (it attends to `context` keys); "prefill" is the
// per-token average over a causal prefill of `context` tokens ((context+1)/2 keys per token).
// Training FLOPs (core/flops.h) use the prefill convention at seq_len. docs/model.md states the
// same; tests/analysis/analysis_test.cc (InferenceFlops.*) pins it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "analysis/scaling.h"
#include "analysis/seed_stats.h"
#include "core/config.h"

namespace moelab::analysis {

// ---- Heads ablation -----------------------------------------------------------------------
struct HeadsBudgetDelta {
  double tokens = 0;
  double base_loss = 0, treatment_loss = 0;
  double base_flops = 0, treatment_flops = 0;
  // (L_treatment − L_base)/L_base at equal tokens: mean over seeds of the seed-paired runs'
  // final losses; t interval over seeds (NaN ends with too few seeds, see note).
  Estimate delta_equal_tokens;
  SeedStatement equal_tokens_stats;  // t interval, exact sign-flip p, seed bootstrap
  bool replicated = false;
  // Same at equal FLOPs: treatment's final loss against the base family's frontier law at the
  // treatment's FLOPs; interval from the base fit's bootstrap.
  Estimate delta_equal_flops;
  std::string note;
};

struct HeadsAblation {
  std::string base_family, treatment_family;
  std::vector<HeadsBudgetDelta> budgets;
  Estimate mean_delta_equal_tokens;  // t interval over each seed's mean across budgets
  SeedStatement mean_equal_tokens_stats;
  Estimate mean_delta_equal_flops;
  std::vector<std::string> warnings;
};

// Pairs runs of two families by token budget (final evaluation of each run; budgets equal
// within `token_tolerance` relative).
HeadsAblation CompareHeads(const std::vector<Observation>& obs, const std::string& base_family,
                           const std::string& treatment_family, const FitOptions& options = {},
                           double token_tolerance = 0.02);

// ---- IsoFLOP pitfalls ---------------------------------------------------------------------
struct IsoFlopProfile {
  double flops = 0;  // budget (geometric mean of the group)
  int n_sizes = 0;
  double min_params = 0, max_params = 0;
  double best_params = 0;    // grid point with the lowest loss
  double vertex_params = 0;  // parabola vertex in log N (NaN when not convex)
  bool minimum_at_edge = false;
  bool vertex_outside_grid = false;
  bool not_convex = false;
  double vertex_offset = 0;  // (log N* − grid centre) / grid half-width
  std::vector<std::string> issues;
};

struct IsoFlopReport {
  std::vector<IsoFlopProfile> profiles;
  bool pitfall = false;  // any profile off-centre, edge minimum or not convex
  std::vector<std::string> issues;
};

// Groups final points by budget (FLOPs equal within `budget_tolerance` relative), fits
// L = p·(log N)² + q·log N + r per budget and flags off-centre or edge-minimum grids (the
// Approach-2 bias, Open-Athena/scaling-law-analysis).
IsoFlopReport CheckIsoFlop(const std::vector<Observation>& obs, double budget_tolerance = 0.05,
                           double max_vertex_offset = 0.5);

// ---- Inference FLOPs ----------------------------------------------------------------------
struct InferenceFlopsOptions {
  // "decode": the token at position `context` attends to `context` keys (the cost of serving
  // one token at that context). "prefill": the average over a causal prefill of `context`
  // tokens (context/2 keys per token).
  std::string mode = "decode";
  // MLA with the up-projections absorbed into q and o (attention in the 512-d latent space).
  bool mla_absorbed = false;
};

// Forward FLOPs for one token, 2 FLOPs per multiply-accumulate, by component.
struct InferenceFlops {
  double attention_projections = 0;
  double attention_scores = 0;  // QKᵀ and AV against the context
  double dense_ffn = 0;
  double routed_experts = 0;
  double shared_experts = 0;
  double router = 0;
  double lm_head = 0;
  double total = 0;
  std::string conventions;
};

InferenceFlops InferenceFlopsPerToken(const ModelConfig& model, const MoEConfig& moe,
                                      int64_t context, const InferenceFlopsOptions& options = {});

// ---- JSON ----
void to_json(nlohmann::json& j, const HeadsBudgetDelta& v);
void to_json(nlohmann::json& j, const HeadsAblation& v);
void to_json(nlohmann::json& j, const IsoFlopProfile& v);
void to_json(nlohmann::json& j, const IsoFlopReport& v);
void to_json(nlohmann::json& j, const InferenceFlops& v);

}  // namespace moelab::analysis
