// CUDA twin of kernels/cpu/cross_entropy.h (fp32 logits, double accumulation per row): softmax
// cross-entropy with z-loss, fused with its backward (logits overwritten by the gradient).
// One block per row; the mean is summed over rows in row order (bit-reproducible).
#pragma once

#include <cstdint>

#include "kernels/cpu/cross_entropy.h"
#include "kernels/cuda/device.h"

namespace moelab::cuda {

using CrossEntropyResult = cpu::CrossEntropyResult;

// row_scratch: device double [2n + 2]. Returns the host result (synchronises the stream).
template <typename T>
CrossEntropyResult CrossEntropy(T* logits, const int32_t* targets, int n, int vocab, double z_coef,
                                bool backward, double* row_scratch, cudaStream_t stream = nullptr);

// Same, without the synchronisation: result_out (device double [2]) gets {loss, z_loss}.
template <typename T>
void CrossEntropyAsync(T* logits, const int32_t* targets, int n, int vocab, double z_coef,
                       bool backward, double* row_scratch, double* result_out,
                       cudaStream_t stream = nullptr);

}  // namespace moelab::cuda
