// CUDA twin of kernels/cpu/swiglu.h (fp32): three cuBLAS GEMMs and elementwise kernels.
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

}  // namespace moelab::cuda
