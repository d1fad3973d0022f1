// Scaling-law fits for the GUI, computed by analysis/ on a background thread so the window
// never waits for Ceres or the bootstrap. The worker opens its own read-only connection
// (through analysis::LoadObservations) and always works on the latest request only.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "analysis/ablation.h"
#include "analysis/model_free.h"
#include "analysis/observations.h"
#include "analysis/run_fit.h"
#include "analysis/scaling.h"
#include "db/fits.h"

namespace moelab::gui {

struct FitRequest {
  std::string db_path;
  std::optional<int64_t> sweep_id;          // nullopt: every run
  std::string family_key;                   // run variable name or dotted config key
  std::string form = "power";               // one of analysis::FitForms(), as `moelab fit --form`
  std::string heads_base, heads_treatment;  // families for the heads ablation ("" = skip)
  std::vector<double> budgets;              // chinchilla: FLOPs for N_opt / D_opt (may be empty)
  // The options the fit runs with, as `moelab fit` names them (and stores them in the row's
  // options_json). A recompute of a stored fit takes the row's own (RequestFromStored).
  int resamples = 200;  // the view's own fits: fewer than the CLI's 1000, they rerun as runs end
  uint64_t seed = 12345;
  double level = 0.90;
  int min_seeds = 3;
  std::optional<bool> final_only;  // nullopt: as `moelab fit` (WSD runs: post-decay points only)
  double max_failed_fraction = 0.10;
  std::string reference;              // model-free reference; "" = the largest family
  std::vector<double> target_losses;  // model-free L*; empty = 3 inside the shared range
  uint64_t data_version = 0;          // bumps when the set of finished runs changes
  bool operator==(const FitRequest&) const = default;
};

struct FitBand {
  std::string family;
  std::vector<double> flops, loss, lo, hi;  // fitted curve and its bootstrap percentile band
  bool has_band() const { return !lo.empty() && lo.size() == flops.size(); }
};

struct FitResult {
  FitRequest request;
  // > 0: built from this stored `moelab fit` row (FitResultFromStored), not fitted here. Such a
  // row holds no bootstrap draws: `bands` carry the curves only, and multipliers are known
  // only at the row's own L* (stored_multipliers).
  int64_t stored_fit = 0;
  std::optional<analysis::MultiplierTable> stored_multipliers;
  std::string stored_basis;  // the row's verdict_basis ("" for older rows)
  // The options the fit ran with: a stored row's options_json (options_stored false when the
  // row has none), or the request's for a fit made here.
  analysis::FitOptions options;
  bool options_stored = false;
  // The model-free primary reading (analysis/model_free.h) with the same options: as stored
  // (rows without one: model_free_error says so) or computed with the fit.
  std::optional<analysis::ModelFreeTable> model_free;
  std::string model_free_error;
  analysis::ObservationSet observations;
  std::optional<analysis::FamilyFits> fits;
  std::string law_error;       // why no law was fitted when the model-free table stands alone
  std::vector<FitBand> bands;  // one per fitted family
  std::optional<analysis::HeadsAblation> heads;
  std::string heads_error;
  // The whole result of analysis::RunFit in the request's form (what `moelab fit --json`
  // prints): the power form's members above are copied from it; the other forms are drawn from
  // it (gui/view_fit_forms.cc). Unset for a stored row and when nothing could be fitted.
  std::optional<analysis::FitResult> form_result;
  std::string error;  // why nothing could be fitted
  double seconds = 0;
};

class FitJob {
 public:
  FitJob();
  ~FitJob();
  FitJob(const FitJob&) = delete;
  FitJob& operator=(const FitJob&) = delete;

  // Queues the request unless it equals the one in flight or done; a newer request replaces
  // one that has not started.
  void Submit(const FitRequest& request);
  std::shared_ptr<const FitResult> Result() const;
  bool Busy() const;

 private:
  void Loop();
  mutable std::mutex mu_;
  std::condition_variable wake_;
  std::optional<FitRequest> pending_;
  std::optional<FitRequest> last_;  // in flight or done
  std::shared_ptr<const FitResult> result_;
  bool busy_ = false;
  bool stop_ = false;
  std::thread thread_;
};

// The fit work itself (also called directly by tests): analysis::RunFit, the dispatch `moelab
// fit` runs, in the request's form with the request's options (RunFitOptionsOf), so the GUI and
// the CLI print the same numbers for the same runs; the power form adds each family's curve and
// band and, when base and treatment are chosen, the heads ablation beside the laws.
FitResult ComputeFits(const FitRequest& request);

// The options `moelab fit` would run with for this request: --form, --by, --resamples, --seed,
// --level, --min-seeds, --max-failed-fraction, --reference, --target-loss, --base,
// --treatment, --budgets, and --final-only / --all-points where the request says (nullopt:
// neither, WSD runs then use their post-decay points). One bootstrap thread: the GUI shares
// the machine with the runs it watches (the numbers do not depend on it).
analysis::RunFitOptions RunFitOptionsOf(const FitRequest& request);

// The request that recomputes a stored fit with the options it was made with (resamples,
// seed, level, min seeds, final-only, reference, model-free targets).
FitRequest RequestFromStored(const FitResult& stored, const std::string& db_path);

// A power-law fit `moelab fit` stored ({"fits": {"families": [...]}, "multipliers": {...}}, or
// the families at the top level as older rows have them) as the view's FitResult: each
// family's parameters, frontier and ranges, its curve (no band: the draws are not stored), the
// observations it was fitted on (inputs_json), the stored multiplier and model-free tables and
// the options (options_json). nullopt, with
// the reason in *why, when the row holds no family the curve can be drawn from.
std::optional<FitResult> FitResultFromStored(const db::FitRecord& record, std::string* why);

// An estimate as text, never "nan": "1.149 [1.05, 1.21]" with fmt ("%.3f", "%.4g") applied to
// each number; without an interval (an end is not a number, as a stored row writes null) the
// estimate and why: "1.149 (1 seed: no interval)" from analysis' note "1 seed: too few for an
// interval (...)", "(no interval)" when no note says why; an estimate that is not a number is
// "none" with the reason.
std::string EstimateText(const analysis::Estimate& e, const std::string& note,
                         const char* fmt = "%.4g");
// The short reason of an interval note ("1 seed: no interval"; "no interval" when empty).
std::string NoIntervalReason(const std::string& note);
// The options a fit ran with, one phrase each, as `moelab fit`'s flags name them.
std::vector<std::string> OptionsText(const analysis::FitOptions& o);

// The fitted curve of one family over its measured compute range (3x beyond each end, the
// multiplier's own extrapolation limit) and, when the fit has bootstrap draws, its 5-95 %
// band (lo/hi empty otherwise).
FitBand CurveAndBand(const analysis::PowerLawFit& fit);

}  // namespace moelab::gui
