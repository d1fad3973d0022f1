// CUDA twin of kernels/cpu/moe_experts.h: each expert's SwiGLU on its contiguous block of
// dispatched rows, the per-expert GEMMs issued as grouped GEMMs (GemmGrouped: one
// cublasGemmGroupedBatchedEx per product type instead of 3·E launches; see README for why not
// strided-batched), or over a chunked layout as batched GEMMs of equal shapes (below).
//
// offsets is a HOST array [E+1] (DownloadOffsets): cuBLAS needs every group's row count on the
// host. Everything else is on the device. With train.kernels.experts "device" (selection 3) the
// bf16 forward and backward run on the device-shaped grouped GEMM instead
// (grouped_gemm_device.h; the offsets are copied back to the device, and the backward's scratch
// holds dh1|dh3 side by side in each row). The MoE layer (core/model/cuda_moe.cc) calls that
// GEMM's entry points with the dispatch plan's device offsets directly: no host copy at all.
#pragma once

#include <cstdint>
#include <vector>

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

// MoeExpertsBackward's weight gradients alone, from the same inputs and its dh1, dh3 [rows, H]
// (the compact rows from host_offsets[0]): the same products, so the same bits.
template <typename T>
void MoeExpertsWeightGrads(const T* xe, const int64_t* host_offsets, int experts, int d, int hidden,
                           const T* act, const T* dye, const T* dh1, const T* dh3, float* dw1,
                           float* dw3, float* dw2, cudaStream_t stream = nullptr);

// The chunked expert layout: each expert's dispatched rows cut into chunks of `rows` rows (its last
// chunk padded with zero rows), chunk b at rows b·rows … of the chunked buffers
// (MoeGatherChunked). Every expert product is then one batched GEMM of equal shapes over the
// chunks, each chunk with its expert's weights: cuBLAS's grouped call ran at 306 TFLOP/s where one
// dense product of the same FLOPs ran at 785 (H200, 64 experts × 4096 rows; docs/performance.md).
// A weight gradient sums its expert's chunks in rounds, in chunk order (deterministic).
struct MoeChunks {
  int rows = 0;                // per chunk, a multiple of 8
  std::vector<int> expert;     // [B] each chunk's expert, experts in order
  std::vector<int> round;      // [B] its index among its expert's chunks
  int rounds = 0;              // the most chunks one expert has
  std::vector<int64_t> table;  // [2B] each chunk's first compact row, then its expert's end row
  int count() const { return static_cast<int>(expert.size()); }
};
// Rows per chunk for nk dispatched rows over E experts: a quarter of the mean load, rounded down
// to 8 (at least 8), so padding adds at most E·rows ≤ nk/4 (+8E) rows.
int MoeChunkRows(int64_t nk, int experts);
// The most rows the chunked layout can take: nk + E·MoeChunkRows(nk, E).
int64_t MoeChunkedRows(int64_t nk, int experts);
// host_offsets [E+1]: the compact layout (DownloadOffsets).
MoeChunks PlanMoeChunks(const int64_t* host_offsets, int experts, int rows);

// bf16 experts over the chunked layout: xc, h1, h3, act, yc [B·rows, ·]. Backward: dxc
// overwritten (it may be dyc's buffer: dyc is read before dxc is written), dw* (fp32 masters)
// overwritten, zero for an expert without rows; scratch [B·rows, 2H].
void MoeExpertsForwardChunked(const bf16* xc, const MoeChunks& ch, int d, int hidden,
                              const bf16* w1, const bf16* w3, const bf16* w2, bf16* h1, bf16* h3,
                              bf16* act, bf16* yc, cudaStream_t stream = nullptr);
void MoeExpertsBackwardChunked(const bf16* xc, const MoeChunks& ch, int experts, int d, int hidden,
                               const bf16* w1, const bf16* w3, const bf16* w2, const bf16* h1,
                               const bf16* h3, const bf16* act, const bf16* dyc, bf16* dxc,
                               float* dw1, float* dw3, float* dw2, bf16* scratch,
                               cudaStream_t stream = nullptr);

}  // namespace moelab::cuda
