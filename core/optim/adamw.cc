#include "core/optim/adamw.h"

#include <algorithm>
#include <cmath>

namespace moelab {
namespace {

size_t StateSize(const std::vector<ParamInfo>& params) {
  size_t n = 0;
  for (const ParamInfo& p : params) n += p.size();
  return n;
}

}  // namespace

bool ExcludedFromDecay(const OptimizerConfig& config, const ParamInfo& p) {
  const std::string kind = ParamKindName(p.kind);
  return std::find(config.no_decay.begin(), config.no_decay.end(), kind) != config.no_decay.end();
}

AdamWScalars AdamWScalarsOf(const OptimizerConfig& config, double lr, int64_t step) {
  const double b1 = config.beta1, b2 = config.beta2;
  // Bias corrections folded into the step size and epsilon, in double for accuracy.
  const double c1 = 1.0 - std::pow(b1, static_cast<double>(step));
  const double c2 = 1.0 - std::pow(b2, static_cast<double>(step));
  AdamWScalars s;
  s.step_size = static_cast<float>(lr / c1);
  s.inv_sqrt_c2 = static_cast<float>(1.0 / std::sqrt(c2));
  s.eps = static_cast<float>(config.eps);
  s.b1 = static_cast<float>(b1);
  s.b2 = static_cast<float>(b2);
  s.decay = static_cast<float>(1.0 - lr * config.weight_decay);
  return s;
}

AdamW::AdamW(const OptimizerConfig& config, const std::vector<ParamInfo>& params, OptimizerOps& ops)
    : config_(config),
      ops_(ops),
      span_(ArenaSpanOf(params)),
      m_(ops.memory(), StateSize(params)),
      v_(ops.memory(), StateSize(params)) {
  std::vector<AdamWTensor> tensors;
  size_t state = 0;
  for (const ParamInfo& p : params) {
    const bool decay = !ExcludedFromDecay(config, p);
    tensors.push_back({p.offset, p.size(), state, decay});
    groups_.push_back({p.name, decay ? "adamw" : "adamw_no_decay"});
    state += p.size();
  }
  table_ = ops.MakeAdamWTable(tensors);
}

void AdamW::Step(float* params, const float* grads, double lr, int64_t step) {
  ops_.AdamWStep(*table_, AdamWScalarsOf(config_, lr, step), params, grads, m_.data(), v_.data(),
                 copy_);
  MarkWritten(copy_, span_);
}

std::vector<StateBuffer> AdamW::state() { return {{"adamw.m", m_.host()}, {"adamw.v", v_.host()}}; }

std::vector<std::pair<std::string, std::string>> AdamW::groups() const { return groups_; }

void AdamW::SyncToHost() {
  m_.SyncToHost();
  v_.SyncToHost();
}

void AdamW::SyncToDevice() {
  m_.SyncToDevice();
  v_.SyncToDevice();
}

}  // namespace moelab
