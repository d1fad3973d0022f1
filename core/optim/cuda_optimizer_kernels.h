// Launchers of the device optimizer kernels (core/optim/cuda_optimizer_kernels.cu); plain C++
// signatures so host code needs no CUDA compiler. Pointers are device pointers; `bf16` buffers
// are __nv_bfloat16 arrays passed as void*.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace moelab::cudaopt {

// AdamW over a table of segments (device array of AdamSegment), one launch.
struct AdamSegment {
  uint64_t offset;  // into params/grads
  uint64_t size;
  uint64_t state_offset;  // into m/v
  int decay;              // 1: weight decay applies
};
void LaunchAdamW(const AdamSegment* segments, int num_segments, uint64_t max_size, float* params,
                 const float* grads, float* m, float* v, float b1, float b2, float step_size,
                 float inv_sqrt_c2, float eps, float decay, cudaStream_t stream);

// Muon: momentum update and the NS input written to each tensor's bank slot (fp32 or bf16).
struct MuonTensor {
  uint64_t offset;  // into params/grads
  uint64_t size;
  uint64_t momentum_offset;  // into momentum
  uint64_t bank_offset;      // into bank
  float scale;               // s (update scale)
};
void LaunchMuonMomentum(const MuonTensor* tensors, int num_tensors, uint64_t max_size,
                        const float* grads, float* momentum, void* bank, bool bank_bf16, float mu,
                        bool nesterov, cudaStream_t stream);
// W ← W·decay − lr·s·O with O read from the bank.
void LaunchMuonUpdate(const MuonTensor* tensors, int num_tensors, uint64_t max_size, float* params,
                      const void* bank, bool bank_bf16, float lr, float decay, cudaStream_t stream);
// Per-matrix x ← x / (‖x‖_F + eps) for `batch` contiguous matrices of `elems` elements.
void LaunchNormalizeMatrices(void* x, bool bf16, int batch, uint64_t elems, float eps,
                             cudaStream_t stream);

// QK-Clip: arena[offset .. offset+count) *= factor for each entry (device array).
struct ScaleRange {
  uint64_t offset;
  uint64_t count;
  float factor;
};
void LaunchScaleRanges(const ScaleRange* ranges, int num_ranges, uint64_t max_count, float* arena,
                       cudaStream_t stream);

// Σ x² per block in double into partial[blocks]; returns the block count used (fixed for n, so
// the host sum is deterministic).
int LaunchSumSquares(const float* x, uint64_t n, double* partial, int max_blocks,
                     cudaStream_t stream);
void LaunchScale(float* x, uint64_t n, float s, cudaStream_t stream);
// fp32 → bf16 copy (the bf16 compute weights from the fp32 masters).
void LaunchToBf16(const float* in, void* out, uint64_t n, cudaStream_t stream);

}  // namespace moelab::cudaopt
