// What a fit may pool into one family, and what `fit` and `promote` can do with each family of
// a design — the checks `moelab fit`, `moelab promote` and `moelab sweep plan` share.
//
// A family is the runs that share every swept key but the one fitted, their budget and their
// seed. Two kinds of other swept keys can still differ inside a `--by KEY` family:
//  * model-size keys — width and depth (model.d_model, model.layers, model.ffn_hidden,
//    moe.expert_hidden, and any key that changes together with one of them): the frontier is
//    the lower envelope over model sizes, so they are pooled, as always;
//  * treatment keys — everything else (heads, a second sparsity axis, an optimizer, a learning
//    rate): pooling them takes the luckiest arm at each compute and breaks the seed pairing, so
//    fit and promote refuse unless told (`--pool KEY`).
// Keys that always change together (a derived field and its source) are one axis: pooling
// any of them pools the axis.
#pragma once

#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "analysis/scaling.h"

namespace moelab::analysis {

// A budget or seed variable: its leaf name is "seed" or ends in "steps" or "tokens". Runs that
// differ only in these are one family's budgets and replicates.
bool IsBudgetOrSeedKey(const std::string& key);

// A width or depth of the model: the sizes a compute frontier is the envelope over.
bool IsModelSizeKey(const std::string& key);

// One run as the design check sees it.
struct DesignRun {
  std::string family;                       // its value of the fitted key
  std::map<std::string, std::string> vars;  // its sweep variables
};

// Treatment keys that differ between runs of one family (keys that change together joined by
// " = ", e.g. "sparsity = moe.experts_total").
struct MixedFamily {
  std::string family;
  std::vector<std::string> axes;
};

// Families of `runs` (run id → run) whose runs differ in a treatment key that is neither the
// fitted key `family_key` nor in `pool`. Empty when every family is one experiment.
std::vector<MixedFamily> MixedFamilies(const std::map<std::string, DesignRun>& runs,
                                       const std::string& family_key,
                                       const std::vector<std::string>& pool);

// Throws AnalysisError naming every mixed family, the keys its runs differ in and the remedy
// (`--pool KEY`), or does nothing. `what` names the command ("moelab fit", "promote").
void RequireUnmixedFamilies(const std::map<std::string, DesignRun>& runs,
                            const std::string& family_key, const std::vector<std::string>& pool,
                            const std::string& what);

// `moelab promote`'s check on a stored fit: the fit's runs of `family` (their sweep variables
// read from the database) must be one experiment, or pooled on purpose by the fit (the "pool"
// list of its options_json). Throws AnalysisError naming the keys.
void RequireUnmixedStoredFamily(const std::string& db_path, const std::vector<Observation>& obs,
                                const std::string& family_key, const std::string& family,
                                const nlohmann::json& fit_options);

// The DesignRuns of a set of observations and their runs' sweep variables (ObservationSet).
std::map<std::string, DesignRun> DesignRunsOf(
    const std::vector<Observation>& obs,
    const std::map<std::string, std::map<std::string, std::string>>& run_vars);

// What `moelab fit` (power form) and `moelab promote` will be able to do with one family, by
// the rules they apply: CheckFamily's frontier, the seed pairing and the units an interval
// needs, and promote's need for bootstrap draws.
struct FamilyReadiness {
  std::string family;
  int frontier_points = 0;    // points on its per-seed lower envelopes, merged
  int units = 0;              // trunks (a seed's run with its WSD branches)
  int units_needed = 0;       // for an interval: min_units paired by seed, else ≥ 5
  bool paired = false;        // every family has one trunk per seed
  std::string fit_error;      // why no law can be fitted ("" when it can)
  std::string interval_note;  // why the law has no interval ("" when it has one)
  bool Fits() const { return fit_error.empty(); }
  bool Promotable() const { return fit_error.empty() && interval_note.empty(); }
  // "law with a 90% interval", "law, point estimate only (2 seeds: too few …)", "no law: …"
  std::string FitText() const;
  // "yes" or "refused: …" (power-law promotion).
  std::string PromoteText() const;
};

// Runs the checks on every family of `obs` (non-finite points dropped first, as the fit does).
std::vector<FamilyReadiness> AssessFamilies(const std::vector<Observation>& obs,
                                            const FitOptions& options);

}  // namespace moelab::analysis
