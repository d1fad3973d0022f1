// Optimizers over device arenas (train.device "cuda"): AdamW, Muon with batched Newton–Schulz
// through cuBLAS (the same shape banks as the CPU Muon, fp32 or bf16 iterates), QK-Clip on the
// device, and the global gradient norm. The optimizer state has the CPU layout and names
// ("adamw.m", "adamw.v", "muon.momentum"), so checkpoints move between devices.
// Every entry point exists in every build; without CUDA, MakeCudaOptimizer throws.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/config.h"
#include "core/model/model.h"
#include "core/optim/optimizer.h"
#include "core/optim/qk_clip_plan.h"

#if MOELAB_HAVE_CUDA
#include "kernels/cuda/device.h"
#endif

namespace moelab {

// params, grads of Step: device fp32 arenas with the CPU model's layout. state() returns host
// mirrors: SyncToHost() before a checkpoint is written from them, SyncToDevice() after one was
// read into them. ns_bf16: Newton–Schulz iterates in bf16 (fp32 accumulation); false keeps them
// fp32 (the twin tests). Given a WeightCopy (WriteWeightCopy), Step writes the bf16 copy of every
// weight it updates in the same pass and marks the span of its parameters written: every
// parameter there is this optimizer's (the whole model, or a ZeRO-1 rank's contiguous shard).
// Step issues no host synchronisation. Throws std::runtime_error in a build without CUDA.
std::unique_ptr<Optimizer> MakeCudaOptimizer(const OptimizerConfig& config,
                                             const std::vector<ParamInfo>& params, bool ns_bf16);

// The parts of [0, n) that no span of `written` covers, in order (what a weight copy's refresh
// still has to cast). Spans may overlap, touch or come unsorted.
std::vector<std::pair<size_t, size_t>> UnwrittenSpans(
    std::vector<std::pair<size_t, size_t>> written, size_t n);

// Applies a QK-Clip plan to a device arena (one launch, no host synchronisation); bf16_copy
// (null: none) is the arena's bf16 copy, whose scaled elements are re-rounded in the same pass.
void ApplyQkClipPlanOnDevice(const QkClipPlan& plan, float* device_arena,
                             void* bf16_copy = nullptr);
// ‖g‖₂ of a device array, summed in double in a fixed order (deterministic), and its square.
double DeviceL2Norm(const float* device_data, size_t n);
double DeviceSumSquares(const float* device_data, size_t n);
// x *= s on a device array.
void DeviceScale(float* device_data, size_t n, float s);

#if MOELAB_HAVE_CUDA
// The bf16 compute copy of a device fp32 weight arena (the CUDA backend's in bf16 mode). The
// device optimizers write it in their update (WeightCopy::MarkWritten); Refresh() casts only
// what they did not write since the last Refresh.
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
#endif

}  // namespace moelab
