// CUDA twin of kernels/cpu/newton_schulz.h: Muon's NS5 on a bank of same-shape row-major
// matrices (the banking of core/optim/muon.cc: one call per bank), with cuBLAS strided-batched
// GEMMs over the whole bank. cuBLAS has no batched SYRK/SYMM, so each step is three full
// batched GEMMs (A = X·Xᵀ, B = b·A + c·A·A, X ← a·X + B·X), the CPU's kGemm formulation; tall
// matrices iterate as their transpose like the CPU (small Gram matrix, no data transposed).
// The norm is per matrix, accumulated in double.
#pragma once

#include <cstddef>

#include "kernels/cpu/newton_schulz.h"
#include "kernels/cuda/device.h"

namespace moelab::cuda {

// Device elements of T that NewtonSchulz needs as workspace for a bank.
size_t NewtonSchulzWorkspaceSize(int batch, int rows, int cols);

// out[b] = NS_steps(in[b]), b < batch, each [rows, cols] contiguous; in may equal out.
// T = float (fp32 GEMMs) or bf16 (bf16 iterates, fp32 accumulation). workspace: device,
// NewtonSchulzWorkspaceSize elements. Coefficients and eps: cpu::kNsA/B/C, cpu::kNsEps.
template <typename T>
void NewtonSchulz(const T* in, T* out, int batch, int rows, int cols, int steps, T* workspace,
                  cudaStream_t stream = nullptr);

}  // namespace moelab::cuda
