// CUDA twin of kernels/cpu/newton_schulz.h: Muon's NS5 on a bank of same-shape row-major
// matrices (the banking of core/optim/muon.cc: one call per bank). cuBLAS has no batched SYRK or
// SYMM, so the symmetric products A = X·Xᵀ and c·A·A are computed tile by tile, only the tiles on
// and below the diagonal, in one pointer-array batched GEMM over the whole bank each, and
// mirrored by a small kernel (as modded-nanogpt's Newton–Schulz does); X ← B·X is a full
// strided-batched GEMM. Tall matrices iterate as their transpose like the CPU (small Gram matrix,
// no data transposed). The norm is per matrix, accumulated in double. Buffers ping-pong in the
// caller's workspace: no per-iteration copies or allocations, no host synchronisation.
#pragma once

#include <cstddef>

#include "kernels/cpu/newton_schulz.h"
#include "kernels/cuda/device.h"

namespace moelab::cuda {

// Device elements of T that NewtonSchulz needs as workspace for a bank.
size_t NewtonSchulzWorkspaceSize(int batch, int rows, int cols);

// The smallest tile side of the symmetric products: smaller m×m products are computed whole.
inline constexpr int kNsMinTile = 128;

// out[b] = NS_steps(in[b]), b < batch, each [rows, cols] contiguous; in may equal out.
// T = float (fp32 GEMMs) or bf16 (bf16 iterates, fp32 accumulation). workspace: device,
// NewtonSchulzWorkspaceSize elements. Coefficients and eps: cpu::kNsA/B/C, cpu::kNsEps.
// min_tile: the symmetric products' tile side is the smallest multiple of 8 ≥ min_tile that
// divides min(rows, cols) at least twice (none: whole products); tests lower it.
template <typename T>
void NewtonSchulz(const T* in, T* out, int batch, int rows, int cols, int steps, T* workspace,
                  cudaStream_t stream = nullptr, int min_tile = kNsMinTile);

}  // namespace moelab::cuda
