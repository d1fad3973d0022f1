// CUDA twin of kernels/cpu/norm.h (fp32): RMSNorm, the residual add fused with it, and grouped
// RMSNorm on strided rows for QK-norm and MLA latents. Same arguments, device pointers. dgain is
// reduced over rows in a fixed order (deterministic, no atomics).
#pragma once

#include "kernels/cuda/device.h"

namespace moelab::cuda {

template <typename T>
void RmsNormForward(const T* x, const T* gain, int n, int d, double eps, T* y, T* rstd,
                    cudaStream_t stream = nullptr);

// sum = a + b (may alias a or b), y = RMSNorm(sum), rstd kept: one kernel that reads a and b and
// writes sum and y once; bit for bit an add then RmsNormForward on this device.
template <typename T>
void AddRmsNormForward(const T* a, const T* b, T* sum, const T* gain, int n, int d, double eps,
                       T* y, T* rstd, cudaStream_t stream = nullptr);

// bf16 mode's norms (the CUDA backend's GEMM operands): y and rstd exactly as RmsNormForward /
// AddRmsNormForward write them, and in the same pass yb[i] = y[i] rounded to bf16 (round to
// nearest even: the bits CastToBf16(y) gives), so no cast runs between the norm and the GEMM.
void RmsNormForwardBf16(const float* x, const float* gain, int n, int d, double eps, float* y,
                        bf16* yb, float* rstd, cudaStream_t stream = nullptr);
void AddRmsNormForwardBf16(const float* a, const float* b, float* sum, const float* gain, int n,
                           int d, double eps, float* y, bf16* yb, float* rstd,
                           cudaStream_t stream = nullptr);

template <typename T>
void RmsNormBackward(const T* x, const T* gain, const T* rstd, const T* dy, int n, int d, T* dx,
                     T* dgain, bool accumulate_dx, cudaStream_t stream = nullptr);

template <typename T>
void RmsNormGroupsForward(const T* x, int ldx, T* y, int ldy, int n, int groups, int d,
                          const T* gain, double eps, T* rstd, cudaStream_t stream = nullptr);

// dx may be dy itself when the strides match.
template <typename T>
void RmsNormGroupsBackward(const T* x, int ldx, const T* gain, const T* rstd, const T* dy, int lddy,
                           T* dx, int lddx, int n, int groups, int d, T* dgain,
                           cudaStream_t stream = nullptr);

}  // namespace moelab::cuda
