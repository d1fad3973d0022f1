// The small interface through which the trainer reports; db/ implements it with SQLite.
// core/ knows nothing about storage.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "core/step_stats.h"
#include "core/run_status.h"

namespace moelab {

struct StepRecord {
  int64_t step = 0;  // 1-based index of the finished optimizer step
  double loss = 0;   // training cross-entropy
  double aux_loss = 0;
  double lr = 0;
  double grad_norm = 0;  // global gradient norm before clipping
  int64_t tokens = 0;    // tokens seen so far
  double flops = 0;      // cumulative training FLOPs
  double step_time_s = 0;
  double tokens_per_s = 0;
  // RMS of the attention-path norm gains after the step (core/model/norm_gain_rms.h); NaN
  // (stored as NULL) where the trainer does not compute it.
  double norm_gain_rms = std::numeric_limits<double>::quiet_NaN();
};

struct ClipEvent {
  int64_t step = 0;
  int layer = 0;
  int head = 0;
  double s_max = 0;
  double gamma = 0;
};

class MetricsSink {
 public:
  virtual ~MetricsSink() = default;
  // Per step: the record, the per-(layer, head) max logits and per-(moe layer, expert) counts.
  virtual void OnStep(const StepRecord& record, const StepStats& stats) = 0;
  virtual void OnEval(int64_t step, int64_t tokens, double flops, double val_loss) = 0;
  virtual void OnClip(const std::vector<ClipEvent>& events) = 0;
  // Called at least every few seconds while training; marks the run alive.
  virtual void OnHeartbeat() = 0;
  // Called when a checkpoint has been written atomically.
  virtual void OnCheckpoint(int64_t step, const std::string& path) = 0;
  virtual void OnEnd(RunStatus status, const std::string& error) = 0;
};

}  // namespace moelab

namespace moelab {

// Discards everything (benchmarks, tests).
class NullSink : public MetricsSink {
 public:
  void OnStep(const StepRecord&, const StepStats&) override {}
  void OnEval(int64_t, int64_t, double, double) override {}
  void OnClip(const std::vector<ClipEvent>&) override {}
  void OnHeartbeat() override {}
  void OnCheckpoint(int64_t, const std::string&) override {}
  void OnEnd(RunStatus, const std::string&) override {}
};

}  // namespace moelab
