// Device code and step sequence of the CUDA Newton–Schulz (kernels/cuda/newton_schulz.h).
// Internal header, included by newton_schulz.cu and by tests/cuda_kernels/ns_emulation_test.cc,
// which runs these kernels and this very sequence on the CPU (cuBLAS replaced by a CPU GEMM).
// The kernels are static so that the emulation's and the GPU build's versions never meet at link
// time.
//
// Symmetry, as modded-nanogpt's Newton–Schulz kernels use it: A = X·Xᵀ and A·A = A·Aᵀ are
// symmetric, so only the tiles on and below the diagonal of the m×m products are computed (one
// pointer-array batched GEMM over every such tile of every matrix of the bank), and one small
// kernel mirrors them. With T tiles per side that is T(T+1)/2 of T² tiles: 56 % of the flops of
// the two Gram-side products at T = 8. X ← B·X stays a full GEMM. Buffers ping-pong in the
// caller's workspace: no copies or allocations per iteration.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <utility>

#include "kernels/cuda/common.cuh"

namespace moelab::cuda::ns {

// The shape of one bank's iteration. Wide (rows ≤ cols): X is m×n row-major, A = X·Xᵀ. Tall: X
// is n×m row-major (its transpose iterates), A = Xᵀ·X. Square tiles of `tile` cut A.
struct Plan {
  int batch = 0, m = 0, n = 0;
  bool tall = false;
  int tile = 0, tiles = 1;  // tiles per side of A: m = tile · tiles
  int pairs = 1;            // tiles on or below the diagonal: tiles·(tiles+1)/2
  int64_t mn = 0, mm = 0;
  int64_t count() const { return static_cast<int64_t>(batch) * pairs; }  // tile products
};

// The smallest tile ≥ min_tile, a multiple of 8 (16-byte aligned bf16 tile pointers), dividing m
// at least twice; none: one tile (full products).
inline Plan MakePlan(int batch, int rows, int cols, int min_tile) {
  Plan p;
  p.batch = batch;
  p.tall = rows > cols;
  p.m = std::min(rows, cols);
  p.n = std::max(rows, cols);
  p.mn = static_cast<int64_t>(p.m) * p.n;
  p.mm = static_cast<int64_t>(p.m) * p.m;
  p.tile = p.m;
  for (int t = std::max(8, (min_tile + 7) / 8 * 8); 2 * t <= p.m; t += 8) {
    if (p.m % t == 0) {
      p.tile = t;
      break;
    }
  }
  p.tiles = p.m / p.tile;
  p.pairs = p.tiles * (p.tiles + 1) / 2;
  return p;
}

// Tile product e = matrix·pairs + pair, pair = i(i+1)/2 + j for tile row i ≥ column j.
__host__ __device__ inline void PairOf(int pair, int* i, int* j) {
  int r = 0;
  while ((r + 1) * (r + 2) / 2 <= pair) ++r;
  *i = r;
  *j = pair - r * (r + 1) / 2;
}

// Operands of the tile products C(i, j) = op(A_i)·op(B_j): element offsets per matrix and per
// tile index of A, B and C.
struct TileJob {
  const void* a;
  int64_t a_matrix, a_tile;
  const void* b;
  int64_t b_matrix, b_tile;
  void* c;
  int64_t c_matrix, c_row, c_col;
};

// Fills the pointer arrays of a pointer-array batched GEMM over every lower tile of every matrix.
template <typename T>
static __global__ void TilePointersKernel(TileJob job, int pairs, int64_t count, void** a, void** b,
                                          void** c) {
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < count;
       e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t mat = e / pairs;
    int i, j;
    PairOf(static_cast<int>(e % pairs), &i, &j);
    a[e] = const_cast<T*>(static_cast<const T*>(job.a)) + mat * job.a_matrix + i * job.a_tile;
    b[e] = const_cast<T*>(static_cast<const T*>(job.b)) + mat * job.b_matrix + j * job.b_tile;
    c[e] = static_cast<T*>(job.c) + mat * job.c_matrix + i * job.c_row + j * job.c_col;
  }
}

// x = in / (‖in‖_F + eps) per matrix; one block per matrix, the sum of squares in double.
template <typename T>
static __global__ void NormalizeKernel(const T* in, T* x, int64_t mn, double eps) {
  __shared__ double shared[32];
  const T* src = in + blockIdx.x * mn;
  T* dst = x + blockIdx.x * mn;
  double ss = 0;
  for (int64_t i = threadIdx.x; i < mn; i += blockDim.x) {
    const double v = detail::ToFloat(src[i]);
    ss += v * v;
  }
  ss = detail::BlockSum(ss, shared);
  const float inv = static_cast<float>(1.0 / (sqrt(ss) + eps));
  for (int64_t i = threadIdx.x; i < mn; i += blockDim.x) {
    dst[i] = detail::FromFloat<T>(inv * detail::ToFloat(src[i]));
  }
}

// The tiles above the diagonal of every m×m matrix from their mirror images below it.
template <typename T>
static __global__ void MirrorKernel(T* a, int m, int tile, int64_t total) {
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < total;
       e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t mat = e / (int64_t(m) * m);
    const int r = static_cast<int>(e / m % m), c = static_cast<int>(e % m);
    if (r / tile <= c / tile) continue;
    T* base = a + mat * m * m;
    base[int64_t(c) * m + r] = base[int64_t(r) * m + c];
  }
}

// B = Q + cb·A + ca·I in place of Q = cc·A·A, whose tiles on and below the diagonal are computed:
// each such element also writes its mirror above (read by nobody else, so no race).
template <typename T>
static __global__ void CombineKernel(T* q, const T* a, int m, int tile, int64_t total, float ca,
                                     float cb) {
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < total;
       e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t mat = e / (int64_t(m) * m);
    const int r = static_cast<int>(e / m % m), c = static_cast<int>(e % m);
    if (r / tile < c / tile) continue;
    T* qb = q + mat * m * m;
    const T* ab = a + mat * m * m;
    const int64_t rc = int64_t(r) * m + c;
    float v = detail::ToFloat(qb[rc]) + cb * detail::ToFloat(ab[rc]);
    if (r == c) v += ca;
    const T out = detail::FromFloat<T>(v);
    qb[rc] = out;
    if (r / tile > c / tile) qb[int64_t(c) * m + r] = out;
  }
}

// The iteration, on an executor E that launches the kernels above and the GEMMs (cuBLAS in
// newton_schulz.cu, a CPU GEMM in the emulation test). Row-major GEMMs as kernels/cuda/gemm.h:
//   e.GemmStrided(ta, tb, m, n, k, alpha, a, lda, sa, b, ldb, sb, beta, c, ldc, sc, batch)
//   e.GemmTiles(ta, tb, m, n, k, alpha, a_ptrs, lda, b_ptrs, ldb, c_ptrs, ldc, count)  (β = 0)
//   e.Normalize(in, x, plan, eps), e.TilePointers(job, plan, a, b, c), e.Mirror(a, plan),
//   e.Combine(q, a, plan, ca, cb), e.Pointers(count) → void** (device scratch).
// workspace: batch·mn + 2·batch·mm elements (the second iterate, A, and Q/B); out is the first
// iterate, the normalisation lands in the buffer that makes the last step write out.
template <typename T, typename E>
void NewtonSchulzSteps(E& e, const T* in, T* out, const Plan& p, int steps, T* workspace,
                       double eps, float ca, float cb, float cc) {
  T* y = workspace;
  T* a = y + p.batch * p.mn;
  T* q = a + p.batch * p.mm;
  T* x = out;
  if (steps % 2 == 1) std::swap(x, y);  // steps alternate x → y → x …, ending in out
  e.Normalize(in, x, p, eps);
  if (steps <= 0) return;
  const int m = p.m, n = p.n, t = p.tile;
  const bool split = p.tiles > 1;
  // Pointer arrays (A, B, C operands), filled once per call: the Gram tiles reading x, those
  // reading y, and A·A's tiles.
  void** gram[2][3] = {};
  void** prod[3] = {};
  if (split) {
    const int64_t c = p.count();
    void** all = e.Pointers(9 * c);
    for (int s = 0; s < 2; ++s) {
      const T* from = s == 0 ? x : y;
      // Wide: tile i is rows i·t… of X (ld n). Tall: columns i·t… of X (ld m), used transposed.
      const int64_t step = p.tall ? t : int64_t(t) * n;
      for (int k = 0; k < 3; ++k) gram[s][k] = all + (3 * s + k) * c;
      e.TilePointers(TileJob{from, p.mn, step, from, p.mn, step, a, p.mm, int64_t(t) * m, t}, p,
                     gram[s][0], gram[s][1], gram[s][2]);
    }
    for (int k = 0; k < 3; ++k) prod[k] = all + (6 + k) * c;
    const int64_t rows = int64_t(t) * m;
    e.TilePointers(TileJob{a, p.mm, rows, a, p.mm, rows, q, p.mm, rows, t}, p, prod[0], prod[1],
                   prod[2]);
  }
  int from = 0;  // x holds the iterate (0) or y does (1)
  for (int s = 0; s < steps; ++s) {
    T* cur = from == 0 ? x : y;
    T* dst = from == 0 ? y : x;
    // A = X·Xᵀ (wide) or Xᵀ·X (tall).
    const int ld = p.tall ? m : n;
    if (split) {
      e.GemmTiles(p.tall, !p.tall, t, t, n, 1.0f, gram[from][0], ld, gram[from][1], ld,
                  gram[from][2], m, p.count());
      e.Mirror(a, p);
    } else {
      e.GemmStrided(p.tall, !p.tall, m, m, n, 1.0f, cur, ld, p.mn, cur, ld, p.mn, 0.0f, a, m, p.mm,
                    p.batch);
    }
    // Q = cc·A·A = cc·A·Aᵀ.
    if (split) {
      e.GemmTiles(false, true, t, t, m, cc, prod[0], m, prod[1], m, prod[2], m, p.count());
    } else {
      e.GemmStrided(false, true, m, m, m, cc, a, m, p.mm, a, m, p.mm, 0.0f, q, m, p.mm, p.batch);
    }
    // B = Q + cb·A + ca·I (mirrored), then X ← B·X (wide) or X·B (tall).
    e.Combine(q, a, p, ca, cb);
    if (p.tall) {
      e.GemmStrided(false, false, n, m, m, 1.0f, cur, m, p.mn, q, m, p.mm, 0.0f, dst, m, p.mn,
                    p.batch);
    } else {
      e.GemmStrided(false, false, m, n, m, 1.0f, q, m, p.mm, cur, n, p.mn, 0.0f, dst, n, p.mn,
                    p.batch);
    }
    from = 1 - from;
  }
}

}  // namespace moelab::cuda::ns
