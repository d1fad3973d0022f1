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

namespace moelab {

// params, grads of Step: device fp32 arenas with the CPU model's layout. state() returns host
// mirrors: SyncToHost() before a checkpoint is written from them, SyncToDevice() after one was
// read into them. ns_bf16: Newton–Schulz iterates in bf16 (fp32 accumulation); false keeps them
// fp32 (the twin tests). Throws std::runtime_error in a build without CUDA.
std::unique_ptr<Optimizer> MakeCudaOptimizer(const OptimizerConfig& config,
                                             const std::vector<ParamInfo>& params, bool ns_bf16);

// Applies a QK-Clip plan to a device arena (one launch).
void ApplyQkClipPlanOnDevice(const QkClipPlan& plan, float* device_arena);
// ‖g‖₂ of a device array, summed in double in a fixed order (deterministic), and its square.
double DeviceL2Norm(const float* device_data, size_t n);
double DeviceSumSquares(const float* device_data, size_t n);
// x *= s on a device array.
void DeviceScale(float* device_data, size_t n, float s);

}  // namespace moelab
