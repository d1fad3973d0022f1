// The Promote panel (beside the Scaling laws view): choose a sweep, a family and a budget or
// target loss, see the plan from the stored fit (shape, memory per device, time, predicted loss
// band), then write it (config + launch scripts + promotions row) or write and launch it. The
// planning runs promote::PreparePromotion on a worker thread, like `moelab promote`.
#pragma once

#include <future>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "promote/db.h"

namespace moelab::gui {

class PromotePanel {
 public:
  // Draws the panel for the database at db_path; clears *settled while work is in flight.
  void Draw(const std::string& db_path, bool* settled);

  // --script (gui/script.h) drives the same controls: Set() what a control would set (field:
  // sweep, family, budget, loss, ranks, threads, device, measure), applied once the sweeps and
  // fits are read; Press() a button (0 Plan, 1 Write, 2 Write and launch) on the next frame
  // that can. false with *error for an unknown field or an unusable value.
  bool Set(const std::string& field, const std::string& value, std::string* error);
  void Press(int action) { pressed_ = action; }
  // Where the last pressed action is: nothing pressed, pending or planning, planned (and
  // written), or refused (error() says why; also when a scripted choice does not exist).
  enum class State { kIdle, kBusy, kDone, kRefused };
  State state() const;
  std::string error() const;

 private:
  struct Choices {
    std::vector<std::string> sweeps;
    // Per sweep: "KEY=VALUE" families of its newest usable fit.
    std::vector<std::vector<std::string>> families;
    std::string error;
  };
  struct Outcome {
    std::optional<promote::PreparedPromotion> plan;
    std::optional<promote::RecordedPromotion> recorded;
    int pid = 0;
    std::string text, error;
  };
  std::string db_path_;
  std::future<Choices> choices_job_;
  std::optional<Choices> choices_;
  int sweep_ = 0, family_ = 0;
  char budget_[32] = "";
  char target_loss_[32] = "";
  int ranks_ = 1, threads_ = 2, device_ = 0;
  bool measure_ = false;
  std::future<Outcome> job_;
  std::optional<Outcome> outcome_;
  // Scripted choices by name, applied when the choices are there; a button to press.
  std::string want_sweep_, want_family_, script_error_;
  int pressed_ = -1;
};

}  // namespace moelab::gui
