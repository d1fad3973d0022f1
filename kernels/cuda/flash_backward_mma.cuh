// The fused attention's backward (kernels/cuda/flash_attention.h) on `mma.sync` fragments kept in
// registers (kernels/cuda/mma.cuh): the same deterministic split as the wmma kernels of
// flash_attention_kernels.cuh (D = rowsum(dO ∘ O) by RowDotKernel, then a dK/dV kernel per key
// tile and a dQ kernel per query tile, no float atomics), with every elementwise step (mask,
// soft-cap, P, dS) done on the accumulators in registers instead of through shared memory.
// Internal header, included by flash_attention.cu and by
// tests/cuda_kernels/flash_backward_mma_emulation_test.cc (the same source on the CPU emulation).
//
// Shape of the work: each warp owns 16 rows (keys in the dK/dV kernel; queries in the dQ kernel,
// 32 there for head dims up to 64/64) and walks the other side 16 at a time: a 16 × 16 block of S
// and of dP (two m16n8 tiles each, summed over the head dim), P and dS formed where they lie,
// then packed pairwise to bf16 they ARE the A fragment of the next product (dV += Pᵀ·dO,
// dK += dSᵀ·Q, dQ += dS·K), whose k dimension is those 16. The accumulators (dK and dV, or dQ)
// stay in registers throughout, and so do the warp's own rows of K and V (or Q and dO) as A
// fragments where registers allow. Every B fragment comes from shared memory (32-bit loads,
// conflict-free) and feeds one product per 16 rows the warp owns: at 16 rows that traffic, not
// the tensor cores, is the likely limit, hence the dQ kernel's 32 where registers allow (the
// dK/dV kernel's two accumulator sets leave no room for it).
//
// The B fragment of m16n8k16 wants pairs along k in one 32-bit word. For X·Yᵀ (S = Q·Kᵀ,
// dP = dO·Vᵀ) those are consecutive elements of a row of Y: the tiles as loaded. For X·Y
// (·dO, ·Q, ·K along their rows) they are two rows apart: the first kernels ("mma64") also store
// those tiles transposed ([D][64 + 8]) as they load them through registers (one 32-bit store per
// two rows, conflict-free); the tuned ones (kTuned, "mma") read them from the row-major tiles by
// ldmatrix.x4.trans, so every tile is a plain copy that cp.async double-buffers: the next K/V
// (dQ) or Q/dO (dK/dV) tile loads while this one is used, one barrier a tile.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kernels/cuda/flash_attention_kernels.cuh"
#include "kernels/cuda/flash_rope.cuh"
#include "kernels/cuda/flash_tile_copy.cuh"
#include "kernels/cuda/mma.cuh"

namespace moelab::cuda::flash {

constexpr int kLdT = kTile + 8;  // transposed bf16 tiles [D][kLdT]: 36 words a row, conflict-free

// Keep the warp's own rows of the fixed operands (K and V, or Q and dO) as A fragments in
// registers when they fit beside the accumulators: (DQK + DV) / 4 registers. The largest shape
// (192/128) re-reads them from shared memory instead (kept, the dK/dV kernel spills 148 bytes at
// 255 registers and the dQ kernel needs 253).
template <int DQK, int DV>
constexpr bool kKeepRowsInRegisters = DQK + DV <= 256;

// Which (qk_dim, v_dim) these kernels cover; the dispatch falls back to the wmma kernels for the
// rest. All seven instantiated shapes fit: nvcc 13.0 -Xptxas -v, sm_90, registers dK/dV | dQ:
// 16/16 72 | 117, 32/32 96 | 151, 64/64 162 | 218, 128/128 254 | 202, 48/32 116 | 168,
// 96/64 168 | 162, 192/128 241 | 168; spills only 12 bytes in 96/64's dK/dV and 48/32's dQ;
// fp32 inputs alike; sm_80 within a few registers (16/16's dK/dV: 4 bytes spilled). With RoPE
// fused (kRope, fp32, qk_dim = v_dim): 16/16 116 | 128, 32/32 126 | 164, 64/64 168 | 227,
// 128/128 255 (4 bytes spilled) | 220. The tuned kernels (kTuned; 2026-12-05, sm_90, bf16):
// 16/16 72 | 127, 32/32 96 (4 bytes spilled) | 162, 64/64 168 | 230, 128/128 255 | 210,
// 48/32 128 | 190, 96/64 210 | 164, 192/128 248 | 168; fp32 alike; RoPE 64/64 160 | 224.
template <int DQK, int DV>
constexpr bool MmaBackwardCovers() {
  return DQK % 16 == 0 && DV % 16 == 0 && DQK <= 192 && DV <= 128;
}

namespace mmabwd {

__device__ __forceinline__ uint32_t Ld32(const bf16* p) {
#ifdef MOELAB_CUDA_EMULATION
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
#else
  return *reinterpret_cast<const uint32_t*>(p);
#endif
}
__device__ __forceinline__ void St32(bf16* p, uint32_t v) {
#ifdef MOELAB_CUDA_EMULATION
  std::memcpy(static_cast<void*>(p), &v, 4);  // void*: bf16 is a class to GCC
#else
  *reinterpret_cast<uint32_t*>(p) = v;
#endif
}

// A fragment (mma.cuh's layout) of rows [0, 16) × columns [kk, kk + 16) of a row-major tile.
__device__ __forceinline__ void LoadA(uint32_t a[4], const bf16* tile, int ld, int kk) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const bf16* x = tile + g * ld + kk + 2 * t;
  a[0] = Ld32(x);
  a[1] = Ld32(x + 8 * ld);
  a[2] = Ld32(x + 8);
  a[3] = Ld32(x + 8 * ld + 8);
}

// B fragment of B[k][n] = Y[n0 + n][kk + k] (B = Yᵀ) for a row-major tile Y: each register is
// a pair of consecutive elements of one row of Y.
__device__ __forceinline__ void LoadBt(uint32_t b[2], const bf16* y, int ld, int n0, int kk) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const bf16* x = y + (n0 + g) * ld + kk + 2 * t;
  b[0] = Ld32(x);
  b[1] = Ld32(x + 8);
}

// The B fragments of B[k][n] = Y[k0 + k][n0 + n] (B = Y, k over 16 rows, n over two n-tiles
// n0.., n0 + 8..) of a row-major tile Y (stride ld) by one ldmatrix.x4.trans: b[0..1] n-tile n0,
// b[2..3] n-tile n0 + 8; matrices (rows 0–7 | 8–15) × (columns n0.. | n0 + 8..). What the tuned
// kernels read instead of a transposed copy of the tile (LoadBt on dst_t below).
__device__ __forceinline__ void LoadBPairTrans(uint32_t b[4], const bf16* y, int ld, int k0,
                                               int n0) {
  const int lane = threadIdx.x & 31, mrow = lane & 7, mat = lane >> 3;
  LdMatrixX4<true>(b, y + (k0 + (mat & 1) * 8 + mrow) * ld + n0 + (mat >> 1) * 8);
}

// Columns c..c+7 of rows r (x0) and r + 1 (x1), 8 bf16 each, into the row-major tile dst
// (stride Ld16(D)) and its transpose dst_t ([D][kLdT]: one 32-bit word per two rows).
template <int D>
__device__ __forceinline__ void StoreRowPair(bf16* dst, bf16* dst_t, int r, int c, uint4 x0,
                                             uint4 x1) {
  *reinterpret_cast<uint4*>(dst + r * Ld16(D) + c) = x0;
  *reinterpret_cast<uint4*>(dst + (r + 1) * Ld16(D) + c) = x1;
  const uint32_t w0[4] = {x0.x, x0.y, x0.z, x0.w}, w1[4] = {x1.x, x1.y, x1.z, x1.w};
#pragma unroll
  for (int e = 0; e < 4; ++e) {  // word e holds columns c + 2e (low half) and c + 2e + 1
    St32(dst_t + (c + 2 * e) * kLdT + r, (w0[e] & 0xffffu) | (w1[e] << 16));
    St32(dst_t + (c + 2 * e + 1) * kLdT + r, (w0[e] >> 16) | (w1[e] & 0xffff0000u));
  }
}

// Rows [0, kTile) × columns [0, D) of src (row stride ld; rows ≥ valid zero) into the row-major
// tile dst (stride Ld16(D)) and its transpose dst_t ([D][kLdT]). Thread → (row pair, 8-column
// chunk) with the row pair fastest: a warp writes 32 consecutive words of each transposed row.
template <int D, typename T>
__device__ void LoadTileBoth(bf16* dst, bf16* dst_t, const T* src, long ld, int valid) {
  constexpr int kPerRow = D / 8;
  for (int idx = threadIdx.x; idx < (kTile / 2) * kPerRow; idx += kThreads) {
    const int r = 2 * (idx % (kTile / 2)), c = (idx / (kTile / 2)) * 8;
    const uint4 zero = make_uint4(0, 0, 0, 0);
    const uint4 x0 = r < valid ? Load8(src + r * ld + c) : zero;
    const uint4 x1 = r + 1 < valid ? Load8(src + (r + 1) * ld + c) : zero;
    StoreRowPair<D>(dst, dst_t, r, c, x0, x1);
  }
}

// LoadTileBoth of an fp32 q or k tile with row r rotated at position pos0 + r (flash_rope.cuh):
// a thread takes the chunk pair (c, c + D/2) of its two rows, so reads every value once.
template <int D>
__device__ void LoadTileBothRotated(bf16* dst, bf16* dst_t, const float* src, long ld, int valid,
                                    const RopeArgs& rope, int pos0) {
  for (int idx = threadIdx.x; idx < (kTile / 2) * (D / 16); idx += kThreads) {
    const int r = 2 * (idx % (kTile / 2)), c = (idx / (kTile / 2)) * 8;
    uint4 x[2][2];
    LoadRowPairRotated<D>(src, ld, valid, rope, pos0, r, c, x);
    StoreRowPair<D>(dst, dst_t, r, c, x[0][0], x[1][0]);
    StoreRowPair<D>(dst, dst_t, r, c + D / 2, x[0][1], x[1][1]);
  }
}

// The q and k tile loads of the kernels below: plain, or with kRope (fp32 q and k) rotated at
// positions pos0 + row.
template <int D, bool kRope, typename T>
__device__ __forceinline__ void LoadQkRows(bf16* dst, const T* src, long ld, int valid,
                                           const RopeArgs& rope, int pos0) {
  if constexpr (kRope) {
    static_assert(std::is_same_v<T, float>, "RoPE is fused for fp32 q and k only");
    LoadTileRotated<D>(dst, src, ld, valid, rope, pos0);
  } else {
    LoadTile<D>(dst, src, ld, valid);
  }
}
template <int D, bool kRope, typename T>
__device__ __forceinline__ void LoadQkBoth(bf16* dst, bf16* dst_t, const T* src, long ld, int valid,
                                           const RopeArgs& rope, int pos0) {
  if constexpr (kRope) {
    static_assert(std::is_same_v<T, float>, "RoPE is fused for fp32 q and k only");
    LoadTileBothRotated<D>(dst, dst_t, src, ld, valid, rope, pos0);
  } else {
    LoadTileBoth<D>(dst, dst_t, src, ld, valid);
  }
}

// Row `row` (half `half` of the lane's C rows) of a gradient accumulator set acc over D columns
// written to global memory at dst + 2t: mul·acc, and with kRope through the inverse rotation at
// position pos (flash_rope.cuh) — the values the plain kernel writes, then RoPE⁻¹, bit for bit.
template <int D, bool kRope>
__device__ __forceinline__ void StoreGradRow(float* dst, const float (&acc)[D / 8][4], int half,
                                             float mul, const RopeArgs& rope, int pos, int t) {
  if constexpr (kRope) {
    StoreRowInverseRotated<D>(dst, acc, half, mul, rope, pos, t);
  } else {
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
      dst[8 * n + 2 * t] = mul * acc[n][2 * half];
      dst[8 * n + 2 * t + 1] = mul * acc[n][2 * half + 1];
    }
  }
}

// The warp's kM m-tiles of dQ (rows w0 + 16·mi + …, those below S) written to dqw through
// StoreGradRow: the dQ kernel's epilogue.
template <int D, int kM, bool kRope>
__device__ __forceinline__ void StoreDqTiles(float* dqw, long ldq, const float (&acc)[kM][D / 8][4],
                                             int w0, int S, float mul, const RopeArgs& rope, int gr,
                                             int t) {
#pragma unroll
  for (int mi = 0; mi < kM; ++mi) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int i = w0 + 16 * mi + gr + 8 * half;
      if (i >= S) continue;
      StoreGradRow<D, kRope>(dqw + i * ldq, acc[mi], half, mul, rope, i, t);
    }
  }
}

// P and dS of one C element: s the raw Q·K sum, dp the dO·V sum, (lse, dd) its query's.
// Returns P; *ds gets dS (0 for a masked pair). Branch-free in `valid` (selects, not a divergent
// branch) so that the warp reaches its next mma.sync converged without relying on the compiler;
// the soft-cap branch is uniform.
__device__ __forceinline__ float ProbGrad(const Params& p, bool valid, float s, float dp, float lse,
                                          float dd, float* ds) {
  s *= p.scale;
  float dcap = 1.0f;
  if (p.cap > 0) {
    const float t = tanhf(s / p.cap);
    s = p.cap * t;
    dcap = 1.0f - t * t;
  }
  const float pr = valid ? __expf(s - lse) : 0.0f;  // masked: exp may overflow, never used
  *ds = valid ? pr * (dp - dd) * dcap : 0.0f;
  return pr;
}

}  // namespace mmabwd

// Shared memory of the dK/dV kernel: K and V of the key tile, Q and dO of the query tile (each
// also transposed), and the query tile's lse and D. The tuned kernel's: BwdMmaKvSmemTuned.
template <int DQK, int DV>
struct BwdMmaKvSmem {
  static constexpr size_t kK = 0;
  static constexpr size_t kV = kK + size_t(kTile) * Ld16(DQK) * 2;
  static constexpr size_t kQ = kV + size_t(kTile) * Ld16(DV) * 2;
  static constexpr size_t kQt = kQ + size_t(kTile) * Ld16(DQK) * 2;
  static constexpr size_t kDo = kQt + size_t(DQK) * kLdT * 2;
  static constexpr size_t kDot = kDo + size_t(kTile) * Ld16(DV) * 2;
  static constexpr size_t kLse = kDot + size_t(DV) * kLdT * 2;
  static constexpr size_t kD = kLse + kTile * 4;
  static constexpr size_t kBytes = kD + kTile * 4;
  static_assert(kV % 16 == 0 && kQ % 16 == 0 && kQt % 16 == 0 && kDo % 16 == 0 && kDot % 16 == 0 &&
                kLse % 16 == 0);
  static_assert(kBytes <= BwdSmem<DQK, DV>::kBytes, "no more than the wmma kernel's");
};

// The tuned dK/dV kernel's: K and V of the key tile, then two buffers (double-buffered by
// cp.async: the next query tile loads while this one is used) of Q, dO, lse and D, no transposed
// copies (ldmatrix.trans reads the row-major tiles).
template <int DQK, int DV>
struct BwdMmaKvSmemTuned {
  static constexpr size_t kK = 0;
  static constexpr size_t kV = kK + size_t(kTile) * Ld16(DQK) * 2;
  static constexpr size_t kQ = kV + size_t(kTile) * Ld16(DV) * 2;  // buffer i at kQ + i·kBuf
  static constexpr size_t kDo = kQ + size_t(kTile) * Ld16(DQK) * 2;
  static constexpr size_t kLse = kDo + size_t(kTile) * Ld16(DV) * 2;
  static constexpr size_t kD = kLse + kTile * 4;
  static constexpr size_t kBuf = kD + kTile * 4 - kQ;
  static constexpr size_t kBytes = kQ + 2 * kBuf;
  static_assert(kV % 16 == 0 && kQ % 16 == 0 && kDo % 16 == 0 && kLse % 16 == 0 && kBuf % 16 == 0);
  static_assert(kBytes <= BwdSmem<DQK, DV>::kBytes, "no more than the wmma kernel's");
};
template <int DQK, int DV, bool kTuned>
constexpr size_t BwdMmaKvSmemBytes() {
  return kTuned ? BwdMmaKvSmemTuned<DQK, DV>::kBytes : BwdMmaKvSmem<DQK, DV>::kBytes;
}

// Rows (16-row m-tiles) each warp of the dQ kernel owns: two where the second set of
// accumulators and A fragments fits (every B fragment read from shared memory then feeds two
// products: half the shared-memory traffic per product), else one. The dQ kernel's query tile is
// kWarps · 16 · m rows.
template <int DQK, int DV>
constexpr int kDqMTiles = DQK + DV <= 128 ? 2 : 1;
template <int DQK, int DV>
constexpr int kDqQueryTile = kWarps * 16 * kDqMTiles<DQK, DV>;

// Shared memory of the dQ kernel: Q and dO of the query tile, K (also transposed) and V of the
// key tile. kTuned: no transposed K (ldmatrix.trans), and two buffers of K and V (double-buffered
// by cp.async), buffer i at kK + i·kBuf.
template <int DQK, int DV, bool kTuned = false>
struct BwdMmaQSmem {
  static constexpr int kRows = kDqQueryTile<DQK, DV>;
  static constexpr size_t kQ = 0;
  static constexpr size_t kDo = kQ + size_t(kRows) * Ld16(DQK) * 2;
  static constexpr size_t kK = kDo + size_t(kRows) * Ld16(DV) * 2;
  static constexpr size_t kKt = kK + size_t(kTile) * Ld16(DQK) * 2;
  static constexpr size_t kV = kKt + (kTuned ? 0 : size_t(DQK) * kLdT * 2);
  static constexpr size_t kBuf = kV + size_t(kTile) * Ld16(DV) * 2 - kK;
  static constexpr size_t kBytes = kK + (kTuned ? 2 : 1) * kBuf;
  static_assert(kDo % 16 == 0 && kK % 16 == 0 && kKt % 16 == 0 && kV % 16 == 0 && kBuf % 16 == 0);
  static_assert(kBytes <= BwdSmem<DQK, DV>::kBytes, "no more than the wmma kernel's");
};

// The tuned dK/dV kernel's loads of query tile (head h, rows q0..) into one of its buffers: Q
// (rotated with kRope) and dO by cp.async where they can be (bf16 without RoPE), lse and D
// (fp32 rows of any alignment) by plain loads; all visible after the next barrier.
template <int DQK, int DV, bool kRope, typename T>
__device__ __forceinline__ void LoadQueryTileTuned(unsigned char* buf, const Params& p, const T* q,
                                                   const T* dout, const float* lse,
                                                   const float* dvec, int b, int h, int q0,
                                                   const RopeArgs& rope) {
  using L = BwdMmaKvSmemTuned<DQK, DV>;
  const int S = p.seq;
  const long pair = long(b) * p.heads + h;
  LoadQkTile<DQK, kRope>(reinterpret_cast<bf16*>(buf),
                         q + (long(b) * S + q0) * p.ldq + long(h) * DQK, p.ldq, S - q0, rope, q0);
  LoadTileAsync<DV>(reinterpret_cast<bf16*>(buf + L::kDo - L::kQ),
                    dout + (long(b) * S + q0) * p.ldo + long(h) * DV, p.ldo, S - q0);
  LoadRowVec(reinterpret_cast<float*>(buf + L::kLse - L::kQ), lse + pair * S + q0, S - q0);
  LoadRowVec(reinterpret_cast<float*>(buf + L::kD - L::kQ), dvec + pair * S + q0, S - q0);
}

// dK, dV of one 64-key tile of one kv head: grid (B·kv_heads, key tiles). Warp w owns keys
// k0 + 16w .. + 15 (the M rows of every product); its accumulators sum over the group's query
// heads in head order, the query tiles from the diagonal on and the 16-query chunks in order.
// kRope: q and k arrive un-rotated and are rotated as they load, dk leaves through RoPE⁻¹
// (flash_rope.cuh). kTuned (attention_kernel "mma"): the query tiles double-buffered by
// cp.async (the next loads while this one is used: one barrier a tile instead of two, the loads'
// latency hidden), and the B fragments of ·dO and ·Q read by ldmatrix.trans from the row-major
// tiles instead of from transposed copies built through registers; the same products in the
// same order, so the same bits as the first kernel ("mma64").
template <typename T, int DQK, int DV, bool kRope = false, bool kTuned = false>
__global__ void __launch_bounds__(kThreads)
    FlashBackwardKvMmaKernel(Params p, const T* __restrict__ q, const T* __restrict__ k,
                             const T* __restrict__ v, const float* __restrict__ lse,
                             const float* __restrict__ dvec, const T* __restrict__ dout,
                             float* __restrict__ dk, float* __restrict__ dv, RopeArgs rope = {}) {
  using L = BwdMmaKvSmem<DQK, DV>;
  using LT = BwdMmaKvSmemTuned<DQK, DV>;
  using namespace mmabwd;  // NOLINT: the fragment helpers
  constexpr bool kKeep = kKeepRowsInRegisters<DQK, DV>;
  constexpr int kLdQ = Ld16(DQK), kLdV = Ld16(DV);
  MOELAB_FLASH_SMEM(smem);
  bf16* sk = reinterpret_cast<bf16*>(smem + (kTuned ? LT::kK : L::kK));
  bf16* sv = reinterpret_cast<bf16*>(smem + (kTuned ? LT::kV : L::kV));
  // The first kernel's single query-tile buffers (the tuned kernel's are chosen per tile below).
  bf16* sqt = reinterpret_cast<bf16*>(smem + L::kQt);
  bf16* sdot = reinterpret_cast<bf16*>(smem + L::kDot);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gr = lane >> 2, t = lane & 3;

  const int S = p.seq, group = p.heads / p.kv_heads;
  const int b = blockIdx.x / p.kv_heads, kvh = blockIdx.x % p.kv_heads;
  const int k0 = blockIdx.y * kTile;  // tile 0 has the most query tiles: scheduled first
  // The query tiles in order: head kvh·group + i / per_head, rows k0 + 64·(i % per_head)...
  const int per_head = (S - k0 + kTile - 1) / kTile, tiles = group * per_head;
  if constexpr (kTuned) {  // K, V and the first query tile in one group of copies
    LoadQkTile<DQK, kRope>(sk, k + (long(b) * S + k0) * p.ldk + long(kvh) * DQK, p.ldk, S - k0,
                           rope, k0);
    LoadTileAsync<DV>(sv, v + (long(b) * S + k0) * p.ldv + long(kvh) * DV, p.ldv, S - k0);
    LoadQueryTileTuned<DQK, DV, kRope>(smem + LT::kQ, p, q, dout, lse, dvec, b, kvh * group, k0,
                                       rope);
    CpAsyncCommit();
    CpAsyncWait<0>();
  } else {
    LoadQkRows<DQK, kRope>(sk, k + (long(b) * S + k0) * p.ldk + long(kvh) * DQK, p.ldk, S - k0,
                           rope, k0);
    LoadTile<DV>(sv, v + (long(b) * S + k0) * p.ldv + long(kvh) * DV, p.ldv, S - k0);
  }
  __syncthreads();

  const int w0 = k0 + warp * 16;  // the warp's first key
  const bool warp_active = w0 < S;
  const bf16* wk = sk + warp * 16 * kLdQ;
  const bf16* wv = sv + warp * 16 * kLdV;
  uint32_t ka[kKeep ? DQK / 16 : 1][4], va[kKeep ? DV / 16 : 1][4];
  if constexpr (kKeep) {
#pragma unroll
    for (int kk = 0; kk < DQK / 16; ++kk) LoadA(ka[kk], wk, kLdQ, 16 * kk);
#pragma unroll
    for (int kk = 0; kk < DV / 16; ++kk) LoadA(va[kk], wv, kLdV, 16 * kk);
  }
  float dk_acc[DQK / 8][4], dv_acc[DV / 8][4];
#pragma unroll
  for (int n = 0; n < DQK / 8; ++n) dk_acc[n][0] = dk_acc[n][1] = dk_acc[n][2] = dk_acc[n][3] = 0;
#pragma unroll
  for (int n = 0; n < DV / 8; ++n) dv_acc[n][0] = dv_acc[n][1] = dv_acc[n][2] = dv_acc[n][3] = 0;

  for (int i = 0, buf = 0; i < tiles; ++i, buf ^= 1) {
    const int h = kvh * group + i / per_head, q0 = k0 + (i % per_head) * kTile;
    unsigned char* tile_smem = smem + (kTuned ? LT::kQ + buf * LT::kBuf : L::kQ);
    bf16* sq = reinterpret_cast<bf16*>(tile_smem);
    bf16* sdo = reinterpret_cast<bf16*>(tile_smem + (kTuned ? LT::kDo - LT::kQ : L::kDo - L::kQ));
    float* slse =
        reinterpret_cast<float*>(tile_smem + (kTuned ? LT::kLse - LT::kQ : L::kLse - L::kQ));
    float* sd = reinterpret_cast<float*>(tile_smem + (kTuned ? LT::kD - LT::kQ : L::kD - L::kQ));
    if constexpr (kTuned) {
      CpAsyncWait<0>();  // this thread's copies of tile i (the only group in flight)
      // After it every copy of tile i has landed and every warp is done with tile i − 1, whose
      // buffer tile i + 1 then refills while tile i is used.
      __syncthreads();
      if (i + 1 < tiles) {
        const int hn = kvh * group + (i + 1) / per_head, qn = k0 + ((i + 1) % per_head) * kTile;
        LoadQueryTileTuned<DQK, DV, kRope>(smem + LT::kQ + (buf ^ 1) * LT::kBuf, p, q, dout, lse,
                                           dvec, b, hn, qn, rope);
        CpAsyncCommit();
      }
    } else {
      const long pair = long(b) * p.heads + h;
      __syncthreads();  // the previous query tile is no longer read
      LoadQkBoth<DQK, kRope>(sq, sqt, q + (long(b) * S + q0) * p.ldq + long(h) * DQK, p.ldq, S - q0,
                             rope, q0);
      LoadTileBoth<DV>(sdo, sdot, dout + (long(b) * S + q0) * p.ldo + long(h) * DV, p.ldo, S - q0);
      LoadRowVec(slse, lse + pair * S + q0, S - q0);
      LoadRowVec(sd, dvec + pair * S + q0, S - q0);
      __syncthreads();
    }
    if (!warp_active) continue;
    for (int qc = 0; qc < kTile; qc += 16) {
      const int qa = q0 + qc;  // the chunk's first query
      // Warp-uniform skips: past the sequence, or every query before every key of the warp.
      if (qa >= S || qa + 15 < w0) continue;
      // Sᵀ = K_w·Qᵀ and dPᵀ = V_w·dOᵀ over the chunk: rows the warp's keys, n-tile n the
      // queries qa + 8n ..
      float st[2][4] = {}, dpt[2][4] = {};
#pragma unroll
      for (int kk = 0; kk < DQK / 16; ++kk) {
        uint32_t a[4], bq[2];
        if constexpr (kKeep) {
          a[0] = ka[kk][0], a[1] = ka[kk][1], a[2] = ka[kk][2], a[3] = ka[kk][3];
        } else {
          LoadA(a, wk, kLdQ, 16 * kk);
        }
#pragma unroll
        for (int n = 0; n < 2; ++n) {
          LoadBt(bq, sq, kLdQ, qc + 8 * n, 16 * kk);
          mma::MmaBf16(st[n], a, bq);
        }
      }
#pragma unroll
      for (int kk = 0; kk < DV / 16; ++kk) {
        uint32_t a[4], bo[2];
        if constexpr (kKeep) {
          a[0] = va[kk][0], a[1] = va[kk][1], a[2] = va[kk][2], a[3] = va[kk][3];
        } else {
          LoadA(a, wv, kLdV, 16 * kk);
        }
#pragma unroll
        for (int n = 0; n < 2; ++n) {
          LoadBt(bo, sdo, kLdV, qc + 8 * n, 16 * kk);
          mma::MmaBf16(dpt[n], a, bo);
        }
      }
      // Pᵀ and dSᵀ where they lie: element e of n-tile n is key w0 + gr + 8·(e ≥ 2), query
      // qa + 8n + 2t + (e odd); packed pairwise they are the A fragments (k = the 16 queries).
      uint32_t pa[4], dsa[4];
#pragma unroll
      for (int n = 0; n < 2; ++n) {
        const int ql = qc + 8 * n + 2 * t;  // the lane's first query in the tile
        const float2 lse2 = *reinterpret_cast<const float2*>(slse + ql);
        const float2 d2 = *reinterpret_cast<const float2*>(sd + ql);
        float pr[4], ds[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int key = w0 + gr + (e >= 2 ? 8 : 0), qi = q0 + ql + (e & 1);
          pr[e] = ProbGrad(p, key <= qi && qi < S, st[n][e], dpt[n][e], e & 1 ? lse2.y : lse2.x,
                           e & 1 ? d2.y : d2.x, &ds[e]);
        }
        pa[2 * n] = mma::PackBf16x2(pr[0], pr[1]);
        pa[2 * n + 1] = mma::PackBf16x2(pr[2], pr[3]);
        dsa[2 * n] = mma::PackBf16x2(ds[0], ds[1]);
        dsa[2 * n + 1] = mma::PackBf16x2(ds[2], ds[3]);
      }
      // dV += Pᵀ·dO and dK += dSᵀ·Q: B[k = query][n = column], from the row-major tiles by
      // ldmatrix.trans (tuned) or from the transposed copies.
      if constexpr (kTuned) {
#pragma unroll
        for (int n = 0; n < DV / 8; n += 2) {
          uint32_t bo[4];
          LoadBPairTrans(bo, sdo, kLdV, qc, 8 * n);
          mma::MmaBf16(dv_acc[n], pa, bo);
          mma::MmaBf16(dv_acc[n + 1], pa, bo + 2);
        }
#pragma unroll
        for (int n = 0; n < DQK / 8; n += 2) {
          uint32_t bq[4];
          LoadBPairTrans(bq, sq, kLdQ, qc, 8 * n);
          mma::MmaBf16(dk_acc[n], dsa, bq);
          mma::MmaBf16(dk_acc[n + 1], dsa, bq + 2);
        }
      } else {
#pragma unroll
        for (int n = 0; n < DV / 8; ++n) {
          uint32_t bo[2];
          LoadBt(bo, sdot, kLdT, 8 * n, qc);
          mma::MmaBf16(dv_acc[n], pa, bo);
        }
#pragma unroll
        for (int n = 0; n < DQK / 8; ++n) {
          uint32_t bq[2];
          LoadBt(bq, sqt, kLdT, 8 * n, qc);
          mma::MmaBf16(dk_acc[n], dsa, bq);
        }
      }
    }
  }
  if (!warp_active) return;
  // C element e of n-tile n: key w0 + gr + 8·(e ≥ 2), column 8n + 2t + (e odd).
  float* dkw = dk + long(b) * S * p.ldk + long(kvh) * DQK;
  float* dvw = dv + long(b) * S * p.ldv + long(kvh) * DV;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int key = w0 + gr + 8 * half;
    if (key >= S) continue;
    StoreGradRow<DQK, kRope>(dkw + key * p.ldk, dk_acc, half, p.scale, rope, key, t);
#pragma unroll
    for (int n = 0; n < DV / 8; ++n) {
      dvw[key * p.ldv + 8 * n + 2 * t] = dv_acc[n][2 * half];
      dvw[key * p.ldv + 8 * n + 2 * t + 1] = dv_acc[n][2 * half + 1];
    }
  }
}

// dQ of one query tile (kDqQueryTile rows) of one head: grid (B·H, query tiles), heaviest
// first. Warp w owns queries q0 + 16·kM·w .. (kM m-tiles of 16); its accumulators sum over the
// key tiles up to the diagonal and the 16-key chunks in order. kRope: as the dK/dV kernel's.
// kTuned: the key tiles double-buffered by cp.async, and dQ's B fragments (·K) read by
// ldmatrix.trans from the row-major K tile instead of a transposed copy; same bits as the first.
template <typename T, int DQK, int DV, bool kRope = false, bool kTuned = false>
__global__ void __launch_bounds__(kThreads)
    FlashBackwardQMmaKernel(Params p, const T* __restrict__ q, const T* __restrict__ k,
                            const T* __restrict__ v, const float* __restrict__ lse,
                            const float* __restrict__ dvec, const T* __restrict__ dout,
                            float* __restrict__ dq, RopeArgs rope = {}) {
  using L = BwdMmaQSmem<DQK, DV, kTuned>;
  using namespace mmabwd;  // NOLINT: the fragment helpers
  constexpr bool kKeep = kKeepRowsInRegisters<DQK, DV>;
  constexpr int kM = kDqMTiles<DQK, DV>, kRows = kDqQueryTile<DQK, DV>;
  constexpr int kLdQ = Ld16(DQK), kLdV = Ld16(DV);
  MOELAB_FLASH_SMEM(smem);
  bf16* sq = reinterpret_cast<bf16*>(smem + L::kQ);
  bf16* sdo = reinterpret_cast<bf16*>(smem + L::kDo);
  bf16* skt = reinterpret_cast<bf16*>(smem + L::kKt);  // the first kernel's only
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gr = lane >> 2, t = lane & 3;

  const int S = p.seq, pair = blockIdx.x, b = pair / p.heads, h = pair % p.heads;
  const int kvh = h / (p.heads / p.kv_heads);
  const int q0 = (gridDim.y - 1 - blockIdx.y) * kRows;
  const T* K = k + long(b) * S * p.ldk + long(kvh) * DQK;
  const T* V = v + long(b) * S * p.ldv + long(kvh) * DV;
#pragma unroll
  for (int r0 = 0; r0 < kRows; r0 += kTile) {
    if constexpr (kTuned) {
      LoadQkTile<DQK, kRope>(sq + r0 * kLdQ, q + (long(b) * S + q0 + r0) * p.ldq + long(h) * DQK,
                             p.ldq, S - q0 - r0, rope, q0 + r0);
      LoadTileAsync<DV>(sdo + r0 * kLdV, dout + (long(b) * S + q0 + r0) * p.ldo + long(h) * DV,
                        p.ldo, S - q0 - r0);
    } else {
      LoadQkRows<DQK, kRope>(sq + r0 * kLdQ, q + (long(b) * S + q0 + r0) * p.ldq + long(h) * DQK,
                             p.ldq, S - q0 - r0, rope, q0 + r0);
      LoadTile<DV>(sdo + r0 * kLdV, dout + (long(b) * S + q0 + r0) * p.ldo + long(h) * DV, p.ldo,
                   S - q0 - r0);
    }
  }
  if constexpr (kTuned) {  // Q, dO and the first key tile in one group of copies
    LoadQkTile<DQK, kRope>(reinterpret_cast<bf16*>(smem + L::kK), K, p.ldk, S, rope, 0);
    LoadTileAsync<DV>(reinterpret_cast<bf16*>(smem + L::kV), V, p.ldv, S);
    CpAsyncCommit();
    CpAsyncWait<0>();
  }

  const int w0 = q0 + warp * 16 * kM;  // the warp's first query; m-tile mi: w0 + 16·mi ..
  const bool warp_active = w0 < S;
  // The lane's query rows (C elements 0, 1 of m-tile mi: w0 + 16·mi + gr; 2, 3: + 8), lse, D.
  float row_lse[kM][2], row_d[kM][2];
#pragma unroll
  for (int mi = 0; mi < kM; ++mi) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int i = w0 + 16 * mi + gr + 8 * half;
      row_lse[mi][half] = i < S ? lse[long(pair) * S + i] : 0.0f;
      row_d[mi][half] = i < S ? dvec[long(pair) * S + i] : 0.0f;
    }
  }
  __syncthreads();
  const bf16* wq = sq + (warp * 16 * kM) * kLdQ;
  const bf16* wdo = sdo + (warp * 16 * kM) * kLdV;
  uint32_t qa_frag[kM][kKeep ? DQK / 16 : 1][4], oa_frag[kM][kKeep ? DV / 16 : 1][4];
  if constexpr (kKeep) {
#pragma unroll
    for (int mi = 0; mi < kM; ++mi) {
#pragma unroll
      for (int kk = 0; kk < DQK / 16; ++kk)
        LoadA(qa_frag[mi][kk], wq + 16 * mi * kLdQ, kLdQ, 16 * kk);
#pragma unroll
      for (int kk = 0; kk < DV / 16; ++kk)
        LoadA(oa_frag[mi][kk], wdo + 16 * mi * kLdV, kLdV, 16 * kk);
    }
  }
  float dq_acc[kM][DQK / 8][4];
#pragma unroll
  for (int mi = 0; mi < kM; ++mi) {
#pragma unroll
    for (int n = 0; n < DQK / 8; ++n) {
      dq_acc[mi][n][0] = dq_acc[mi][n][1] = dq_acc[mi][n][2] = dq_acc[mi][n][3] = 0;
    }
  }

  const int kv_end = min(q0 + kRows, S);
  for (int k0 = 0, buf = 0; k0 < kv_end; k0 += kTile, buf ^= 1) {
    bf16* sk = reinterpret_cast<bf16*>(smem + L::kK + (kTuned ? buf * L::kBuf : 0));
    bf16* sv = reinterpret_cast<bf16*>(smem + L::kV + (kTuned ? buf * L::kBuf : 0));
    if constexpr (kTuned) {
      CpAsyncWait<0>();  // this thread's copies of this tile (the only group in flight)
      // After it every copy of this tile has landed and every warp is done with the previous
      // one, whose buffer the next tile then refills while this one is used.
      __syncthreads();
      if (k0 + kTile < kv_end) {
        const size_t next = (buf ^ 1) * L::kBuf;
        LoadQkTile<DQK, kRope>(reinterpret_cast<bf16*>(smem + L::kK + next),
                               K + long(k0 + kTile) * p.ldk, p.ldk, S - k0 - kTile, rope,
                               k0 + kTile);
        LoadTileAsync<DV>(reinterpret_cast<bf16*>(smem + L::kV + next),
                          V + long(k0 + kTile) * p.ldv, p.ldv, S - k0 - kTile);
        CpAsyncCommit();
      }
    } else {
      __syncthreads();  // the previous key tile is no longer read
      LoadQkBoth<DQK, kRope>(sk, skt, K + long(k0) * p.ldk, p.ldk, S - k0, rope, k0);
      LoadTile<DV>(sv, V + long(k0) * p.ldv, p.ldv, S - k0);
      __syncthreads();
    }
    if (!warp_active) continue;
    for (int kc = 0; kc < kTile; kc += 16) {
      const int ka = k0 + kc;  // the chunk's first key
      // Warp-uniform skips: past the sequence, or every key after every query of the warp.
      if (ka >= S || ka > w0 + 16 * kM - 1) continue;
      // S = Q_w·Kᵀ and dP = dO_w·Vᵀ over the chunk: rows the warp's queries (m-tile mi), n-tile
      // n the keys ka + 8n ..; each B fragment serves every m-tile.
      float s[kM][2][4] = {}, dp[kM][2][4] = {};
#pragma unroll
      for (int kk = 0; kk < DQK / 16; ++kk) {
        uint32_t a[kM][4], bk[2];
#pragma unroll
        for (int mi = 0; mi < kM; ++mi) {
          if constexpr (kKeep) {
#pragma unroll
            for (int x = 0; x < 4; ++x) a[mi][x] = qa_frag[mi][kk][x];
          } else {
            LoadA(a[mi], wq + 16 * mi * kLdQ, kLdQ, 16 * kk);
          }
        }
#pragma unroll
        for (int n = 0; n < 2; ++n) {
          LoadBt(bk, sk, kLdQ, kc + 8 * n, 16 * kk);
#pragma unroll
          for (int mi = 0; mi < kM; ++mi) mma::MmaBf16(s[mi][n], a[mi], bk);
        }
      }
#pragma unroll
      for (int kk = 0; kk < DV / 16; ++kk) {
        uint32_t a[kM][4], bv[2];
#pragma unroll
        for (int mi = 0; mi < kM; ++mi) {
          if constexpr (kKeep) {
#pragma unroll
            for (int x = 0; x < 4; ++x) a[mi][x] = oa_frag[mi][kk][x];
          } else {
            LoadA(a[mi], wdo + 16 * mi * kLdV, kLdV, 16 * kk);
          }
        }
#pragma unroll
        for (int n = 0; n < 2; ++n) {
          LoadBt(bv, sv, kLdV, kc + 8 * n, 16 * kk);
#pragma unroll
          for (int mi = 0; mi < kM; ++mi) mma::MmaBf16(dp[mi][n], a[mi], bv);
        }
      }
      // dS where it lies: element e of n-tile n of m-tile mi is query w0 + 16·mi + gr + 8·(e ≥ 2),
      // key ka + 8n + 2t + (e odd); packed pairwise it is the A fragment (k = the 16 keys).
      uint32_t dsa[kM][4];
#pragma unroll
      for (int mi = 0; mi < kM; ++mi) {
#pragma unroll
        for (int n = 0; n < 2; ++n) {
          float ds[4];
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int half = e >> 1, qi = w0 + 16 * mi + gr + 8 * half;
            const int key = ka + 8 * n + 2 * t + (e & 1);
            ProbGrad(p, key <= qi && qi < S, s[mi][n][e], dp[mi][n][e], row_lse[mi][half],
                     row_d[mi][half], &ds[e]);
          }
          dsa[mi][2 * n] = mma::PackBf16x2(ds[0], ds[1]);
          dsa[mi][2 * n + 1] = mma::PackBf16x2(ds[2], ds[3]);
        }
      }
      // dQ += dS·K: B[k = key][n = column], by ldmatrix.trans from the K tile (tuned) or from
      // its transposed copy.
      if constexpr (kTuned) {
#pragma unroll
        for (int n = 0; n < DQK / 8; n += 2) {
          uint32_t bk[4];
          LoadBPairTrans(bk, sk, kLdQ, kc, 8 * n);
#pragma unroll
          for (int mi = 0; mi < kM; ++mi) {
            mma::MmaBf16(dq_acc[mi][n], dsa[mi], bk);
            mma::MmaBf16(dq_acc[mi][n + 1], dsa[mi], bk + 2);
          }
        }
      } else {
#pragma unroll
        for (int n = 0; n < DQK / 8; ++n) {
          uint32_t bk[2];
          LoadBt(bk, skt, kLdT, 8 * n, kc);
#pragma unroll
          for (int mi = 0; mi < kM; ++mi) mma::MmaBf16(dq_acc[mi][n], dsa[mi], bk);
        }
      }
    }
  }
  if (!warp_active) return;
  StoreDqTiles<DQK, kM, kRope>(dq + long(b) * S * p.ldq + long(h) * DQK, p.ldq, dq_acc, w0, S,
                               p.scale, rope, gr, t);
}

}  // namespace moelab::cuda::flash
