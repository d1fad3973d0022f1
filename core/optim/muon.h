// Muon (Keller Jordan; Moonlight/Kimi K2 scaling) for every 2-D hidden weight, AdamW for the
// rest (embedding, LM head, norms, router):
//   M ← μ·M + G;  U = G + μ·M (Nesterov) or M;  O = NS5(U);  W ← W − η·(s·O + λ·W)
// with s = 0.2·√max(rows, cols) ("rms_match", Moonlight/K2: update RMS ≈ 0.2 like AdamW, so
// AdamW's η and λ carry over) or √max(1, rows/cols) ("shape", Keller's original).
// Stacked expert tensors are `batch` separate matrices. Same-shape matrices of all tensors are
// gathered into one bank so Newton–Schulz runs them as one batch (all experts of a layer, and
// the q/k/v/o of every layer).
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/optim/adamw.h"
#include "core/optim/optimizer.h"
#include "kernels/cpu/newton_schulz.h"

namespace moelab {

// The update scale s for a rows×cols matrix; mode is "rms_match" or "shape" (else throws
// std::invalid_argument).
double MuonUpdateScale(const std::string& mode, int rows, int cols);

class Muon : public Optimizer {
 public:
  Muon(const OptimizerConfig& config, const std::vector<ParamInfo>& params);
  void Step(float* params, const float* grads, double lr, int64_t step) override;
  // "muon.momentum" (hidden matrices in parameter order) followed by the AdamW buffers.
  std::vector<StateBuffer> state() override;
  // Every tensor in parameter order: "muon", "adamw" or "adamw_no_decay".
  std::vector<std::pair<std::string, std::string>> groups() const override;

  // Newton–Schulz kernel/threading/steps (steps default to config.muon_ns_steps). E.g.
  // NsKernel::kGram halves the NS cost of 1:4 matrices at ~1e-4 more rounding; not the default
  // until a config field selects it.
  void set_ns_options(const cpu::NewtonSchulzOptions& options) { ns_options_ = options; }
  const cpu::NewtonSchulzOptions& ns_options() const { return ns_options_; }

  // Newton–Schulz scratch in bytes (steady state: no allocation after the first step).
  size_t workspace_bytes() const { return ws_.bytes(); }

 private:
  struct Tensor {
    std::string name;
    size_t offset;  // into the parameter / gradient arenas
    size_t size;
    size_t momentum_offset;  // into momentum_
    size_t bank_offset;      // into bank_ (where its NS input/output lives)
    float scale;             // s
  };
  struct Bank {  // every matrix of one shape, contiguous in bank_
    int rows, cols;
    int batch = 0;
    size_t offset = 0;
  };
  OptimizerConfig config_;
  std::vector<Tensor> tensors_;
  std::vector<Bank> banks_;
  std::vector<float> momentum_;
  std::vector<float> bank_;
  std::unique_ptr<AdamW> adamw_;  // null when every tensor is a hidden matrix
  std::vector<std::pair<std::string, std::string>> groups_;
  cpu::NewtonSchulzOptions ns_options_;
  cpu::NewtonSchulzWorkspace<float> ws_;
};

std::unique_ptr<Optimizer> MakeMuon(const OptimizerConfig& config,
                                    const std::vector<ParamInfo>& params);

}  // namespace moelab
