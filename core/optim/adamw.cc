#include "core/optim/adamw.h"

#include <algorithm>
#include <cmath>

namespace moelab {

bool ExcludedFromDecay(const OptimizerConfig& config, const ParamInfo& p) {
  const std::string kind = ParamKindName(p.kind);
  return std::find(config.no_decay.begin(), config.no_decay.end(), kind) != config.no_decay.end();
}

AdamW::AdamW(const OptimizerConfig& config, const std::vector<ParamInfo>& params)
    : config_(config) {
  size_t state = 0;
  for (const ParamInfo& p : params) {
    segments_.push_back({p.offset, p.size(), state, !ExcludedFromDecay(config, p), p.name});
    state += p.size();
  }
  m_.assign(state, 0.0f);
  v_.assign(state, 0.0f);
}

void AdamW::Step(float* params, const float* grads, double lr, int64_t step) {
  const double b1 = config_.beta1, b2 = config_.beta2;
  // Bias corrections folded into the step size and epsilon, in double for accuracy.
  const double c1 = 1.0 - std::pow(b1, static_cast<double>(step));
  const double c2 = 1.0 - std::pow(b2, static_cast<double>(step));
  const float step_size = static_cast<float>(lr / c1);
  const float inv_sqrt_c2 = static_cast<float>(1.0 / std::sqrt(c2));
  const float eps = static_cast<float>(config_.eps);
  const float fb1 = static_cast<float>(b1), fb2 = static_cast<float>(b2);
  for (const Segment& s : segments_) {
    const float decay = s.decay ? static_cast<float>(1.0 - lr * config_.weight_decay) : 1.0f;
    float* w = params + s.offset;
    const float* g = grads + s.offset;
    float* m = m_.data() + s.state_offset;
    float* v = v_.data() + s.state_offset;
    const long n = static_cast<long>(s.size);
#pragma omp parallel for simd schedule(static) if (n > 65536)
    for (long i = 0; i < n; ++i) {
      m[i] = fb1 * m[i] + (1.0f - fb1) * g[i];
      v[i] = fb2 * v[i] + (1.0f - fb2) * g[i] * g[i];
      const float denom = std::sqrt(v[i]) * inv_sqrt_c2 + eps;
      w[i] = w[i] * decay - step_size * m[i] / denom;
    }
  }
}

std::vector<StateBuffer> AdamW::state() { return {{"adamw.m", &m_}, {"adamw.v", &v_}}; }

std::vector<std::pair<std::string, std::string>> AdamW::groups() const {
  std::vector<std::pair<std::string, std::string>> out;
  for (const Segment& s : segments_) out.push_back({s.name, s.decay ? "adamw" : "adamw_no_decay"});
  return out;
}

}  // namespace moelab
