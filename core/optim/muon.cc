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

Muon::Muon(const OptimizerConfig& config, const std::vector<ParamInfo>& params, OptimizerOps& ops)
    : config_(config), ops_(ops) {
  if (config.muon_ns_steps < 0) throw std::invalid_argument("optimizer.muon_ns_steps must be >= 0");
  ns_options_.steps = config.muon_ns_steps;
  if (config.muon_ns_kernel == "gram") ns_options_.kernel = cpu::NsKernel::kGram;

  // The bank layout: each tensor's slot inside its shape's bank, then the banks one after the
  // other in order of first appearance.
  std::vector<ParamInfo> rest, hidden;
  std::vector<MuonTensor> tensors;
  std::vector<MuonBankShape> shapes;
  std::vector<int> shape_of_tensor;
  std::map<std::pair<int, int>, int> bank_of_shape;
  size_t momentum = 0;
  for (const ParamInfo& p : params) {
    if (!p.is_hidden_matrix()) {
      rest.push_back(p);
      continue;
    }
    hidden.push_back(p);
    const auto shape = std::make_pair(p.rows, p.cols);
    auto it = bank_of_shape.find(shape);
    if (it == bank_of_shape.end()) {
      it = bank_of_shape.emplace(shape, static_cast<int>(shapes.size())).first;
      shapes.push_back({p.rows, p.cols});
    }
    MuonBankShape& bank = shapes[it->second];
    tensors.push_back({p.offset, p.size(), momentum,
                       static_cast<size_t>(bank.batch) * p.rows * p.cols,
                       static_cast<float>(MuonUpdateScale(config.muon_scale, p.rows, p.cols))});
    shape_of_tensor.push_back(it->second);
    bank.batch += p.batch;
    momentum += p.size();
  }
  size_t bank_total = 0;
  for (MuonBankShape& b : shapes) {
    b.offset = bank_total;
    bank_total += static_cast<size_t>(b.batch) * b.rows * b.cols;
  }
  for (size_t t = 0; t < tensors.size(); ++t) {
    tensors[t].bank_offset += shapes[shape_of_tensor[t]].offset;
  }
  bank_ = ops.MakeMuonBank(tensors, shapes);
  span_ = ArenaSpanOf(hidden);
  momentum_ = std::make_unique<StateArray>(ops.memory(), momentum);
  if (!rest.empty()) adamw_ = std::make_unique<AdamW>(config, rest, ops);

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
  // 1) Momentum, and the NS input written straight into the tensor's bank slot.
  ops_.MuonMomentum(*bank_, grads, momentum_->data(), static_cast<float>(config_.muon_momentum),
                    config_.muon_nesterov);
  // 2) Orthogonalise every bank in place, all its matrices as one batch.
  ops_.NewtonSchulz(*bank_, ns_options_);
  // 3) W ← W·(1 − η·λ) − η·s·O. Decay applies to every Muon matrix (no_decay lists the kinds
  // that AdamW handles; hidden matrices are always decayed, as in Moonlight/K2).
  const float decay = static_cast<float>(1.0 - lr * config_.weight_decay);
  ops_.MuonApply(*bank_, params, lr, decay, copy_);
  MarkWritten(copy_, span_);
  // optimizer.adamw_lr sets the AdamW group's peak; the schedule's factor (lr / peak) applies.
  const double adam_lr = config_.adamw_lr > 0 ? lr * config_.adamw_lr / config_.lr : lr;
  if (adamw_) adamw_->Step(params, grads, adam_lr, step);
}

std::vector<StateBuffer> Muon::state() {
  std::vector<StateBuffer> out = {{"muon.momentum", momentum_->host()}};
  if (adamw_) {
    for (const StateBuffer& s : adamw_->state()) out.push_back(s);
  }
  return out;
}

std::vector<std::pair<std::string, std::string>> Muon::groups() const { return groups_; }

void Muon::SyncToHost() {
  momentum_->SyncToHost();
  if (adamw_) adamw_->SyncToHost();
}

void Muon::SyncToDevice() {
  momentum_->SyncToDevice();
  if (adamw_) adamw_->SyncToDevice();
}

void Muon::WriteWeightCopy(WeightCopy* copy) {
  copy_ = copy;
  if (adamw_) adamw_->WriteWeightCopy(copy);
}

std::unique_ptr<Optimizer> MakeMuon(const OptimizerConfig& config,
                                    const std::vector<ParamInfo>& params, OptimizerOps& ops) {
  return std::make_unique<Muon>(config, params, ops);
}

}  // namespace moelab
