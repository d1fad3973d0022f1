// The routed experts on our own grouped GEMM whose problem shapes and operand pointers are written
// on the device (train.kernels.experts "device"; issue 34, item 3): before each product a one-block
// kernel reads the dispatch plan's offsets (device memory) and writes every expert's shape,
// pointers and first tile; a persistent sm_90 kernel (bf16 mma.sync, fp32 accumulation, 128×128×32
// tiles, 4-stage cp.async pipeline) then walks the tiles of all experts. No row count reaches the
// host and every launch has a fixed shape, so a layer's forward and backward need no host sync
// and can be captured in a CUDA graph. Device code and its design: grouped_gemm_device.cuh.
//
// The products, per expert (rows offsets[e] … offsets[e+1]):
//   forward   h1, h3 = xe·W1ᵀ, xe·W3ᵀ with act = silu(h1)·h3 in the epilogue (one launch);
//             ye = act·W2ᵀ
//   backward  dact = dye·W2 with SwiGLU's backward in the epilogue → dh1|dh3 (scratch [rows, 2H]);
//             dxe = [dh1|dh3]·[W1;W3] (one product of K = 2H); [dW1;dW3] = [dh1|dh3]ᵀ·xe and
//             dW2 = dyeᵀ·act, grouped along K (the expert's rows), written straight into the fp32
//             master gradients.
// Same layouts and contracts as MoeExpertsForward/Backward<bf16> (moe_experts.h), except that the
// offsets are on the device. The weights stay W1, W3 [E, H, d] and W2 [E, d, H]: the gate and up
// tile reads 64 rows of W1 and the same 64 of W3, so a fused [E, 2H, d] copy is not needed.
//
// Differences in the bits from the cuBLAS grouped path (rounding only): every product one fp32
// sum per output in k order (dxe one sum over both halves, where the grouped path rounds dh1·W1
// to bf16 before adding dh3·W3). Compiled for sm_80+ (mma.sync, cp.async, ldmatrix); not yet run
// on a GPU: its index math is checked by tests/cuda_kernels/grouped_gemm_device_emulation_test.cc.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "kernels/cuda/device.h"

namespace moelab::cuda {

// Whether the kernels take these widths (16-byte rows: d and hidden multiples of 8); *why says
// why not.
bool DeviceGroupedGemmSupports(int d, int hidden, std::string* why = nullptr);

// Bytes of device workspace a layer of `experts` needs (the problems and the tile prefix; reused
// by every product in stream order).
size_t DeviceGroupedGemmWorkspaceBytes(int experts);

// offsets: device [E+1] (the dispatch plan's). xe, h1, h3, act, ye [offsets[E], ·] rows at their
// dispatched index. workspace: DeviceGroupedGemmWorkspaceBytes(experts), 16-byte aligned.
void MoeExpertsForwardDevice(const bf16* xe, const int64_t* offsets, int experts, int d, int hidden,
                             const bf16* w1, const bf16* w3, const bf16* w2, bf16* h1, bf16* h3,
                             bf16* act, bf16* ye, void* workspace, cudaStream_t stream = nullptr);

// dxe overwritten; dw1, dw3 [E,H,d], dw2 [E,d,H] (fp32 masters) overwritten, zero for an expert
// with no rows. scratch: [rows, 2H] (dh1|dh3 per row, rows relative to offsets[0]).
void MoeExpertsBackwardDevice(const bf16* xe, const int64_t* offsets, int experts, int d,
                              int hidden, const bf16* w1, const bf16* w3, const bf16* w2,
                              const bf16* h1, const bf16* h3, const bf16* act, const bf16* dye,
                              bf16* dxe, float* dw1, float* dw3, float* dw2, bf16* scratch,
                              void* workspace, cudaStream_t stream = nullptr);

// Persistent blocks a launch uses on the current device (2 an SM), and the kernel's resources as
// compiled (cudaFuncGetAttributes of the forward's gate-and-up kernel): registers a thread and
// local (spill) bytes.
int DeviceGroupedGemmBlocks();
void DeviceGroupedGemmResources(int* registers, int* local_bytes);

}  // namespace moelab::cuda
