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

#include "analysis/observations.h"
#include "analysis/ablation.h"
#include "analysis/scaling.h"

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
};

struct FitResult {
  FitRequest request;
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

}  // namespace moelab::gui
