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
#include "analysis/observations.h"
#include "analysis/scaling.h"
#include "db/fits.h"

namespace moelab::gui {

struct FitRequest {
  std::string db_path;
  std::optional<int64_t> sweep_id;          // nullopt: every run
  std::string family_key;                   // run variable name or dotted config key
  std::string heads_base, heads_treatment;  // families for the heads ablation ("" = skip)
  int resamples = 200;        // fewer than the CLI's 1000: the view refits as runs finish
  uint64_t data_version = 0;  // bumps when the set of finished runs changes
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
  analysis::ObservationSet observations;
  std::optional<analysis::FamilyFits> fits;
  std::vector<FitBand> bands;  // one per fitted family
  std::optional<analysis::HeadsAblation> heads;
  std::string heads_error;
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

// The fit work itself (also called directly by tests).
FitResult ComputeFits(const FitRequest& request);

// A power-law fit `moelab fit` stored ({"fits": {"families": [...]}, "multipliers": {...}}, or
// the families at the top level as older rows have them) as the view's FitResult: each
// family's parameters, frontier and ranges, its curve (no band: the draws are not stored), the
// observations it was fitted on (inputs_json) and the stored multiplier table. nullopt, with
// the reason in *why, when the row holds no family the curve can be drawn from.
std::optional<FitResult> FitResultFromStored(const db::FitRecord& record, std::string* why);

// The fitted curve of one family over its measured compute range (3x beyond each end, the
// multiplier's own extrapolation limit) and, when the fit has bootstrap draws, its 5-95 %
// band (lo/hi empty otherwise).
FitBand CurveAndBand(const analysis::PowerLawFit& fit);

}  // namespace moelab::gui
