// The optimizer half of the backend seam (core/model/backend.h): the few coarse ops the one set
// of optimizers (core/optim: AdamW, Muon, MuonClip) needs, over the backend's memory. The CPU
// table (core/model/cpu_optimizer_ops.cc) runs host loops and kernels/cpu; the CUDA table
// (core/model/cuda_optimizer_ops.h) launches kernels/cuda. The optimizers lay out their tensors,
// state and Newton–Schulz banks once, here-agnostic; a table only does the arithmetic, so every
// CPU result is the loop of the optimizer's defining equations, and the CUDA kernels are its
// twins (tests/cuda_kernels/optim_emulation_test.cc).
//
// Every pointer an op takes is memory of its backend.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "core/model/backend_memory.h"
#include "kernels/cpu/newton_schulz.h"

namespace moelab {

// Multiply `count` consecutive arena elements from `offset` by `factor` (QK-Clip's rows of a
// row-major tensor, flattened; core/optim/qk_clip_plan.h). A float arena multiplies by the factor
// rounded to float; the double one (the precision checks) by the factor itself.
struct RowScale {
  size_t offset = 0;
  size_t count = 0;
  double factor = 1;
};

// The copy of the weights a backend computes with (CUDA's bf16 GEMM operands; element i is the
// copy of parameter i). An optimizer writes it in the same pass as its update (the ops below
// take it) and marks the span it wrote, so the backend's next WeightsChanged() refreshes only the
// rest (what else changed the weights: another rank's ZeRO-1 shard, a checkpoint load) instead
// of re-reading the whole arena.
class WeightCopy {
 public:
  virtual ~WeightCopy() = default;
  // The copy: bf16 elements in the backend's memory, parallel to the parameter arena.
  virtual void* data() = 0;
  // The copy of every parameter inside arena elements [begin, end) is current, until the next
  // WeightsChanged().
  virtual void MarkWritten(size_t begin, size_t end) = 0;
};

// The parts of [0, n) that no span of `written` covers, in order (what a weight copy's refresh
// still has to cast). Spans may overlap, touch or come unsorted.
std::vector<std::pair<size_t, size_t>> UnwrittenSpans(
    std::vector<std::pair<size_t, size_t>> written, size_t n);

// One tensor of an AdamW table: parameters and gradients at `offset` of their arenas, its m and
// v at `state_offset` of the state arrays.
struct AdamWTensor {
  size_t offset = 0;
  size_t size = 0;
  size_t state_offset = 0;
  bool decay = true;  // weight decay applies (AdamWScalars::decay), else factor 1
};

// The per-step constants of AdamW, formed on the host once (core/optim/adamw.cc):
//   m = b1·m + (1−b1)·g; v = b2·v + (1−b2)·g²; w = w·decay − step_size·m/(√v·inv_sqrt_c2 + eps).
struct AdamWScalars {
  float step_size = 0;    // lr / (1 − β1^t)
  float inv_sqrt_c2 = 0;  // 1 / √(1 − β2^t)
  float eps = 0, b1 = 0, b2 = 0;
  float decay = 1;  // 1 − lr·λ, for tensors with decay
};

// One hidden matrix tensor of a Muon bank: gradient and weight at `offset`, momentum at
// `momentum_offset`, its Newton–Schulz input and output at `bank_offset` of the bank.
struct MuonTensor {
  size_t offset = 0;
  size_t size = 0;
  size_t momentum_offset = 0;
  size_t bank_offset = 0;
  float scale = 1;  // the update scale s (core/optim/muon.h MuonUpdateScale)
};

// Every matrix of one shape, contiguous in the bank from `offset` (elements): Newton–Schulz
// runs them as one batch.
struct MuonBankShape {
  int rows = 0, cols = 0;
  int batch = 0;
  size_t offset = 0;
};

class OptimizerOps {
 public:
  virtual ~OptimizerOps() = default;

  // Where optimizer state lives (core/optim/state_array.h).
  virtual BackendMemory& memory() = 0;

  // --- AdamW. A table of tensors made once (uploaded where the backend needs it), stepped in
  // table order. copy (null: none) is written with the updated weights of the table's tensors.
  class AdamWTable {
   public:
    virtual ~AdamWTable() = default;
  };
  virtual std::unique_ptr<AdamWTable> MakeAdamWTable(const std::vector<AdamWTensor>& tensors) = 0;
  virtual void AdamWStep(const AdamWTable& table, const AdamWScalars& s, float* w, const float* g,
                         float* m, float* v, WeightCopy* copy) = 0;

  // --- Muon. A bank holds the tensor table, the Newton–Schulz input/output of every hidden
  // matrix (its element type the backend's choice: CUDA in bf16 iterates in bf16) and the
  // Newton–Schulz scratch.
  class MuonBank {
   public:
    virtual ~MuonBank() = default;
    // Newton–Schulz scratch in bytes (steady after the first step).
    virtual size_t workspace_bytes() const = 0;
  };
  virtual std::unique_ptr<MuonBank> MakeMuonBank(const std::vector<MuonTensor>& tensors,
                                                 const std::vector<MuonBankShape>& shapes) = 0;
  // m = μ·m + g; bank slot = g + μ·m (Nesterov) or m.
  virtual void MuonMomentum(MuonBank& bank, const float* g, float* m, float mu, bool nesterov) = 0;
  // Every shape's matrices orthogonalised in place, one batch each. options.steps everywhere;
  // the kernel and threading choices are the CPU's.
  virtual void NewtonSchulz(MuonBank& bank, const cpu::NewtonSchulzOptions& options) = 0;
  // w = w·decay − float(lr·s)·O with O the tensor's bank slot (the step size rounded once, from
  // double); copy (null: none) written with the updated weights.
  virtual void MuonApply(MuonBank& bank, float* w, double lr, float decay, WeightCopy* copy) = 0;

  // --- Whole arrays.
  // Σ x² in double, in a fixed order (deterministic).
  virtual double SumSquares(const float* x, size_t n) = 0;
  virtual void Scale(float* x, size_t n, float s) = 0;
  // QK-Clip's row scalings on the parameter arena; copy (null: none) re-rounded where scaled.
  virtual void ScaleRows(const std::vector<RowScale>& rows, float* arena, WeightCopy* copy) = 0;
};

// The host table (core/model/cpu_optimizer_ops.cc): the CPU backend's, and the optimizers' when
// no backend is given.
OptimizerOps& CpuOptimizerOps();

}  // namespace moelab
