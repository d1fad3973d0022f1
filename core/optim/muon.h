// Muon (Keller Jordan; Moonlight/Kimi K2 scaling) for every 2-D hidden weight, AdamW for the
// rest (embedding, LM head, norms, router):
//   M ← μ·M + G;  U = G + μ·M (Nesterov) or M;  O = NS5(U);  W ← W − η·(s·O + λ·W)
// with s = 0.2·√max(rows, cols) ("rms_match", Moonlight/K2: update RMS ≈ 0.2 like AdamW, so
// AdamW's η and λ carry over) or √max(1, rows/cols) ("shape", Keller's original).
// Stacked expert tensors are `batch` separate matrices. Same-shape matrices of all tensors are
// gathered into one bank so Newton–Schulz runs them as one batch (all experts of a layer, and
// the q/k/v/o of every layer). Written once over a backend's optimizer ops: the bank lives in
// the backend (CUDA in bf16 iterates in bf16).
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/optim/adamw.h"
#include "core/optim/optimizer.h"
#include "core/optim/state_array.h"

namespace moelab {

// The update scale s for a rows×cols matrix; mode is "rms_match" or "shape" (else throws
// std::invalid_argument).
double MuonUpdateScale(const std::string& mode, int rows, int cols);

class Muon : public Optimizer {
 public:
  Muon(const OptimizerConfig& config, const std::vector<ParamInfo>& params,
       OptimizerOps& ops = CpuOptimizerOps());
  void Step(float* params, const float* grads, double lr, int64_t step) override;
  // "muon.momentum" (hidden matrices in parameter order) followed by the AdamW buffers.
  std::vector<StateBuffer> state() override;
  // Every tensor in parameter order: "muon", "adamw" or "adamw_no_decay".
  std::vector<std::pair<std::string, std::string>> groups() const override;
  void SyncToHost() override;
  void SyncToDevice() override;
  void WriteWeightCopy(WeightCopy* copy) override;

  // Newton–Schulz kernel/threading/steps (steps default to config.muon_ns_steps; a device
  // backend reads the steps only). E.g.
  // NsKernel::kGram halves the NS cost of 1:4 matrices at ~1e-4 more rounding; not the default
  // until a config field selects it.
  void set_ns_options(const cpu::NewtonSchulzOptions& options) { ns_options_ = options; }
  const cpu::NewtonSchulzOptions& ns_options() const { return ns_options_; }

  // Newton–Schulz scratch in bytes (steady state: no allocation after the first step).
  size_t workspace_bytes() const { return bank_->workspace_bytes(); }

 private:
  OptimizerConfig config_;
  OptimizerOps& ops_;
  std::unique_ptr<OptimizerOps::MuonBank> bank_;
  std::pair<size_t, size_t> span_;  // the arena elements of its hidden matrices
  std::unique_ptr<StateArray> momentum_;
  std::unique_ptr<AdamW> adamw_;  // null when every tensor is a hidden matrix
  std::vector<std::pair<std::string, std::string>> groups_;
  cpu::NewtonSchulzOptions ns_options_;
  WeightCopy* copy_ = nullptr;
};

std::unique_ptr<Optimizer> MakeMuon(const OptimizerConfig& config,
                                    const std::vector<ParamInfo>& params,
                                    OptimizerOps& ops = CpuOptimizerOps());

}  // namespace moelab
