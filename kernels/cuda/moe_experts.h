// CUDA twin of kernels/cpu/moe_experts.h: each expert's SwiGLU on its contiguous block of
// dispatched rows, the per-expert GEMMs issued as grouped GEMMs (GemmGrouped: one
// cublasGemmGroupedBatchedEx per product type instead of 3·E launches; see README for why not
// strided-batched), or over a padded layout as strided-batched GEMMs (below).
//
// offsets is a HOST array [E+1] (DownloadOffsets): cuBLAS needs every group's row count on the
// host. Everything else is on the device.
#pragma once

#include <cstdint>

#include "kernels/cuda/device.h"

namespace moelab::cuda {

// T = float (the fp32 twin) or bf16 (bf16 xe, weights, h1, h3, act, ye; fp32 accumulation).
template <typename T>
void MoeExpertsForward(const T* xe, const int64_t* host_offsets, int experts, int d, int hidden,
                       const T* w1, const T* w3, const T* w2, T* h1, T* h3, T* act, T* ye,
                       cudaStream_t stream = nullptr);

// dxe [rows,d] overwritten; dw1, dw3 [E,H,d], dw2 [E,d,H] overwritten (zero for an expert with
// no rows). scratch: [rows, 2H]. For T = bf16 the weight gradients are still fp32 (masters).
template <typename T>
void MoeExpertsBackward(const T* xe, const int64_t* host_offsets, int experts, int d, int hidden,
                        const T* w1, const T* w3, const T* w2, const T* h1, const T* h3,
                        const T* act, const T* dye, T* dxe, float* dw1, float* dw3, float* dw2,
                        T* scratch, cudaStream_t stream = nullptr);

// The padded layout (MoePadRows): expert e's rows at e·cap … e·cap + count_e − 1, the rest of its
// cap rows zeros. Each product is one strided-batched GEMM over the E experts: at gpu-moe's shapes
// cuBLAS's grouped call ran at 306 TFLOP/s where one dense product of the same FLOPs ran at 785
// (H200; docs/performance.md), so padding to the largest expert wins while the routing is
// balanced enough (the caller decides: DeviceMoe). cap is known on the host (the counts'
// read-back). xp, h1, h3, act, yp: [E·cap, ·]; dxp overwritten (it may be dyp's buffer: dyp is
// read before dxp is written); dw* overwritten (an expert with no rows gets exact zeros from its
// padding); scratch [E·cap, 2H].
template <typename T>
void MoeExpertsForwardPadded(const T* xp, int experts, int cap, int d, int hidden, const T* w1,
                             const T* w3, const T* w2, T* h1, T* h3, T* act, T* yp,
                             cudaStream_t stream = nullptr);
template <typename T>
void MoeExpertsBackwardPadded(const T* xp, int experts, int cap, int d, int hidden, const T* w1,
                              const T* w3, const T* w2, const T* h1, const T* h3, const T* act,
                              const T* dyp, T* dxp, float* dw1, float* dw3, float* dw2, T* scratch,
                              cudaStream_t stream = nullptr);

}  // namespace moelab::cuda
