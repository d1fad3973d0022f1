// The plan preview's time estimate without blocking the UI thread. `moelab sweep plan` first
// trains the sweep's largest run for a few seconds (sweeps::MeasureThroughput) to measure this
// machine's training FLOP rate; here that measurement runs on a worker thread, once per (largest
// run's config hash, threads per run), and the rate is cached for the session: every later
// check of a spec with the same largest run reuses it at once.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>

#include "sweeps/plan.h"

namespace moelab::gui {

class PlanCalibrator {
 public:
  PlanCalibrator() = default;
  ~PlanCalibrator();  // waits for a measurement in flight (a few seconds at most)
  PlanCalibrator(const PlanCalibrator&) = delete;
  PlanCalibrator& operator=(const PlanCalibrator&) = delete;

  // The cached rate of the run with config hash `key` at `threads`, or nullopt while it is
  // measured: then a measurement of `config` starts in the background unless one is running
  // (the caller asks again later). A failed measurement is cached too (rate 0, `how` says why).
  std::optional<sweeps::Throughput> Rate(const std::string& key, int threads,
                                         const RunConfig& config);
  bool Busy() const;

 private:
  using Key = std::pair<std::string, int>;
  struct State {
    std::mutex mu;
    std::map<Key, sweeps::Throughput> done;
    bool busy = false;
  };
  std::shared_ptr<State> state_ = std::make_shared<State>();
  std::thread worker_;
};

}  // namespace moelab::gui
