// AdamW with decoupled weight decay and bias correction, over any subset of the parameter arena.
#pragma once

#include <vector>

#include "core/optim/optimizer.h"

namespace moelab {

// True when the config's no_decay list excludes this kind of parameter from weight decay.
bool ExcludedFromDecay(const OptimizerConfig& config, const ParamInfo& p);

class AdamW : public Optimizer {
 public:
  // Updates exactly the given tensors (a subset when Muon owns the hidden matrices).
  AdamW(const OptimizerConfig& config, const std::vector<ParamInfo>& params);
  void Step(float* params, const float* grads, double lr, int64_t step) override;
  std::vector<StateBuffer> state() override;
  std::vector<std::pair<std::string, std::string>> groups() const override;

 private:
  struct Segment {
    size_t offset;     // into the parameter arena
    size_t size;
    size_t state_offset;  // into m_ and v_
    bool decay;
    std::string name;
  };
  OptimizerConfig config_;
  std::vector<Segment> segments_;
  std::vector<float> m_, v_;
};

}  // namespace moelab
