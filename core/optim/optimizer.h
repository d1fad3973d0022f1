// Optimizers update the whole flat parameter arena from the gradient arena, written once over a
// backend's optimizer ops (core/model/optimizer_ops.h): AdamW (adamw.h), Muon and MuonClip
// (muon.h; the clip itself is core/optim/qk_clip_plan.h, run by the training loop).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/config.h"
#include "core/model/model.h"
#include "core/model/optimizer_ops.h"

namespace moelab {

// A named float buffer of optimizer state, saved in checkpoints.
struct StateBuffer {
  std::string name;
  std::vector<float>* data;
};

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  // One update of params from grads at learning rate lr; step is 1-based.
  virtual void Step(float* params, const float* grads, double lr, int64_t step) = 0;
  virtual std::vector<StateBuffer> state() = 0;
  // Human-readable parameter-group mapping, e.g. {"layers.0.attn.wq": "muon"}.
  virtual std::vector<std::pair<std::string, std::string>> groups() const = 0;
  // An optimizer on a device keeps its state there; state() are host mirrors (StateArray):
  // SyncToHost() before a checkpoint is written from them, SyncToDevice() after one was read
  // into them.
  virtual void SyncToHost() {}
  virtual void SyncToDevice() {}
  // Hands over the backend's weight copy (Backend::weight_copy(); null: none) for Step to write
  // alongside the parameters passed to it, which must then be that backend's arena. Optimizers
  // that cannot write it ignore it: the backend then refreshes the whole copy.
  virtual void WriteWeightCopy(WeightCopy* copy) { (void)copy; }
};

// The optimizer config.name names (TraitsOf, core/optimizer_traits.h), over the arenas of
// the backend whose ops are given (Backend::optimizer_ops(); default: host memory). Throws
// std::runtime_error for a name this build lacks.
std::unique_ptr<Optimizer> MakeOptimizer(const OptimizerConfig& config,
                                         const std::vector<ParamInfo>& params,
                                         OptimizerOps& ops = CpuOptimizerOps());

// The span of arena elements covering `params`: [first offset, last end); {0, 0} when empty.
std::pair<size_t, size_t> ArenaSpanOf(const std::vector<ParamInfo>& params);
// After an update that wrote the copy (null: none) of every parameter in span: marks it.
inline void MarkWritten(WeightCopy* copy, std::pair<size_t, size_t> span) {
  if (copy && span.second > span.first) copy->MarkWritten(span.first, span.second);
}

// Learning rate at 1-based step of total_steps for the schedule, peak lr.
double ScheduledLr(const ScheduleConfig& s, double peak_lr, int64_t step, int64_t total_steps);

}  // namespace moelab
