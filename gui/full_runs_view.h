// The Full runs view: a promoted run's live validation curve over its predicted band, the
// source sweep's runs on the same FLOPs axis, and how far the run sits from the prediction in
// band units (flagged when it leaves the band). Self-contained: App only forwards the frame.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "gui/full_runs_model.h"
#include "gui/plot.h"

namespace moelab::gui {

class FullRunsView {
 public:
  // Draws the view for the database at db_path; clears *settled while data is loading.
  void Draw(const std::string& db_path, bool* settled);

 private:
  std::unique_ptr<FullRunsLoader> loader_;
  int64_t selected_ = -1;  // promotion id; -1 follows the newest
  AxisState x_, y_;
};

}  // namespace moelab::gui
