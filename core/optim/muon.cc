#include "core/optim/muon.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <stdexcept>

namespace moelab {

double MuonUpdateScale(const std::string& mode, int rows, int cols) {
  if (mode == "rms_match") return 0.2 * std::sqrt(static_cast<double>(std::max(rows, cols)));
  if (mode == "shape") {
    return std::sqrt(std::max(1.0, static_cast<double>(rows) / static_cast<double>(cols)));
  }
  throw std::invalid_argument("optimizer.muon_scale: unknown mode '" + mode +
                              "' (expected \"rms_match\" or \"shape\")");
}

Muon::Muon(const OptimizerConfig& config, const std::vector<ParamInfo>& params) : config_(config) {
  if (config.muon_ns_steps < 0) throw std::invalid_argument("optimizer.muon_ns_steps must be >= 0");
  ns_options_.steps = config.muon_ns_steps;
  if (config.muon_ns_kernel == "gram") ns_options_.kernel = cpu::NsKernel::kGram;

  std::vector<ParamInfo> rest;
  std::map<std::pair<int, int>, int> bank_of_shape;
  size_t momentum = 0;
  for (const ParamInfo& p : params) {
    if (!p.is_hidden_matrix()) {
      rest.push_back(p);
      continue;
    }
    const auto shape = std::make_pair(p.rows, p.cols);
    auto it = bank_of_shape.find(shape);
    if (it == bank_of_shape.end()) {
      it = bank_of_shape.emplace(shape, static_cast<int>(banks_.size())).first;
      banks_.push_back({p.rows, p.cols});
    }
    Bank& bank = banks_[it->second];
    // bank_offset is provisional (position inside the bank) until the banks are laid out.
    tensors_.push_back({p.name, p.offset, p.size(), momentum,
                        static_cast<size_t>(bank.batch) * p.rows * p.cols,
                        static_cast<float>(MuonUpdateScale(config.muon_scale, p.rows, p.cols))});
    bank.batch += p.batch;
    momentum += p.size();
  }
  size_t bank_total = 0;
  for (Bank& b : banks_) {
    b.offset = bank_total;
    bank_total += static_cast<size_t>(b.batch) * b.rows * b.cols;
  }
  {
    size_t t = 0;
    for (const ParamInfo& p : params) {
      if (!p.is_hidden_matrix()) continue;
      tensors_[t++].bank_offset += banks_[bank_of_shape.at({p.rows, p.cols})].offset;
    }
  }
  momentum_.assign(momentum, 0.0f);
  bank_.assign(bank_total, 0.0f);
  if (!rest.empty()) adamw_ = std::make_unique<AdamW>(config, rest);

  // Group mapping in parameter order, for the run's recorded config.
  std::map<std::string, std::string> adam_groups;
  if (adamw_) {
    for (auto& [name, group] : adamw_->groups()) adam_groups[name] = group;
  }
  for (const ParamInfo& p : params) {
    groups_.push_back({p.name, p.is_hidden_matrix() ? "muon" : adam_groups.at(p.name)});
  }
}

void Muon::Step(float* params, const float* grads, double lr, int64_t step) {
  const float mu = static_cast<float>(config_.muon_momentum);
  const bool nesterov = config_.muon_nesterov;
  // 1) Momentum, and the NS input written straight into the tensor's bank slot.
  for (const Tensor& t : tensors_) {
    const float* g = grads + t.offset;
    float* m = momentum_.data() + t.momentum_offset;
    float* u = bank_.data() + t.bank_offset;
    const long n = static_cast<long>(t.size);
    if (nesterov) {
#pragma omp parallel for simd schedule(static) if (n > 65536)
      for (long i = 0; i < n; ++i) {
        m[i] = mu * m[i] + g[i];
        u[i] = g[i] + mu * m[i];
      }
    } else {
#pragma omp parallel for simd schedule(static) if (n > 65536)
      for (long i = 0; i < n; ++i) {
        m[i] = mu * m[i] + g[i];
        u[i] = m[i];
      }
    }
  }
  // 2) Orthogonalise every bank in place, all its matrices as one batch.
  for (const Bank& b : banks_) {
    float* x = bank_.data() + b.offset;
    cpu::NewtonSchulz(x, x, b.batch, b.rows, b.cols, ns_options_, &ws_);
  }
  // 3) W ← W·(1 − η·λ) − η·s·O. Decay applies to every Muon matrix (no_decay lists the kinds
  // that AdamW handles; hidden matrices are always decayed, as in Moonlight/K2).
  const float decay = static_cast<float>(1.0 - lr * config_.weight_decay);
  for (const Tensor& t : tensors_) {
    float* w = params + t.offset;
    const float* o = bank_.data() + t.bank_offset;
    const float step_size = static_cast<float>(lr * t.scale);
    const long n = static_cast<long>(t.size);
#pragma omp parallel for simd schedule(static) if (n > 65536)
    for (long i = 0; i < n; ++i) w[i] = w[i] * decay - step_size * o[i];
  }
  // optimizer.adamw_lr sets the AdamW group's peak; the schedule's factor (lr / peak) applies.
  const double adam_lr = config_.adamw_lr > 0 ? lr * config_.adamw_lr / config_.lr : lr;
  if (adamw_) adamw_->Step(params, grads, adam_lr, step);
}

std::vector<StateBuffer> Muon::state() {
  std::vector<StateBuffer> out = {{"muon.momentum", &momentum_}};
  if (adamw_) {
    for (const StateBuffer& s : adamw_->state()) out.push_back(s);
  }
  return out;
}

std::vector<std::pair<std::string, std::string>> Muon::groups() const { return groups_; }

std::unique_ptr<Optimizer> MakeMuon(const OptimizerConfig& config,
                                    const std::vector<ParamInfo>& params) {
  return std::make_unique<Muon>(config, params);
}

}  // namespace moelab
