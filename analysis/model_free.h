// The model-free primary estimate of a comparison: FLOPs and tokens to reach a target loss,
// read off each seed's own frontier by log-log interpolation between the two budgets that
// bracket the target, then compared family against reference seed by seed. No functional form
// is assumed, so a misfitting law cannot bias it; its price is that targets must lie inside
// every seed's measured loss range (no extrapolation at all).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "analysis/scaling.h"
#include "analysis/seed_stats.h"

namespace moelab::analysis {

struct ModelFreeOptions {
  int resamples = 1000;  // seed bootstrap when the seeds are too many to enumerate exactly
  uint64_t seed = 12345;
  double level = 0.90;
  int min_seeds = 3;        // fewer seeds: no interval, and a note that says so
  bool final_only = true;   // each run's last evaluation (the WSD default)
  int default_targets = 3;  // targets spread inside the range every (family, seed) covers
};

// The model-free options a fit's own options imply (resamples, seed, level, min seeds, final
// points only): `moelab fit` (RunFit) and the GUI read the model-free table with the fit's options.
ModelFreeOptions ModelFreeOptionsOf(const FitOptions& fit);

// One family against the reference at one target loss.
struct ModelFreeRow {
  std::string family;
  double target_loss = 0;
  std::vector<std::string> seeds;  // seeds that reach the target in both families
  std::vector<double> flops_family, flops_reference;    // per seed, interpolated
  std::vector<double> tokens_family, tokens_reference;  // per seed, interpolated
  // Geometric mean over seeds of C_family,s / C_reference,s (and of the token ratios) with the
  // t interval on the mean log ratio (df = seeds − 1); NaN ends when there are too few seeds.
  Estimate flops_ratio;
  Estimate tokens_ratio;
  // The full statement: t interval, exact sign-flip p, seed bootstrap ("seed range" < 8 seeds).
  SeedStatement flops_stats, tokens_stats;
  std::string interval_note;  // "n seeds: too few for an interval" or empty
};

struct ModelFreeTable {
  std::string reference;
  // Which comparison the table is (analysis/frontier.h EstimandLabel): "frontier
  // (compute-optimal)" when every family pools several model sizes — each seed's curve is then
  // its lower envelope over them —, "fixed size (training curve)" when each family has one.
  std::string estimand;
  std::vector<double> targets;
  double range_lo = 0, range_hi = 0;  // the loss range every (family, seed) frontier covers
  std::vector<ModelFreeRow> rows;     // by target, then family
  std::vector<std::string> notes;     // seeds left out at a target (not reached), ...
};

// Loss range [lo, hi] that every (family, seed) frontier spans; throws AnalysisError when the
// ranges do not overlap.
std::pair<double, double> SharedLossRange(const std::vector<Observation>& obs, bool final_only);

// `targets` empty: `default_targets` losses evenly inside the shared range (its quartiles for
// 3). Families are compared with `reference` seed by seed (Observation::seed).
ModelFreeTable ModelFreeMultipliers(const std::vector<Observation>& obs,
                                    const std::string& reference, std::vector<double> targets,
                                    const ModelFreeOptions& options = {});

void to_json(nlohmann::json& j, const ModelFreeRow& v);
void to_json(nlohmann::json& j, const ModelFreeTable& v);

}  // namespace moelab::analysis
