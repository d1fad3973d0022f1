// The CUDA optimizer ops (core/model/optimizer_ops.h) and the bf16 weight copy they write:
// kernels/cuda launches only (kernels/cuda/optim.h, newton_schulz.h), no host synchronisation in
// a step. The optimizers themselves are core/optim's, the same objects as on the CPU.
// In a build without CUDA this header declares nothing.
#pragma once

#include <cstddef>
#include <memory>
#include <utility>
#include <vector>

#include "core/model/optimizer_ops.h"

#if MOELAB_HAVE_CUDA
#include "kernels/cuda/device.h"

namespace moelab {

// The bf16 compute copy of a device fp32 weight arena (the CUDA backend's in bf16 mode). The
// optimizers write it in their update (WeightCopy::MarkWritten); Refresh() casts only what they
// did not write since the last Refresh.
class Bf16WeightCopy final : public WeightCopy {
 public:
  void Resize(size_t n);  // n elements, zero-filled; forgets the marks
  void* data() override { return values_.data(); }
  const cuda::bf16* values() const { return values_.data(); }
  void MarkWritten(size_t begin, size_t end) override;
  // Makes the copy current for the fp32 `weights` (the arena, Resize's n elements): casts the
  // spans no MarkWritten covered, then forgets the marks.
  void Refresh(const float* weights);
  // The weights were written by something else (a checkpoint load, a copy): the next Refresh
  // casts everything.
  void Forget() { written_.clear(); }

 private:
  cuda::DeviceBuffer<cuda::bf16> values_;
  std::vector<std::pair<size_t, size_t>> written_;
};

class CudaOptimizerOps final : public OptimizerOps {
 public:
  // memory: the CUDA backend's (optimizer state lives there). ns_bf16: Newton–Schulz iterates in
  // bf16 (fp32 accumulation; bf16 runs), else fp32 (the twin tests).
  CudaOptimizerOps(BackendMemory* memory, bool ns_bf16) : memory_(memory), ns_bf16_(ns_bf16) {}

  BackendMemory& memory() override { return *memory_; }
  std::unique_ptr<AdamWTable> MakeAdamWTable(const std::vector<AdamWTensor>& tensors) override;
  void AdamWStep(const AdamWTable& table, const AdamWScalars& s, float* w, const float* g, float* m,
                 float* v, WeightCopy* copy) override;
  std::unique_ptr<MuonBank> MakeMuonBank(const std::vector<MuonTensor>& tensors,
                                         const std::vector<MuonBankShape>& shapes) override;
  void MuonMomentum(MuonBank& bank, const float* g, float* m, float mu, bool nesterov) override;
  void NewtonSchulz(MuonBank& bank, const cpu::NewtonSchulzOptions& options) override;
  void MuonApply(MuonBank& bank, float* w, double lr, float decay, WeightCopy* copy) override;
  // Synchronises: the sum comes back to the host.
  double SumSquares(const float* x, size_t n) override;
  void Scale(float* x, size_t n, float s) override;
  void ScaleRows(const std::vector<RowScale>& rows, float* arena, WeightCopy* copy) override;

 private:
  BackendMemory* memory_;
  bool ns_bf16_;
  cuda::DeviceBuffer<double> sum_;  // SumSquares' result
};

}  // namespace moelab
#endif
