// Optimizers update the whole flat parameter arena from the gradient arena. AdamW lives here;
// Muon/MuonClip implement the same interface.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/config.h"
#include "core/model/model.h"

namespace moelab {

// A named float buffer of optimizer state, saved in checkpoints.
struct StateBuffer {
  std::string name;
  std::vector<float>* data;
};

// The copy of the weights a backend computes with (CUDA's bf16 GEMM operands; element i is the
// copy of parameter i). An optimizer that can writes it in the same pass as its update and marks
// the span it wrote, so the backend's next WeightsChanged() refreshes only the rest (what else
// changed the weights: another rank's ZeRO-1 shard, a checkpoint load) instead of re-reading
// the whole arena. Backend-specific data behind a device-agnostic hand-over.
class WeightCopy {
 public:
  virtual ~WeightCopy() = default;
  // The copy: bf16 elements in the backend's memory, parallel to the parameter arena.
  virtual void* data() = 0;
  // The copy of every parameter inside arena elements [begin, end) is current, until the next
  // WeightsChanged().
  virtual void MarkWritten(size_t begin, size_t end) = 0;
};

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  // One update of params from grads at learning rate lr; step is 1-based.
  virtual void Step(float* params, const float* grads, double lr, int64_t step) = 0;
  virtual std::vector<StateBuffer> state() = 0;
  // Human-readable parameter-group mapping, e.g. {"layers.0.attn.wq": "muon"}.
  virtual std::vector<std::pair<std::string, std::string>> groups() const = 0;
  // An optimizer on a device keeps its state there; state() are host mirrors: SyncToHost()
  // before a checkpoint is written from them, SyncToDevice() after one was read into them.
  virtual void SyncToHost() {}
  virtual void SyncToDevice() {}
  // Hands over the backend's weight copy (Backend::weight_copy(); null: none) for Step to write
  // alongside the parameters passed to it, which must then be that backend's arena. Optimizers
  // that cannot write it ignore it: the backend then refreshes the whole copy.
  virtual void WriteWeightCopy(WeightCopy* copy) { (void)copy; }
};

std::unique_ptr<Optimizer> MakeOptimizer(const OptimizerConfig& config,
                                         const std::vector<ParamInfo>& params);
// The optimizer for a run's device: the CPU one above, or on train.device "cuda" the device
// optimizer of core/optim/cuda_optimizer.h (Newton–Schulz in the run's precision).
std::unique_ptr<Optimizer> MakeOptimizer(const RunConfig& run,
                                         const std::vector<ParamInfo>& params);

// Learning rate at 1-based step of total_steps for the schedule, peak lr.
double ScheduledLr(const ScheduleConfig& s, double peak_lr, int64_t step, int64_t total_steps);

}  // namespace moelab
