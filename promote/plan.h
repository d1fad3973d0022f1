// Promotion planner: scales a configuration chosen from a sweep to a target FLOPs budget or
// target loss using the sweep's fitted laws, and predicts what the promoted run will do.
//
// Two law sources (docs/promote.md states the rules):
//  * "chinchilla": a Chinchilla L(N, D) fit exists: N_opt and D_opt at the budget from the
//    compute-optimal law (C = k·N·D with the engine's measured k); predicted loss L(N_opt, D_opt).
//  * "power": the family's frontier law L(C) = E + A·(C/unit)^−α; the shape rule keeps the
//    tokens-per-active-parameter ratio of the family's largest frontier run (N, D ∝ √C).
// The shape search then picks layers and width (head size, FFN/expert ratios, expert counts and
// sparsity kept) whose active parameter count is closest to N, at the source aspect ratio.
// Pure functions: the CLI reads the fit and the source config from the database.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "analysis/scaling.h"
#include "core/config.h"
#include "core/flops.h"
#include "promote/memory.h"

namespace moelab::promote {

// A promotion that cannot be planned: target outside the fit's support, no fit, unknown family.
class PromotionRefused : public analysis::AnalysisError {
 public:
  explicit PromotionRefused(const std::string& what) : analysis::AnalysisError(what) {}
};

struct PromoteTarget {
  double budget_flops = 0;  // > 0: train with this many FLOPs
  double target_loss = 0;   // > 0: the smallest compute-optimal run predicted to reach it
};

struct PromoteOptions {
  // The largest budget, as a multiple of the largest FLOPs the fit saw, that a plan may
  // extrapolate to; and the smallest useful one (a promotion below the sweep is refused).
  double max_extrapolation = 1000;
  double loss_margin = 0.02;  // target loss must exceed E·(1 + margin)
  int curve_points = 24;
  double level = 0.90;
  // Time: either a measured training rate of this machine (FLOPs/s of one rank) or a named GPU.
  double measured_flops_per_s = 0;
  std::string rate_basis;  // how the rate was measured (printed)
  std::string gpu;         // a100 | h100 | h200 | l40s: peak bf16 dense × mfu
  double mfu = 0.35;
};

struct CurvePoint {
  double flops = 0;
  analysis::Estimate loss;  // law with its bootstrap interval
  analysis::Estimate band;  // prediction band: bootstrap ⊕ the fit's residual scatter
};

struct PromotionPlan {
  std::string law;  // "chinchilla" | "power"
  std::string family_key, family;
  std::string source_run;  // run id the shape was taken from
  RunConfig config;        // the promoted config
  RunConfig source;
  int64_t params_total = 0, params_active = 0;
  double target_params = 0;  // N the law asked for (active)
  double target_tokens = 0;  // D the law asked for
  double flops_per_token = 0;
  double flops = 0;   // planned training FLOPs = flops_per_token · tokens
  double tokens = 0;  // = steps · batch · seq_len
  int steps = 0;
  int batch = 0;
  PromoteLayout layout;
  MemoryEstimate memory;
  double time_s = 0;
  std::string time_basis;
  analysis::Estimate loss;  // predicted final loss (law + bootstrap interval)
  analysis::Estimate band;  // prediction band for a single run (law interval ⊕ residual scatter)
  double residual_sd_log = 0;
  std::vector<CurvePoint> curve;  // predicted loss vs FLOPs up to the planned budget
  double fit_min_flops = 0, fit_max_flops = 0;
  std::string shape_rule, lr_rule, band_rule;
  std::vector<std::string> notes;
};

// Shape search: the config whose active parameters are closest to target_active (log scale),
// at the source's aspect ratio (d_model / layers) with head_dim, ffn/expert ratios, kv-head
// ratio and expert counts kept. The rule string says what was kept and what moved.
RunConfig ScaleShape(const RunConfig& source, double target_active, std::string* rule = nullptr);

// Plans from a family's power-law fit (fit.draws must be present: FitFamilies output).
// source_params/source_tokens: the active parameters and tokens of the family's largest
// frontier run (the ratio D/N the shape rule keeps).
PromotionPlan PlanFromPowerLaw(const analysis::PowerLawFit& fit, const RunConfig& source,
                               const std::string& source_run, double source_params,
                               double source_tokens, const PromoteTarget& target,
                               const PromoteLayout& layout, const PromoteOptions& options = {});

// Plans from the observations of a Chinchilla fit (refitted with the budget).
PromotionPlan PlanFromChinchilla(const std::vector<analysis::Observation>& obs,
                                 const analysis::FitOptions& fit, const RunConfig& source,
                                 const std::string& source_run, const PromoteTarget& target,
                                 const PromoteLayout& layout, const PromoteOptions& options = {});

// Where an actual loss at `flops` sits relative to the plan's band: 0 on the prediction, ±1 at
// the band's edges (positive = above = worse), |d| > 1 outside. Interpolates the curve in log C.
double BandUnits(const PromotionPlan& plan, double flops, double loss);
// Same from a stored plan JSON (the curve's flops/band arrays).
double BandUnits(const nlohmann::json& plan, double flops, double loss);

// Human-readable plan (the CLI prints it; the GUI shows it).
std::string FormatPlan(const PromotionPlan& plan);

void to_json(nlohmann::json& j, const MemoryEstimate& v);
void to_json(nlohmann::json& j, const CurvePoint& v);
void to_json(nlohmann::json& j, const PromotionPlan& v);

}  // namespace moelab::promote
