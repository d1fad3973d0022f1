// Data of the Full runs view: the promotions recorded in the database, and for the chosen one
// its plan (predicted curve and band), its run's live validation curve, and the source sweep's
// runs on the same training-FLOPs axis. Loaded on a background thread with its own read-only
// connection (the UI thread never touches SQLite); no ImGui here, so tests can check it.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "core/run_status.h"
#include "db/promotions.h"

namespace moelab::gui {

struct RunCurve {
  int64_t run = 0;
  std::string name;
  RunStatus status = RunStatus::kQueued;
  std::vector<double> flops, loss;  // validation loss vs cumulative training FLOPs
};

struct FullRunsData {
  std::string db_path;
  std::vector<db::PromotionRecord> promotions;  // newest first
  int64_t promotion = -1;                       // the one loaded below (-1: none)
  nlohmann::json plan;                          // its plan (curve, band, shape, memory, time)
  RunCurve promoted;
  std::vector<RunCurve> sweep;
  // Where the promoted run's evaluations sit in band units (0 = on the prediction, ±1 = edges).
  std::vector<double> band_units;
  double last_band_units = 0;  // NaN before the first evaluation
  bool outside = false;        // |last| > 1
  std::string error;
  uint64_t version = 0;
};

// Band units of each (flops, loss) point against the plan (promote::BandUnits).
std::vector<double> BandUnitsOf(const nlohmann::json& plan, const RunCurve& curve);

// Loads everything synchronously (the loader's body; tests call it directly).
FullRunsData LoadFullRuns(const std::string& db_path, int64_t promotion_id);

class FullRunsLoader {
 public:
  explicit FullRunsLoader(std::string db_path, double poll_interval_s = 1.0);
  ~FullRunsLoader();
  FullRunsLoader(const FullRunsLoader&) = delete;
  FullRunsLoader& operator=(const FullRunsLoader&) = delete;
  // -1: the newest promotion.
  void Select(int64_t promotion_id);
  std::shared_ptr<const FullRunsData> Data() const;
  const std::string& path() const { return path_; }

 private:
  void Loop();
  const std::string path_;
  const double interval_s_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  int64_t wanted_ = -1;
  std::shared_ptr<const FullRunsData> data_;
  std::thread thread_;
};

}  // namespace moelab::gui
