#include "gui/plan_calibration.h"

#include <exception>

namespace moelab::gui {

PlanCalibrator::~PlanCalibrator() {
  if (worker_.joinable()) worker_.join();
}

std::optional<sweeps::Throughput> PlanCalibrator::Rate(const std::string& key, int threads,
                                                       const RunConfig& config) {
  const Key k{key, threads};
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    auto it = state_->done.find(k);
    if (it != state_->done.end()) return it->second;
    if (state_->busy) return std::nullopt;
    state_->busy = true;
  }
  if (worker_.joinable()) worker_.join();  // the last measurement, already finished
  worker_ = std::thread([state = state_, k, config] {
    sweeps::Throughput t;
    try {
      t = sweeps::MeasureThroughput(config, k.second);
    } catch (const std::exception& e) {
      t.threads = k.second;
      t.how = std::string("calibration failed: ") + e.what();
    }
    std::lock_guard<std::mutex> lock(state->mu);
    state->done[k] = t;
    state->busy = false;
  });
  return std::nullopt;
}

bool PlanCalibrator::Busy() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->busy;
}

}  // namespace moelab::gui
