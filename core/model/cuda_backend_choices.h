// How the CUDA backend reads train.kernels and sizes attention: shared by the op table
// (cuda_backend.cc), the device memory plan (cuda_memory_plan.cc) and the supports-checks
// (cuda_supports.cc), so the three agree on the path a run takes. CUDA builds only.
#pragma once

#if MOELAB_HAVE_CUDA

#include <cstddef>

#include "core/config.h"
#include "kernels/cpu/attention.h"
#include "kernels/cuda/device.h"

namespace moelab {

// Whether the fused (flash) attention runs this config; a ConfigError where "fused" was asked
// and the kernels cannot run the shape.
bool ChooseFlash(const RunConfig& c);
// train.kernels.attention_acts "bf16".
bool AttentionActsBf16(const RunConfig& c);
// train.kernels as the launchers' process-wide selection (kernels/cuda/device.h).
cuda::KernelSelection KernelSelectionOf(const KernelChoices& k);
// Elements the attention saves for its backward, and its scratch, for the chosen path.
size_t AttentionSaved(bool flash, const cpu::AttentionDims& a);
size_t AttentionScratch(bool flash, const cpu::AttentionDims& a);
// Elements of the bf16 cast buffers at `rows` tokens.
size_t CastElements(const ModelConfig& m, size_t rows);

}  // namespace moelab

#endif  // MOELAB_HAVE_CUDA
