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

// Which kernels compute the dispatch plan (kernels/cuda/moe_dispatch_kernels.cuh); both give the
// same bits. kScan, the default and the one that has run on a GPU: one block per expert walks
// every assignment (E·n·k work). kSort: a chunked counting sort (per-chunk counts, one scan, one
// warp per chunk placing its assignments), n·k work; checked under the CPU emulation only so far.
// Opt in with train.kernels.dispatch "sort" (SelectedKernels, kernels/cuda/device.h, read at every
// call). With sort the row moves below (gather, chunked layout,
// combine and their backward passes) also move 16 bytes a thread access where rows allow
// (kernels/cuda/moe_rows_kernels.cuh: the same bits, dgates aside).
enum class MoeDispatch { kScan, kSort };
MoeDispatch MoeDispatchInUse();
// The most experts kSort's blocks can tally in 48 KiB of shared memory (an int each).
inline constexpr int kMoeSortMaxExperts = 48 * 1024 / static_cast<int>(sizeof(int));

// Stable counting sort by expert (by token, then slot), as cpu::MoeDispatchPlan, all outputs on
// the device: offsets [E+1], row_token [n·k], slot_row [n·k]. Every topk entry must be in [0, E).
// Throws std::invalid_argument (before any launch) for n·k >= 2^31 (rows are ints), for E < 1, and
// with kSort for more experts than kMoeSortMaxExperts (12288). The first overload
// runs MoeDispatchInUse()'s kind.
void MoeDispatchPlan(const int* topk, int n, int experts, int k, int64_t* offsets, int* row_token,
                     int* slot_row, cudaStream_t stream = nullptr);
void MoeDispatchPlan(const int* topk, int n, int experts, int k, int64_t* offsets, int* row_token,
                     int* slot_row, MoeDispatch kind, cudaStream_t stream = nullptr);

// Copies offsets [E+1] to the host (the expert GEMMs need the row counts there; synchronises).
void DownloadOffsets(const int64_t* offsets, int experts, int64_t* host_offsets,
                     cudaStream_t stream = nullptr);

// The chunked expert layout (MoeChunks, moe_experts.h): table [2B] on the device (each chunk's
// first compact row, then its expert's end row). MoeGatherChunked: chunked row b·rows + j gets
// x[row_token[table[b] + j]] for the chunk's real rows, zeros for its padding. MoeChunkRowsOf:
// the same from compact expert rows (no token indirection). MoeUnchunkRows: the real rows back to
// the compact layout. T = float or bf16.
template <typename T>
void MoeGatherChunked(const T* x, int d, const int* row_token, const int64_t* table, int chunks,
                      int rows, T* chunked, cudaStream_t stream = nullptr);
template <typename T>
void MoeChunkRowsOf(const T* compact, const int64_t* table, int chunks, int rows, int d, T* chunked,
                    cudaStream_t stream = nullptr);
template <typename T>
void MoeUnchunkRows(const T* chunked, const int64_t* table, int chunks, int rows, int d, T* compact,
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
