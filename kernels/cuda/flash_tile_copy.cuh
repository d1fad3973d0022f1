// The mma attention kernels' shared-memory traffic (flash_forward_mma.cuh, flash_backward_mma.cuh):
// ldmatrix.x4 (plain and .trans) for B and A fragments, cp.async copies of bf16 tiles into
// shared memory (the double buffering of K/V and Q/dO tiles), and the tile loaders built on them.
// Each primitive has a CPU emulation (tests/cuda_kernels/emulation/cuda_emulation.h) that forms
// the same registers from the same per-lane addresses, so the emulation tests check the kernels'
// address arithmetic and the order of their copies, waits and barriers.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>
#ifdef MOELAB_CUDA_EMULATION
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
#endif

#include "kernels/cuda/flash_attention_kernels.cuh"
#include "kernels/cuda/flash_rope.cuh"
#include "kernels/cuda/mma.cuh"

namespace moelab::cuda::flash {

// ldmatrix.x4 (b16): lanes 8m..8m+7 give the 16-byte rows of 8×8 matrix m (m = 0..3, row
// addresses 16-byte aligned, in shared memory); lane l receives in r[m] the pair
// (row l/4, columns 2(l%4), 2(l%4)+1) of matrix m, or with kTrans the pair (rows 2(l%4),
// 2(l%4)+1, column l/4), the lower index in the low half either way. The emulation forms the
// same registers from the same per-lane addresses, so it checks the kernel's address arithmetic.
template <bool kTrans>
__device__ __forceinline__ void LdMatrixX4(uint32_t r[4], const bf16* row) {
#ifndef MOELAB_CUDA_EMULATION
  const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(row));
  if constexpr (kTrans) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
  } else {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
  }
#else
  const int lane = threadIdx.x & 31, g = lane / 4, t = lane % 4;
  if (reinterpret_cast<uintptr_t>(row) % 16 != 0) {
    std::fprintf(stderr, "ldmatrix: row address %p is not 16-byte aligned\n",
                 static_cast<const void*>(row));
    std::abort();
  }
  const bf16** rows = reinterpret_cast<const bf16**>(emu::MmaExchange());  // 32 pointers fit
  rows[lane] = row;
  __syncwarp();
  for (int m = 0; m < 4; ++m) {
    if constexpr (kTrans) {
      r[m] = mma::PackBf16x2(rows[8 * m + 2 * t][g], rows[8 * m + 2 * t + 1][g]);
    } else {
      r[m] = mma::PackBf16x2(rows[8 * m + g][2 * t], rows[8 * m + g][2 * t + 1]);
    }
  }
  __syncwarp();  // every lane has read before the exchange buffer is reused
#endif
}

// 16 bytes global → shared without passing through registers (cp.async.cg: cached in L2 only,
// the tiles are read once per block); zero-filled when !valid (src is then not read, but must
// still be a mapped address). Copies land once a later CpAsyncWait<n> leaves at most n of the
// thread's committed groups in flight, and are visible to the other threads after a barrier.
// The emulation queues each thread's copies by group and performs them at the wait, so a read
// before the right wait sees the garbage (NaN) shared memory the emulation starts a block with.
#ifdef MOELAB_CUDA_EMULATION
struct CpAsyncCopy {
  void* dst;
  const void* src;
  bool valid;
};
inline thread_local std::vector<CpAsyncCopy> cp_async_open;
inline thread_local std::vector<std::vector<CpAsyncCopy>> cp_async_groups;
#endif
__device__ __forceinline__ void CpAsync16(void* dst, const void* src, bool valid) {
#ifndef MOELAB_CUDA_EMULATION
  const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src),
               "r"(valid ? 16 : 0));
#else
  cp_async_open.push_back({dst, src, valid});
#endif
}
__device__ __forceinline__ void CpAsyncCommit() {
#ifndef MOELAB_CUDA_EMULATION
  asm volatile("cp.async.commit_group;\n" ::);
#else
  cp_async_groups.push_back(std::move(cp_async_open));
  cp_async_open.clear();
#endif
}
template <int kInFlight>
__device__ __forceinline__ void CpAsyncWait() {
#ifndef MOELAB_CUDA_EMULATION
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kInFlight));
#else
  while (cp_async_groups.size() > size_t(kInFlight)) {
    for (const CpAsyncCopy& c : cp_async_groups.front()) {
      if (c.valid) {
        std::memcpy(c.dst, c.src, 16);
      } else {
        std::memset(c.dst, 0, 16);
      }
    }
    cp_async_groups.erase(cp_async_groups.begin());
  }
#endif
}

// The device check of the two helpers above (mma_check.cu on the GPU, mma_emulation_test.cc on
// the CPU; the expected registers come from the PTX ISA's description, mma_reference.h): one
// warp copies the 32 rows of 8 bf16 of src (global) into stage (shared, rows 32 bytes apart) by
// cp.async, rows ≥ valid zero-filled (src-size 0), and lane l hands row l (matrix l / 8, row
// l % 8) to ldmatrix.x4 and to ldmatrix.x4.trans: out[8l + m] = its plain register m,
// out[8l + 4 + m] = its transposed one.
__device__ __forceinline__ void LdMatrixProbe(const bf16* src, int valid, bf16* stage,
                                              uint32_t* out) {
  constexpr int kLd = 16;  // elements a staged row: 16-byte aligned and padded, as Ld16's are
  const int lane = threadIdx.x & 31;
  CpAsync16(stage + lane * kLd, src + (lane < valid ? lane : 0) * 8, lane < valid);
  CpAsyncCommit();
  CpAsyncWait<0>();
  __syncwarp();  // every lane's copy landed before any lane's ldmatrix reads it
  uint32_t r[4], rt[4];
  LdMatrixX4<false>(r, stage + lane * kLd);
  LdMatrixX4<true>(rt, stage + lane * kLd);
  for (int m = 0; m < 4; ++m) out[8 * lane + m] = r[m], out[8 * lane + 4 + m] = rt[m];
}

// LoadTile (rows ≥ valid zero) issued as cp.async for bf16 sources; fp32 sources are rounded to
// bf16 through registers (LoadTile itself: synchronous, so they gain no overlap).
template <int D, typename T>
__device__ void LoadTileAsync(bf16* dst, const T* src, long ld, int valid) {
  if constexpr (std::is_same_v<T, bf16>) {
    constexpr int kPerRow = D / 8;
    for (int idx = threadIdx.x; idx < kTile * kPerRow; idx += kThreads) {
      const int r = idx / kPerRow, c = (idx % kPerRow) * 8;
      if (valid > 0) {  // rows past the end zero-filled from row 0's (mapped) address
        CpAsync16(dst + r * Ld16(D) + c, src + (r < valid ? r : 0) * ld + c, r < valid);
      } else {  // the whole tile past the end (the second half of a last 128-query tile)
        *reinterpret_cast<uint4*>(dst + r * Ld16(D) + c) = make_uint4(0, 0, 0, 0);
      }
    }
  } else {
    LoadTile<D>(dst, src, ld, valid);
  }
}

// A q or k tile: LoadTileAsync, or with kRope (fp32 sources) rotated at positions pos0 + row as
// it is loaded (flash_rope.cuh; synchronous, like every fp32 load).
template <int D, bool kRope, typename T>
__device__ __forceinline__ void LoadQkTile(bf16* dst, const T* src, long ld, int valid,
                                           const RopeArgs& rope, int pos0) {
  if constexpr (kRope) {
    static_assert(std::is_same_v<T, float>, "RoPE is fused for fp32 q and k only");
    LoadTileRotated<D>(dst, src, ld, valid, rope, pos0);
  } else {
    LoadTileAsync<D>(dst, src, ld, valid);
  }
}

}  // namespace moelab::cuda::flash
