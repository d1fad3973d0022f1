// Checks of the register layouts the fused attention's mma kernels assume, on the GPU: one warp
// multiplies A (16×16) by B (16×8) through kernels/cuda/mma.cuh's `mma.sync` m16n8k16 bf16
// fragments; one warp loads a tile by cp.async and ldmatrix as flash_forward_mma.cuh does. They
// isolate the layout when a kernel test fails.
#pragma once

#include <cstdint>

namespace moelab::cuda {

// a: 16×16 and b: 16×8 bf16 bit patterns (row-major, host memory); c: 16×8 fp32 (host). Throws
// (CUDA error text) without a device.
void MmaTileProductOnDevice(const uint16_t* a, const uint16_t* b, float* c);

// The ldmatrix.x4 (plain and .trans) and cp.async (with zero fill) the mma forward uses
// (flash::LdMatrixProbe in flash_forward_mma.cuh), on the GPU: tile 32×8 bf16 bit patterns
// (host), rows ≥ valid zero-filled; out 32 lanes × 8 registers (host). Throws without a device.
void MmaLdMatrixOnDevice(const uint16_t* tile, int valid, uint32_t* out);

}  // namespace moelab::cuda
