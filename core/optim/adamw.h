// AdamW with decoupled weight decay and bias correction, over any subset of the parameter arena,
// on any backend (its OptimizerOps, core/model/optimizer_ops.h).
#pragma once

#include <memory>
#include <utility>
#include <vector>

#include "core/optim/optimizer.h"
#include "core/optim/state_array.h"

namespace moelab {

// True when the config's no_decay list excludes this kind of parameter from weight decay.
bool ExcludedFromDecay(const OptimizerConfig& config, const ParamInfo& p);

// The per-step constants of AdamW at learning rate lr, 1-based step.
AdamWScalars AdamWScalarsOf(const OptimizerConfig& config, double lr, int64_t step);

class AdamW : public Optimizer {
 public:
  // Updates exactly the given tensors (a subset when Muon owns the hidden matrices), over the
  // arenas of the backend whose ops are given.
  AdamW(const OptimizerConfig& config, const std::vector<ParamInfo>& params,
        OptimizerOps& ops = CpuOptimizerOps());
  void Step(float* params, const float* grads, double lr, int64_t step) override;
  std::vector<StateBuffer> state() override;
  std::vector<std::pair<std::string, std::string>> groups() const override;
  void SyncToHost() override;
  void SyncToDevice() override;
  void WriteWeightCopy(WeightCopy* copy) override { copy_ = copy; }

 private:
  OptimizerConfig config_;
  OptimizerOps& ops_;
  std::vector<std::pair<std::string, std::string>> groups_;
  std::unique_ptr<OptimizerOps::AdamWTable> table_;
  std::pair<size_t, size_t> span_;  // the arena elements its tensors cover
  StateArray m_, v_;
  WeightCopy* copy_ = nullptr;
};

}  // namespace moelab
