// A check of the register layout kernels/cuda/mma.cuh assumes for `mma.sync` m16n8k16 bf16, on
// the GPU: one warp multiplies A (16×16) by B (16×8) through the fragments. The fused attention
// relies on that layout; this isolates it when a kernel test fails.
#pragma once

#include <cstdint>

namespace moelab::cuda {

// a: 16×16 and b: 16×8 bf16 bit patterns (row-major, host memory); c: 16×8 fp32 (host). Throws
// (CUDA error text) without a device.
void MmaTileProductOnDevice(const uint16_t* a, const uint16_t* b, float* c);

}  // namespace moelab::cuda
