// CUDA twin of kernels/cpu/swiglu.h (fp32): three cuBLAS GEMMs and elementwise kernels; and the
// bf16 mode's gated FFN with gate and up projections fused (GatedFfnForwardBf16, below).
#pragma once

#include "kernels/cuda/device.h"

namespace moelab::cuda {

template <typename T>
void SwigluForward(const T* x, int n, int d, int hidden, const T* w1, const T* w3, const T* w2,
                   T* h1, T* h3, T* act, T* y, cudaStream_t stream = nullptr);

// scratch: [n, 2·hidden] device elements.
template <typename T>
void SwigluBackward(const T* x, int n, int d, int hidden, const T* w1, const T* w3, const T* w2,
                    const T* h1, const T* h3, const T* act, const T* dy, T* dx, T* dw1, T* dw3,
                    T* dw2, T* scratch, bool accumulate_dx = false, bool accumulate_dw = false,
                    cudaStream_t stream = nullptr);

// The elementwise parts, for callers (the MoE experts, bf16 paths) that run the GEMMs
// themselves: act = silu(h1)·h3; and dact -> dh1, dh3 (dh written to dh1 [n,H], dh3 [n,H]).
template <typename T>
void SwigluActivation(const T* h1, const T* h3, size_t count, T* act,
                      cudaStream_t stream = nullptr);
template <typename T>
void SwigluActivationBackward(const T* h1, const T* h3, const T* dact, size_t count, T* dh1, T* dh3,
                              cudaStream_t stream = nullptr);

// The same over paired rows: h13 [rows, 2·hidden] holds h1 in columns 0..hidden and h3 in
// hidden..2·hidden of each row (the fused gate-and-up GEMM's output); act [rows, hidden].
// Backward: dh13 holds dact in its h1 columns on entry and dh1 | dh3 on return.
void SwigluActivationPaired(const bf16* h13, int rows, int hidden, bf16* act,
                            cudaStream_t stream = nullptr);
void SwigluActivationPairedBackward(const bf16* h13, int rows, int hidden, bf16* dh13,
                                    cudaStream_t stream = nullptr);

// The SwiGLU FFN of the bf16 mode (the dense FFN and the shared experts) on bf16 intermediates:
//   h13 = xb·[W1; W3]ᵀ  [n, 2H] bf16: ONE GEMM when W3 follows W1 in memory (w3 == w1 + H·d,
//                       the model's parameter layout), else two writing the two halves;
//   act = silu(h1)·h3   [n, H] bf16;
//   y   = act·W2ᵀ       [n, d] fp32 (+= y when accumulate: the residual stream never passes
//                       through bf16).
// Backward (dyb: the bf16 cast of dy): dact = dyb·W2 into dh13's h1 columns, dh13 from the
// activation's backward, dx (= or +=) dh13·[W1; W3] as one GEMM (K = 2H) when adjacent, and the
// fp32 weight gradients dW2 = dybᵀ·act, [dW1; dW3] = dh13ᵀ·xb (one GEMM when dw3 == dw1 + H·d),
// overwritten. dh13 [n, 2H] bf16 is scratch.
void GatedFfnForwardBf16(const bf16* xb, int n, int d, int hidden, const bf16* w1, const bf16* w3,
                         const bf16* w2, bf16* h13, bf16* act, float* y, bool accumulate,
                         cudaStream_t stream = nullptr);
void GatedFfnBackwardBf16(const bf16* xb, const bf16* dyb, int n, int d, int hidden, const bf16* w1,
                          const bf16* w3, const bf16* w2, const bf16* h13, const bf16* act,
                          bf16* dh13, float* dx, bool accumulate_dx, float* dw1, float* dw3,
                          float* dw2, cudaStream_t stream = nullptr);

// train.kernels.ffn (SelectedKernels): "split" (the default: the bf16 mode's dense FFN as three
// Linear ops on fp32 intermediates, the shared experts as six GEMMs; the paths that ran on a GPU)
// or "fused" (both on GatedFfn*Bf16; not yet run on a GPU).
bool GatedFfnWanted();

}  // namespace moelab::cuda
