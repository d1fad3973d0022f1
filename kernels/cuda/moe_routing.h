// CUDA twin of kernels/cpu/moe_routing.h (fp32, and bf16 expert rows for bf16 mode): Route,
// Dispatch, Combine and their backward passes, same arguments over device pointers. Every kernel is
// one thread (or one block) per token / row with per-token serial loops in the CPU's order, so the
// results do not depend on the launch shape; counts and the dispatch plan use integer atomics only
// (exact).
#pragma once

#include <cstdint>

#include "kernels/cuda/device.h"

namespace moelab::cuda {

// As cpu::MoeRoute: scores, topk (ties to the lower index, slot order = descending biased
// score), gates (route_scale · renormalised unbiased scores), counts [E] (overwritten).
// Requires k <= 32.
template <typename T>
void MoeRoute(const T* logits, int n, int experts, int k, bool sigmoid, const T* bias,
              double route_scale, T* scores, int* topk, T* gates, int64_t* counts,
              cudaStream_t stream = nullptr);

// As cpu::MoeAuxLoss; reads counts and scores on the device and returns the loss on the host
// (synchronises the stream).
template <typename T>
double MoeAuxLoss(const T* scores, const int64_t* counts, int n, int experts, int k, bool sigmoid,
                  double coef, cudaStream_t stream = nullptr);

// Σ_t of the normalised scores per expert (softmax: s_{t,e}; sigmoid: s_{t,e}/Σ_j s_{t,j}), in
// double, into host_sums [E] (synchronises the stream): the P_e numerators of the Switch aux loss
// that a global-batch statistics hook sums over ranks (core/model/moe.h, MoeBatchStats).
template <typename T>
void MoeScoreSums(const T* scores, int n, int experts, bool sigmoid, double* host_sums,
                  cudaStream_t stream = nullptr);

template <typename T>
void MoeRouteBackward(const T* scores, const int* topk, const T* dgates, const int64_t* counts,
                      int n, int experts, int k, bool sigmoid, double route_scale, double aux_coef,
                      T* dlogits, cudaStream_t stream = nullptr);

// Stable counting sort by expert (by token, then slot), as cpu::MoeDispatchPlan, all outputs on
// the device: offsets [E+1], row_token [n·k], slot_row [n·k].
void MoeDispatchPlan(const int* topk, int n, int experts, int k, int64_t* offsets, int* row_token,
                     int* slot_row, cudaStream_t stream = nullptr);

// Copies offsets [E+1] to the host (the expert GEMMs need the row counts there; synchronises).
void DownloadOffsets(const int64_t* offsets, int experts, int64_t* host_offsets,
                     cudaStream_t stream = nullptr);

// Between the compact expert layout (expert e's rows at offsets[e] …, the dispatch plan's) and the
// padded one (at e·cap …, each expert cap rows; cap ≥ every count): padding rows are written as
// zeros; unpadding copies the real rows back. offsets [E+1] on the device. T = float or bf16.
// MoeGather into the padded layout: row e·cap + j gets x[row_token[offsets[e] + j]], or zeros.
template <typename T>
void MoeGatherPadded(const T* x, int d, const int* row_token, const int64_t* offsets, int experts,
                     int cap, T* padded, cudaStream_t stream = nullptr);
template <typename T>
void MoePadRows(const T* compact, const int64_t* offsets, int experts, int cap, int d, T* padded,
                cudaStream_t stream = nullptr);
template <typename T>
void MoeUnpadRows(const T* padded, const int64_t* offsets, int experts, int cap, int d, T* compact,
                  cudaStream_t stream = nullptr);

// T = float, or bf16 (a copy: bf16 mode gathers the bf16 cast of x).
template <typename T>
void MoeGather(const T* x, int d, const int* row_token, int64_t rows, T* xe,
               cudaStream_t stream = nullptr);

template <typename T>
void MoeGatherBackward(const T* dxe, const int* slot_row, int n, int k, int d, T* dx,
                       bool accumulate, cudaStream_t stream = nullptr);

template <typename T>
void MoeCombine(const T* ye, const int* slot_row, const T* gates, int n, int k, int d, T* y,
                bool accumulate, cudaStream_t stream = nullptr);

// dye may alias ye.
template <typename T>
void MoeCombineBackward(const T* dy, const T* ye, const int* slot_row, const T* gates, int n, int k,
                        int d, T* dye, T* dgates, cudaStream_t stream = nullptr);

// bf16 mode: the expert rows (dxe, ye, dye) are bf16, the token side (dx, y, dy, gates, dgates)
// fp32. Same kernels and summation order as the fp32 versions, each bf16 element widened exactly
// to fp32, so on bf16-representable rows they equal the fp32 results; dye is g·dy rounded to bf16.
void MoeGatherBackward(const bf16* dxe, const int* slot_row, int n, int k, int d, float* dx,
                       bool accumulate, cudaStream_t stream = nullptr);
void MoeCombine(const bf16* ye, const int* slot_row, const float* gates, int n, int k, int d,
                float* y, bool accumulate, cudaStream_t stream = nullptr);
void MoeCombineBackward(const float* dy, const bf16* ye, const int* slot_row, const float* gates,
                        int n, int k, int d, bf16* dye, float* dgates,
                        cudaStream_t stream = nullptr);

}  // namespace moelab::cuda
