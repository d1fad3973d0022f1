// Reading fit inputs from a moelab database: every evaluation point of every finished run,
// labelled with its family (a sweep variable or a config value).
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "analysis/scaling.h"

namespace moelab::analysis {

struct ObservationSet {
  std::vector<Observation> points;
  // Per family: routed experts total / active (0 for dense runs), when all its runs agree.
  std::map<std::string, double> sparsity;
  int runs_used = 0;
  // Used runs with a WSD schedule: their points before the decay are not converged to the
  // schedule's end, so fits default to final (post-decay) points when any is present.
  int wsd_runs = 0;
  // Runs left out and why (not finished, no evaluations, no value for the family key).
  std::vector<std::string> skipped;
  // The sweep variables of each used run (Observation::run → name → value): what tells its
  // runs apart, so a fit can refuse to pool runs that differ in another swept key
  // (analysis/family_design.h).
  std::map<std::string, std::map<std::string, std::string>> run_vars;
};

// The resampling unit and pairing seed of a run from its config JSON: seed = train.seed, unit =
// "seed S, trunk H" with H the BranchHash (every field but the run length), so a trunk and its
// WSD branches form one unit. Both stay empty for a config that does not parse.
void SetTrunk(const nlohmann::json& config, Observation* o);

// The family of a run: the run variable `key` when the run has one, else the value at the
// dotted config path `key` (numbers printed canonically: 8, 0.5, 3000000).
std::optional<std::string> FamilyOf(const std::map<std::string, std::string>& run_vars,
                                    const std::string& config_json, const std::string& key);

// Sparsity (routed experts total / active, 0 for dense) of each run, by family: what
// AddRunConfig collects and SetFamilySparsity turns into ObservationSet::sparsity.
using FamilySparsities = std::map<std::string, std::vector<double>>;
// Counts a used run's config (parsed; anything else counts as no config): a WSD schedule adds
// to out->wsd_runs, its sparsity goes to (*sparsities)[family].
void AddRunConfig(const nlohmann::json& config, const std::string& family, ObservationSet* out,
                  FamilySparsities* sparsities);
// out->sparsity of each family whose runs all have the same sparsity.
void SetFamilySparsity(const FamilySparsities& sparsities, ObservationSet* out);

// Evaluation points (cumulative training FLOPs and tokens, active parameters, validation loss)
// of the done runs of a sweep (all runs when sweep_id is nullopt). Diverged runs contribute
// their points too (the fit drops non-finite losses and says so); running, queued, stopped and
// failed runs are listed in `skipped`.
ObservationSet LoadObservations(const std::string& db_path, std::optional<int64_t> sweep_id,
                                const std::string& family_key);

}  // namespace moelab::analysis
