// Device code of the device-shaped grouped GEMM of the routed experts (grouped_gemm_device.h):
// the shape kernel that writes every expert's problem (shape and operand pointers) from the
// dispatch plan's offsets on the device, and the persistent sm_90 GEMM that walks the tiles of all
// experts. Internal header, included by grouped_gemm_device.cu and by
// tests/cuda_kernels/grouped_gemm_device_emulation_test.cc, which runs both kernels on the CPU
// under tests/cuda_kernels/emulation/cuda_emulation.h.
//
// The GEMM (one instantiation per expert product, kOp):
//   - 128×128 output tiles, K in steps of 32, 8 warps of 64×32 (2 × 4), each warp 4 × 4 mma.sync
//     m16n8k16 products per 16-deep step (kernels/cuda/mma.cuh's fragments), fp32 accumulators in
//     registers (64 a lane).
//   - operands through shared memory by cp.async in a 4-stage ring (3 k-steps in flight while one
//     is multiplied); a K-contiguous operand is staged as [128][32] rows padded to 40 elements,
//     an M- or N-contiguous one (the transposed operands of the input and weight gradients) as
//     [32][128] rows padded to 136: either way ldmatrix's eight 16-byte rows fall in distinct
//     banks. Fragments by ldmatrix.x4 (.trans for the transposed layouts), so no operand is ever
//     copied transposed in global memory.
//   - persistent: gridDim.x blocks (2 an SM) take tiles blockIdx.x, + gridDim.x, … of the
//     launch's tile list, which the shape kernel laid out expert by expert (tile_begin, a prefix
//     sum); a block finds its tile's expert by binary search. The tile count is read on the
//     device, so no row count ever reaches the host.
//   - the K loop of a tile runs in order from k = 0, each 16-deep step adding into the same
//     accumulators: a weight gradient (K = the expert's rows) is one sequential fp32 sum per
//     output whatever the grid, so its bits do not depend on the schedule.
//   - epilogues from registers: bf16 outputs (rounded once), SwiGLU on the gate and up products
//     (each warp holds matching columns of both: kGateUp's B tile is 64 rows of W1 then the same
//     64 rows of W3), SwiGLU's backward on dact (h1, h3 read beside it), fp32 weight gradients
//     written straight into the masters (overwritten; zero for an expert without rows).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/flash_forward_mma.cuh"  // CpAsync16, CpAsyncCommit/Wait, LdMatrixX4
#include "kernels/cuda/mma.cuh"
#include "kernels/cuda/swiglu_kernels.cuh"

namespace moelab::cuda::ggemm {

using flash::CpAsync16;
using flash::CpAsyncCommit;
using flash::CpAsyncWait;
using flash::LdMatrixX4;

constexpr int kTileM = 128, kTileN = 128, kTileK = 32, kStages = 4;
constexpr int kWarpsM = 2, kWarpsN = 4, kThreads = kWarpsM * kWarpsN * 32;
constexpr int kWarpTileM = kTileM / kWarpsM, kWarpTileN = kTileN / kWarpsN;  // 64 × 32
constexpr int kFragsM = kWarpTileM / 16, kFragsN = kWarpTileN / 8;           // 4 × 4
constexpr int kLdK = kTileK + 8;   // a [128][32] K-contiguous tile's padded row (80 bytes)
constexpr int kLdMN = kTileM + 8;  // a [32][128] M- or N-contiguous tile's padded row (272 bytes)
constexpr int kOperandElems = kTileM * kLdK > kTileK* kLdMN ? kTileM* kLdK : kTileK* kLdMN;
constexpr size_t kSmemBytes = size_t(kStages) * 2 * kOperandElems * sizeof(bf16);  // 80 KiB
constexpr int kShapeThreads = 256;
// The gate and up product's N tile: 64 columns of h1 and the same 64 of h3.
constexpr int kGateUpCols = kTileN / 2;

// The expert products. Operands per expert e (rows r0 … r1 of the dispatched layout, m = r1 − r0;
// dh is the [rows, 2H] scratch, dh1 in its first H columns, dh3 in the next H):
//   kGateUp   h1|h3 = xe·W1ᵀ|xe·W3ᵀ, act = silu(h1)·h3    M m,  N H, K d   (A rows, B rows)
//   kDown     ye = act·W2ᵀ                               M m,  N d, K H   (A rows, B rows)
//   kDact     dact = dye·W2; dh1, dh3 = SwiGLU'          M m,  N H, K d   (A rows, B transposed)
//   kDx       dxe = [dh1|dh3]·[W1;W3]                    M m,  N d, K 2H  (A rows, B transposed)
//   kWgrad13  [dW1;dW3] = [dh1|dh3]ᵀ·xe (fp32)           M 2H, N d, K m   (both transposed)
//   kWgrad2   dW2 = dyeᵀ·act (fp32)                      M d,  N H, K m   (both transposed)
enum class Op : int { kGateUp, kDown, kDact, kDx, kWgrad13, kWgrad2 };

constexpr bool ATransposed(Op op) { return op == Op::kWgrad13 || op == Op::kWgrad2; }
constexpr bool BTransposed(Op op) { return op != Op::kGateUp && op != Op::kDown; }
constexpr bool Fp32Out(Op op) { return ATransposed(op); }

// One expert's problem, written by ShapeKernel. A is m×k: K-contiguous rows of lda, or stored
// transposed (k rows of lda, M contiguous). B is k×n: stored as n rows of K (ldb), or as k rows of
// N; stored rows ≥ b_split come from b2 (row − b_split). kGateUp: B tile rows 0–63 from b (W1),
// 64–127 from b2 (W3), n = H. Outputs c (c2, c3) with ldc; kWgrad13: rows ≥ c_split to c2.
struct Problem {
  int m, n, k, tiles_m;
  const bf16* a;
  const bf16* b;
  const bf16* b2;
  void* c;
  void* c2;
  void* c3;
  const bf16* h1;  // kDact: the forward's h1, h3 (ldh)
  const bf16* h3;
  int64_t lda, ldb, ldc, ldh;
  int b_split, c_split;
};

// The layer's expert tensors (kernel parameter of ShapeKernel): bases of the dispatched rows'
// buffers (row r at base + r·width; dh relative to offsets[0], as MoeExpertsBackward's scratch),
// and the [E, ·, ·] weights and their fp32 gradients. Unused ones may be null.
struct ExpertTensors {
  const int64_t* offsets;  // device [E+1], the dispatch plan's
  int experts, d, hidden;
  const bf16 *xe, *w1, *w3, *w2, *dye;
  bf16 *h1, *h3, *act, *ye, *dh, *dxe;
  float *dw1, *dw3, *dw2;
};

__host__ __device__ inline int CeilDiv(int a, int b) { return (a + b - 1) / b; }

// Expert e's problem for kOp (pure index math: the shape kernel's body, and the emulation test's).
__host__ __device__ inline Problem ExpertProblem(Op op, const ExpertTensors& t, int e) {
  const int64_t r0 = t.offsets[e], rows = t.offsets[e + 1] - r0, o = r0 - t.offsets[0];
  const int d = t.d, H = t.hidden, m = static_cast<int>(rows);
  const int64_t w = static_cast<int64_t>(H) * d;
  Problem p{};
  p.b_split = 1 << 30;
  p.c_split = 1 << 30;
  switch (op) {
    case Op::kGateUp:
      p.m = m, p.n = H, p.k = d;
      p.a = t.xe + r0 * d, p.lda = d;
      p.b = t.w1 + e * w, p.b2 = t.w3 + e * w, p.ldb = d;
      p.c = t.h1 + r0 * H, p.c2 = t.h3 + r0 * H, p.c3 = t.act + r0 * H, p.ldc = H;
      break;
    case Op::kDown:
      p.m = m, p.n = d, p.k = H;
      p.a = t.act + r0 * H, p.lda = H;
      p.b = t.w2 + e * w, p.ldb = H;
      p.c = t.ye + r0 * d, p.ldc = d;
      break;
    case Op::kDact:
      p.m = m, p.n = H, p.k = d;
      p.a = t.dye + r0 * d, p.lda = d;
      p.b = t.w2 + e * w, p.ldb = H;
      p.h1 = t.h1 + r0 * H, p.h3 = t.h3 + r0 * H, p.ldh = H;
      p.c = t.dh + o * 2 * H, p.c2 = t.dh + o * 2 * H + H, p.ldc = 2 * H;
      break;
    case Op::kDx:
      p.m = m, p.n = d, p.k = 2 * H;
      p.a = t.dh + o * 2 * H, p.lda = 2 * H;
      p.b = t.w1 + e * w, p.b2 = t.w3 + e * w, p.ldb = d, p.b_split = H;
      p.c = t.dxe + r0 * d, p.ldc = d;
      break;
    case Op::kWgrad13:
      p.m = 2 * H, p.n = d, p.k = m;
      p.a = t.dh + o * 2 * H, p.lda = 2 * H;
      p.b = t.xe + r0 * d, p.ldb = d;
      p.c = t.dw1 + e * w, p.c2 = t.dw3 + e * w, p.ldc = d, p.c_split = H;
      break;
    case Op::kWgrad2:
      p.m = d, p.n = H, p.k = m;
      p.a = t.dye + r0 * d, p.lda = d;
      p.b = t.act + r0 * H, p.ldb = H;
      p.c = t.dw2 + e * w, p.ldc = H;
      break;
  }
  p.tiles_m = CeilDiv(p.m, kTileM);
  return p;
}

__host__ __device__ inline int TilesOf(Op op, const Problem& p) {
  return p.tiles_m * CeilDiv(p.n, op == Op::kGateUp ? kGateUpCols : kTileN);
}

// One block of kShapeThreads: problems[e] for every expert, then tile_begin[0 … E] (the prefix
// sum of their tile counts, in expert order; tile_begin[E] = the launch's tile count), summed by
// thread 0 (E is small; a fixed order).
__global__ void ShapeKernel(Op op, ExpertTensors t, Problem* problems, int* tile_begin) {
  for (int e = threadIdx.x; e < t.experts; e += blockDim.x) {
    problems[e] = ExpertProblem(op, t, e);
    tile_begin[e + 1] = TilesOf(op, problems[e]);
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    int sum = 0;
    tile_begin[0] = 0;
    for (int e = 0; e < t.experts; ++e) {
      sum += tile_begin[e + 1];
      tile_begin[e + 1] = sum;
    }
  }
}

// Tile `tile` of the launch: its expert (the last whose tile_begin ≤ tile: experts without tiles
// share their successor's begin) and its place in the expert's grid, M fastest (consecutive
// blocks share the B tile, the expert's weights, through L2).
struct TileCoord {
  int group, tm, tn;
};
__host__ __device__ inline TileCoord LocateTile(const int* tile_begin, int groups, int tiles_m,
                                                int tile) {
  int lo = 0, hi = groups - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (tile_begin[mid] <= tile) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  const int local = tile - tile_begin[lo];
  return {lo, local % tiles_m, local / tiles_m};
}
__device__ inline int GroupOf(const int* tile_begin, int groups, int tile) {
  return LocateTile(tile_begin, groups, 1, tile).group;
}

// Column (within the 128-wide tile) of the warp's n8 fragment j: kGateUp pairs fragment j of h1
// (columns 16·warp_n …) with fragment j + 2 of h3 (64 + 16·warp_n …).
template <Op kOp>
__host__ __device__ inline int FragCol(int warp_n, int j) {
  if constexpr (kOp == Op::kGateUp) {
    return (j < 2 ? 0 : kGateUpCols) + warp_n * 16 + (j % 2) * 8;
  } else {
    return warp_n * kWarpTileN + j * 8;
  }
}

// Issues one stage's cp.async copies: the A and B tiles of k-step kt (rows past the problem, and
// K past its end, zero-filled from the operand's first, mapped, row).
template <Op kOp>
__device__ __forceinline__ void LoadStage(const Problem& p, int tm, int tn, int kt, bf16* sa,
                                          bf16* sb) {
  const int k0 = kt * kTileK;
  // 512 chunks of 8 elements an operand, 2 a thread.
#pragma unroll
  for (int idx = threadIdx.x; idx < kTileM * kTileK / 8; idx += kThreads) {
    if constexpr (!ATransposed(kOp)) {
      const int r = idx / (kTileK / 8), c = (idx % (kTileK / 8)) * 8;
      const int gr = tm * kTileM + r;
      const bool ok = gr < p.m && k0 + c < p.k;
      CpAsync16(sa + r * kLdK + c, ok ? p.a + gr * p.lda + k0 + c : p.a, ok);
    } else {
      const int r = idx / (kTileM / 8), c = (idx % (kTileM / 8)) * 8;
      const int gc = tm * kTileM + c;
      const bool ok = k0 + r < p.k && gc < p.m;
      CpAsync16(sa + r * kLdMN + c, ok ? p.a + (k0 + r) * p.lda + gc : p.a, ok);
    }
    if constexpr (!BTransposed(kOp)) {
      const int r = idx / (kTileK / 8), c = (idx % (kTileK / 8)) * 8;
      int gr;
      const bf16* base = p.b;
      if constexpr (kOp == Op::kGateUp) {
        gr = tn * kGateUpCols + r % kGateUpCols;
        if (r >= kGateUpCols) base = p.b2;
      } else {
        gr = tn * kTileN + r;
      }
      const bool ok = gr < p.n && k0 + c < p.k;
      CpAsync16(sb + r * kLdK + c, ok ? base + gr * p.ldb + k0 + c : p.b, ok);
    } else {
      const int r = idx / (kTileN / 8), c = (idx % (kTileN / 8)) * 8;
      const int gk = k0 + r, gc = tn * kTileN + c;
      const bool ok = gk < p.k && gc < p.n;
      const bf16* src = gk < p.b_split ? p.b + gk * p.ldb : p.b2 + (gk - p.b_split) * p.ldb;
      CpAsync16(sb + r * kLdMN + c, ok ? src + gc : p.b, ok);
    }
  }
}

// The warp's products of one staged k-step: 2 steps of 16, each 4 A fragments (ldmatrix.x4) and
// 4 B fragments (2 ldmatrix.x4), 16 mma.sync. Lane addresses: docs in the file comment.
template <Op kOp>
__device__ __forceinline__ void MultiplyStage(const bf16* sa, const bf16* sb, int warp_m,
                                              int warp_n, float acc[kFragsM][kFragsN][4]) {
  const int lane = threadIdx.x & 31, l8 = lane % 8, half = (lane / 8) % 2, quad = lane / 16;
#pragma unroll
  for (int kk = 0; kk < kTileK; kk += 16) {
    uint32_t a[kFragsM][4], b[kFragsN][2];
#pragma unroll
    for (int i = 0; i < kFragsM; ++i) {
      const int m0 = warp_m * kWarpTileM + i * 16;
      if constexpr (!ATransposed(kOp)) {
        LdMatrixX4<false>(a[i], sa + (m0 + l8 + half * 8) * kLdK + kk + quad * 8);
      } else {
        LdMatrixX4<true>(a[i], sa + (kk + l8 + quad * 8) * kLdMN + m0 + half * 8);
      }
    }
#pragma unroll
    for (int j = 0; j < kFragsN; j += 2) {
      const int n0 = FragCol<kOp>(warp_n, j);  // fragments j and j + 1 are 8 columns apart
      uint32_t r[4];
      if constexpr (!BTransposed(kOp)) {
        LdMatrixX4<false>(r, sb + (n0 + l8 + quad * 8) * kLdK + kk + half * 8);
      } else {
        LdMatrixX4<true>(r, sb + (kk + l8 + half * 8) * kLdMN + n0 + quad * 8);
      }
      b[j][0] = r[0], b[j][1] = r[1], b[j + 1][0] = r[2], b[j + 1][1] = r[3];
    }
#pragma unroll
    for (int i = 0; i < kFragsM; ++i)
      for (int j = 0; j < kFragsN; ++j) mma::MmaBf16(acc[i][j], a[i], b[j]);
  }
}

__device__ __forceinline__ void StorePair(bf16* p, float lo, float hi) {
  *reinterpret_cast<__nv_bfloat162*>(p) = __floats2bfloat162_rn(lo, hi);
}
__device__ __forceinline__ void StorePair(bf16* p, bf16 lo, bf16 hi) {
  __nv_bfloat162 v;
  v.x = lo, v.y = hi;
  *reinterpret_cast<__nv_bfloat162*>(p) = v;
}

// Writes the warp's accumulators: rows g and g + 8 of each m16 fragment, columns 2t, 2t + 1 of
// each n8 one (mma.cuh's C layout). n and every width are multiples of 8, so a pair is in or out
// as a whole.
template <Op kOp>
__device__ __forceinline__ void Epilogue(const Problem& p, int tm, int tn, int warp_m, int warp_n,
                                         float acc[kFragsM][kFragsN][4]) {
  const int lane = threadIdx.x & 31, g = lane / 4, t = lane % 4;
#pragma unroll
  for (int i = 0; i < kFragsM; ++i) {
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
      const int row = tm * kTileM + warp_m * kWarpTileM + i * 16 + g + 8 * hr;
      if (row >= p.m) continue;
      if constexpr (kOp == Op::kGateUp) {
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          const int col = tn * kGateUpCols + warp_n * 16 + j * 8 + 2 * t;
          if (col >= p.n) continue;
          bf16 h1[2], h3[2], act[2];
#pragma unroll
          for (int q = 0; q < 2; ++q) {
            h1[q] = __float2bfloat16(acc[i][j][2 * hr + q]);
            h3[q] = __float2bfloat16(acc[i][j + 2][2 * hr + q]);
            swiglu::ActAt(h1, h3, act, q, q);  // SwiGLU from the rounded values, as ActKernel
          }
          const int64_t at = row * p.ldc + col;
          StorePair(static_cast<bf16*>(p.c) + at, h1[0], h1[1]);
          StorePair(static_cast<bf16*>(p.c2) + at, h3[0], h3[1]);
          StorePair(static_cast<bf16*>(p.c3) + at, act[0], act[1]);
        }
      } else {
#pragma unroll
        for (int j = 0; j < kFragsN; ++j) {
          const int col = tn * kTileN + FragCol<kOp>(warp_n, j) + 2 * t;
          if (col >= p.n) continue;
          const float lo = acc[i][j][2 * hr], hi = acc[i][j][2 * hr + 1];
          if constexpr (kOp == Op::kDown || kOp == Op::kDx) {
            StorePair(static_cast<bf16*>(p.c) + row * p.ldc + col, lo, hi);
          } else if constexpr (kOp == Op::kDact) {
            // dact rounded to bf16 first, then SwiGLU's backward from the stored h1, h3, as
            // ActBackwardKernel on the grouped path's bf16 dact.
            const bf16 dact[2] = {__float2bfloat16(lo), __float2bfloat16(hi)};
            const int64_t h = row * p.ldh + col;
            bf16 dh1[2], dh3[2];
#pragma unroll
            for (int q = 0; q < 2; ++q)
              swiglu::ActBackwardAt(p.h1 + h, p.h3 + h, dact, dh1, dh3, q, q);
            const int64_t at = row * p.ldc + col;
            StorePair(static_cast<bf16*>(p.c) + at, dh1[0], dh1[1]);
            StorePair(static_cast<bf16*>(p.c2) + at, dh3[0], dh3[1]);
          } else {  // the fp32 weight gradients, overwritten
            float* out = row < p.c_split ? static_cast<float*>(p.c) + row * p.ldc
                                         : static_cast<float*>(p.c2) + (row - p.c_split) * p.ldc;
            *reinterpret_cast<float2*>(out + col) = make_float2(lo, hi);
          }
        }
      }
    }
  }
}

// The persistent grouped GEMM: kSmemBytes of dynamic shared memory, kThreads threads.
template <Op kOp>
__global__ void __launch_bounds__(kThreads, 2)
    GroupedGemmKernel(const Problem* problems, const int* tile_begin, int groups) {
  MOELAB_FLASH_SMEM(smem_raw);
  bf16* smem = reinterpret_cast<bf16*>(smem_raw);
  const int warp = threadIdx.x / 32, warp_m = warp / kWarpsN, warp_n = warp % kWarpsN;
  const int total = tile_begin[groups];
  for (int tile = blockIdx.x; tile < total; tile += gridDim.x) {
    const int group = GroupOf(tile_begin, groups, tile);
    const Problem p = problems[group];
    const TileCoord tc = LocateTile(tile_begin + group, 1, p.tiles_m, tile);
    float acc[kFragsM][kFragsN][4];
#pragma unroll
    for (int i = 0; i < kFragsM; ++i)
      for (int j = 0; j < kFragsN; ++j)
        for (int q = 0; q < 4; ++q) acc[i][j][q] = 0.0f;
    const int ktiles = CeilDiv(p.k, kTileK);
    auto stage_a = [&](int s) { return smem + s * 2 * kOperandElems; };
    for (int s = 0; s < kStages - 1; ++s) {
      if (s < ktiles) LoadStage<kOp>(p, tc.tm, tc.tn, s, stage_a(s), stage_a(s) + kOperandElems);
      CpAsyncCommit();
    }
    for (int kt = 0; kt < ktiles; ++kt) {
      CpAsyncWait<kStages - 2>();  // k-step kt has landed (this thread's copies)
      __syncthreads();             // everyone's; and k-step kt − 1's stage is free again
      const int next = kt + kStages - 1;
      if (next < ktiles) {
        bf16* s = stage_a(next % kStages);
        LoadStage<kOp>(p, tc.tm, tc.tn, next, s, s + kOperandElems);
      }
      CpAsyncCommit();
      const bf16* s = stage_a(kt % kStages);
      MultiplyStage<kOp>(s, s + kOperandElems, warp_m, warp_n, acc);
    }
    CpAsyncWait<0>();
    Epilogue<kOp>(p, tc.tm, tc.tn, warp_m, warp_n, acc);
    __syncthreads();  // every warp is done with the stages before the next tile's loads
  }
}

}  // namespace moelab::cuda::ggemm
