// CUDA twin of kernels/cpu/cross_entropy.h: softmax cross-entropy with z-loss, fused with its
// backward (logits overwritten by the gradient). One block per row, fp32 arithmetic (the
// log-sum-exp in double); the mean is a fixed-shape tree over the rows (bit-reproducible).
// T = float, or bf16 logits read and their bf16 gradient written in place (the LM head of the
// bf16 mode). The kernels: kernels/cuda/cross_entropy_kernels.cuh.
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

// The same with the gradient scaled by `weight` (a chunk's share of the mean) in the kernel, so
// a bf16 gradient is rounded once. T = float or bf16; weight 1 gives the bits of the above.
template <typename T>
CrossEntropyResult CrossEntropy(T* logits, const int32_t* targets, int n, int vocab, double z_coef,
                                bool backward, double weight, double* row_scratch,
                                cudaStream_t stream = nullptr);
template <typename T>
void CrossEntropyAsync(T* logits, const int32_t* targets, int n, int vocab, double z_coef,
                       bool backward, double weight, double* row_scratch, double* result_out,
                       cudaStream_t stream = nullptr);

// acc[i] = fma(weight, part[i], acc[i]) for i = 0, 1 (device doubles, one rounding: the host's
// ComposeLmHeadLoss, std::fma, bit for bit). One chunk's terms into the running sum.
void AccumulateLoss(const double* part, double weight, double* acc, cudaStream_t stream = nullptr);

}  // namespace moelab::cuda
