// Launchers of the device kernels of core/optim/cuda_optimizer.h that are not optimizer
// arithmetic (that is kernels/cuda/optim.h): QK-Clip's range scaling, the gradient norm's
// reduction and the gradient scaling; plain C++ signatures so host code needs no CUDA compiler.
// Pointers are device pointers; `bf16` buffers are __nv_bfloat16 arrays passed as void*.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace moelab::cudaopt {

// QK-Clip: arena[offset .. offset+count) *= factor for each entry (device array); copy (null:
// none) is the arena's bf16 copy, its scaled elements re-rounded from the new fp32 values.
struct ScaleRange {
  uint64_t offset;
  uint64_t count;
  float factor;
};
void LaunchScaleRanges(const ScaleRange* ranges, int num_ranges, uint64_t max_count, float* arena,
                       void* copy, cudaStream_t stream);

// Σ x² per block in double into partial[blocks]; returns the block count used (fixed for n, so
// the host sum is deterministic).
int LaunchSumSquares(const float* x, uint64_t n, double* partial, int max_blocks,
                     cudaStream_t stream);
void LaunchScale(float* x, uint64_t n, float s, cudaStream_t stream);

}  // namespace moelab::cudaopt
