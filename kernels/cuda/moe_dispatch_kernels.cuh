// Device code of the MoE dispatch plan (kernels/cuda/moe_routing.h, MoeDispatchPlan): the stable
// counting sort of the (token, slot) assignments by expert, in two implementations that give the
// same bits (cpu::MoeDispatchPlan's order), chosen by train.kernels.dispatch (MoeDispatchInUse):
//   scan  (the default, the one that has run on a GPU): one block per expert walks every
//         assignment, so the work is E·n·k;
//   sort  three passes over chunks of kPlanChunk assignments: per-chunk expert counts, one scan
//         in (expert, chunk) order, one warp per chunk placing its assignments in order.
// Internal header, included by moe.cu and by tests/cuda_kernels/dispatch_emulation_test.cc, which
// runs these very kernels on the CPU under tests/cuda_kernels/emulation/cuda_emulation.h. The
// kernels are static so that the emulation's and the GPU build's versions never meet at link
// time. Precondition of both (as of the CPU's): every topk entry is in [0, E).
#pragma once

#include <cuda_runtime.h>

#include <climits>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/moe_routing.h"

// A kernel's dynamic shared memory as an array of `type` (the emulation points it at the
// emulated block's buffer instead).
#ifndef MOELAB_DYNAMIC_SMEM
#define MOELAB_DYNAMIC_SMEM(type, name) extern __shared__ type name[]
#endif

namespace moelab::cuda::dispatch {

// ---------------------------------------------------------------- launch shapes and bounds

constexpr int kScanPlanThreads = 256;                   // the scan plan's count and scatter blocks
constexpr int kPlanChunk = 1024;                        // assignments per chunk of the sort plan
constexpr int kCountThreads = 256;                      // ChunkCountKernel
constexpr int kScanThreads = 1024;                      // ScanChunkCountsKernel: one block
constexpr int kScatterThreads = 32;                     // ChunkScatterKernel: one warp per chunk
constexpr int kPerLane = kPlanChunk / kScatterThreads;  // a lane's assignments in a chunk
// The sort plan keeps one int per expert in shared memory (the count and scatter kernels), within
// the 48 KiB a kernel gets without opting in.
constexpr int kMaxSortExperts = kMoeSortMaxExperts;

// Checks what both plans need and returns the sort plan's chunk count. Rows, tokens and the sort
// plan's prefix sums are ints (row_token and slot_row hold them), so n·k must stay below 2^31;
// gpu-moe's 32k tokens × 8 are 2^18.
inline int PlanChunks(int n, int experts, int k) {
  const std::string where = "cuda::MoeDispatchPlan: ";
  if (n < 0 || k < 1 || experts < 1) {
    throw std::invalid_argument(where + "needs n >= 0, k >= 1 and experts >= 1 (got n " +
                                std::to_string(n) + ", k " + std::to_string(k) + ", experts " +
                                std::to_string(experts) + ")");
  }
  const long long nk = static_cast<long long>(n) * k;
  if (nk > INT_MAX) {
    throw std::invalid_argument(where + std::to_string(nk) +
                                " assignments (n·k) exceed the int rows of row_token and "
                                "slot_row (at most 2^31 - 1)");
  }
  return static_cast<int>(nk == 0 ? 1 : (nk + kPlanChunk - 1) / kPlanChunk);
}

// The sort plan's own limit (shared memory per block), checked only where it runs.
inline void CheckSortExperts(int experts) {
  if (experts > kMaxSortExperts) {
    throw std::invalid_argument(
        "cuda::MoeDispatchPlan (train.kernels.dispatch \"sort\"): " + std::to_string(experts) +
        " experts exceed the " + std::to_string(kMaxSortExperts) +
        " its blocks count in 48 KiB of shared memory");
  }
}

// ---------------------------------------------------------------- scan plan

// Block e counts the assignments to expert e into offsets[e + 1].
static __global__ void CountExpertKernel(const int* topk, long nk, int64_t* offsets) {
  __shared__ long long shared[32];
  const int e = blockIdx.x;
  long long c = 0;
  for (long i = threadIdx.x; i < nk; i += blockDim.x) c += topk[i] == e;
  c = detail::BlockSum(c, shared);
  if (threadIdx.x == 0) offsets[e + 1] = c;
}

static __global__ void ScanOffsetsKernel(int64_t* offsets, int E) {
  if (threadIdx.x == 0 && blockIdx.x == 0) {
    offsets[0] = 0;
    for (int e = 0; e < E; ++e) offsets[e + 1] += offsets[e];
  }
}

// Block e walks the assignments in (token, slot) order in chunks of blockDim and places its
// matches with a block-wide exclusive scan of the match flags: the CPU's stable order.
static __global__ void ScatterExpertKernel(const int* topk, long nk, int k, const int64_t* offsets,
                                           int* row_token, int* slot_row) {
  __shared__ int warp_counts[32];
  const int e = blockIdx.x;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  int64_t base = offsets[e];
  for (long c0 = 0; c0 < nk; c0 += blockDim.x) {
    const long i = c0 + threadIdx.x;
    const bool match = i < nk && topk[i] == e;
    const unsigned ballot = __ballot_sync(0xffffffffu, match);
    if (lane == 0) warp_counts[warp] = __popc(ballot);
    __syncthreads();
    int before = 0, total = 0;
    for (int w = 0; w < warps; ++w) {
      before += w < warp ? warp_counts[w] : 0;
      total += warp_counts[w];
    }
    if (match) {
      const int64_t r = base + before + __popc(ballot & ((1u << lane) - 1u));
      row_token[r] = static_cast<int>(i / k);
      slot_row[i] = static_cast<int>(r);
    }
    base += total;
    __syncthreads();  // warp_counts is rewritten by the next chunk
  }
}

// ---------------------------------------------------------------- sort plan

// Block b (kCountThreads) counts chunk b's assignments per expert into counts[e·chunks + b]
// (expert-major, the order of the scan). Shared-memory integer atomics: exact in any order.
static __global__ void ChunkCountKernel(const int* topk, long nk, int E, int chunks, int* counts) {
  MOELAB_DYNAMIC_SMEM(int, tally);  // [E]
  for (int e = threadIdx.x; e < E; e += blockDim.x) tally[e] = 0;
  __syncthreads();
  const long i0 = static_cast<long>(blockIdx.x) * kPlanChunk;
  const long i1 = nk < i0 + kPlanChunk ? nk : i0 + kPlanChunk;
  for (long i = i0 + threadIdx.x; i < i1; i += blockDim.x) atomicAdd(&tally[topk[i]], 1);
  __syncthreads();
  for (int e = threadIdx.x; e < E; e += blockDim.x)
    counts[static_cast<long>(e) * chunks + blockIdx.x] = tally[e];
}

// Inclusive scan over the warp's lanes (lane order).
static __device__ __forceinline__ int WarpInclusiveScan(int v) {
  const int lane = threadIdx.x & 31;
  for (int o = 1; o < 32; o <<= 1) {
    const int u = __shfl_up_sync(0xffffffffu, v, o);
    if (lane >= o) v += u;
  }
  return v;
}

// One block of kScanThreads: counts [total = E·chunks] → their exclusive prefix sums in place, so
// counts[e·chunks + b] becomes the first row of chunk b's assignments to expert e (after every
// earlier expert and after e's earlier chunks); offsets[e] = the start of expert e, offsets[E] =
// nk. Thread t sums a contiguous slice of ⌈total/T⌉ entries, the block scans the slice sums
// (warp shuffles, then the warps' totals), and each thread rewrites its slice from its start.
// Integers bounded by nk < 2^31: exact. The serial slices cost ⌈total/1024⌉ dependent-free loads
// per thread and pass: 16 at gpu-moe's 64 × 256 (a few µs); past ~10^6 entries (per thread
// ~1000) a multi-block scan would pay off.
static __global__ void ScanChunkCountsKernel(int* counts, long total, int E, int chunks, long nk,
                                             int64_t* offsets) {
  __shared__ int warp_totals[32];
  const int t = threadIdx.x, T = blockDim.x, lane = t & 31, warp = t >> 5, warps = T >> 5;
  const long per = (total + T - 1) / T;
  const long a = t * per < total ? t * per : total, b = a + per < total ? a + per : total;
  int s = 0;
  for (long i = a; i < b; ++i) s += counts[i];
  const int inclusive = WarpInclusiveScan(s);
  if (lane == 31) warp_totals[warp] = inclusive;
  __syncthreads();
  if (warp == 0) {
    const int w = WarpInclusiveScan(lane < warps ? warp_totals[lane] : 0);
    __syncwarp();  // every lane has read its warp total before any is overwritten
    if (lane < warps) warp_totals[lane] = w;
  }
  __syncthreads();
  int run = inclusive - s + (warp > 0 ? warp_totals[warp - 1] : 0);
  for (long i = a; i < b; ++i) {
    const int v = counts[i];
    counts[i] = run;
    run += v;
  }
  __syncthreads();  // offsets read other threads' slices
  for (int e = t; e < E; e += T) offsets[e] = counts[static_cast<long>(e) * chunks];
  if (t == 0) offsets[E] = nk;
}

// One warp per chunk. The warp first loads its chunk's kPlanChunk expert ids into registers (all
// loads in flight at once) and the chunk's E first rows (from the scan) into shared memory; then
// 32 assignments at a time in (token, slot) order: the lanes holding the same expert find each
// other (__match_any_sync), each takes row next[e] + (its rank among them by lane), and their
// lowest lane advances next[e] by the group's size. A lane past nk holds -1 - lane, a value no
// other lane holds, so it matches only itself and places nothing.
static __global__ void ChunkScatterKernel(const int* topk, long nk, int k, int E, int chunks,
                                          const int* starts, int* row_token, int* slot_row) {
  MOELAB_DYNAMIC_SMEM(int, next);  // [E] the row the chunk's next assignment to expert e takes
  const int lane = threadIdx.x;
  const long i0 = static_cast<long>(blockIdx.x) * kPlanChunk;
  int ids[kPerLane];
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) {
    const long i = i0 + j * 32 + lane;
    ids[j] = i < nk ? topk[i] : -1 - lane;
  }
  for (int e = lane; e < E; e += 32) next[e] = starts[static_cast<long>(e) * chunks + blockIdx.x];
  __syncwarp();
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) {
    const long i = i0 + j * 32 + lane;
    const int e = ids[j];
    const unsigned peers = __match_any_sync(0xffffffffu, e);
    const int leader = __ffs(peers) - 1;
    int first = 0;
    if (e >= 0 && lane == leader) {
      first = next[e];
      next[e] = first + __popc(peers);
    }
    first = __shfl_sync(0xffffffffu, first, leader);
    if (e >= 0) {
      const int r = first + __popc(peers & ((1u << lane) - 1u));
      row_token[r] = static_cast<int>(i / k);
      slot_row[i] = r;
    }
    __syncwarp();  // next[e] is read by the next group's leader, maybe another lane
  }
}

}  // namespace moelab::cuda::dispatch
