// One entry point for every fit form `moelab fit` has, so the CLI and the GUI fit alike:
//
//   analysis::RunFitOptions o;            // form, family key, bootstrap, form-specific inputs
//   o.form = "power";
//   o.family_key = "sparsity";
//   const analysis::FitResult r = analysis::RunFit(o, analysis::LoadObservations(db, sweep, key));
//   r.power->multipliers ...              // exactly one form's member is set
//   nlohmann::json j = r;                 // what `moelab fit --json` prints and the fits table
//   stores
//
// RunFit is pure (no database, no printing). Before any form runs it checks the design: runs of
// one family that differ in another swept key are refused unless pooled (analysis/
// family_design.h). Errors are AnalysisError (or its subclasses) with the reason.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "analysis/ablation.h"
#include "analysis/model_free.h"
#include "analysis/observations.h"
#include "analysis/scaling.h"

namespace moelab::analysis {

// The fit forms, in the order the CLI lists them.
inline const std::vector<std::string>& FitForms() {
  static const std::vector<std::string> forms = {"power", "joint", "chinchilla", "heads",
                                                 "isoflop"};
  return forms;
}

struct RunFitOptions {
  std::string form = "power";  // one of FitForms()
  // The key the observations were grouped by (LoadObservations' family_key): labels, and the
  // one swept key runs of a family may differ in besides budget, seed and model size.
  std::string family_key = "sparsity";
  // Bootstrap, interval level, min_units (--min-seeds), failed-resample limit, threads, ...
  // final_only is overridden: see final_only / all_points below. skip_failed_families is set.
  FitOptions fit;
  bool final_only = false;  // frontier from each run's last evaluation only
  // WSD runs default to their final (post-decay) points; all_points keeps every evaluation.
  bool all_points = false;
  // Swept keys whose values may differ inside a family (pooled on purpose, `--pool KEY`).
  std::vector<std::string> pool;

  // power: the multipliers' reference family (default: the largest value) and L* values
  // (default: the model-free estimate's targets; the fitted law uses the middle one).
  std::string reference;
  std::vector<double> target_losses;
  bool allow_e_at_bound = false;
  // heads: the two families compared.
  std::string base, treatment;
  // chinchilla: FLOPs budgets for N_opt / D_opt (may be empty).
  std::vector<double> budgets;
};

// The power form: per-family laws, the model-free primary estimate and the fitted multipliers.
struct PowerFormResult {
  FamilyFits fits;
  std::vector<std::string> families;  // fitted families, numeric ones by value
  std::string reference;
  double target_loss = 0;  // L* of the fitted multipliers
  MultiplierTable multipliers;
  std::optional<ModelFreeTable> model_free;
  std::string model_free_error;  // why there is no model-free estimate (never empty then)
  std::string verdict_basis;     // "model-free (…)" or "fitted law (no model-free estimate: …)"
  // Every family has one model size: the law is fitted to a training curve, not a frontier.
  bool single_size = false;
  // Why no family's law could be fitted, when the model-free table still could (the primary
  // reading stands without the law; `fits`, `families` and `multipliers` are then empty).
  std::string law_error;
};

struct FitResult {
  std::string form;
  std::string family_key;
  FitOptions options;            // what was used (final_only resolved); stored as options_json
  bool final_only_auto = false;  // final_only came from WSD runs, not from the caller
  // Exactly the member of `form` is set.
  std::optional<PowerFormResult> power;
  std::optional<JointSparsityFit> joint;
  std::optional<ChinchillaFit> chinchilla;
  std::optional<HeadsAblation> heads;
  std::optional<IsoFlopReport> isoflop;
};

// Fits `observations` in options.form. Throws AnalysisError for an unknown form, a missing
// form input (heads without base/treatment), a design that pools runs of different treatments
// (naming every such family), or a fit that cannot be made (naming every failing family).
FitResult RunFit(const RunFitOptions& options, const ObservationSet& observations);

// The observations of the runs whose sweep variable KEY equals VALUE for every pair of `where`
// (`moelab fit --where KEY=VALUE`): one arm of another swept key, fitted before the design
// check sees it. Throws AnalysisError when no run matches.
ObservationSet SelectRuns(const ObservationSet& observations,
                          const std::vector<std::pair<std::string, std::string>>& where);

// Numeric family names sort by value, others by name (tables list families in this order).
bool FamilyLess(const std::string& a, const std::string& b);

// The JSON `moelab fit --json` prints and the fits table stores as result_json: the form's
// result ({"fits", "multipliers", "verdict_basis", "model_free"} for power).
void to_json(nlohmann::json& j, const FitResult& v);

}  // namespace moelab::analysis
