#include <cuda_runtime.h>

#include <cmath>
#include <stdexcept>
#include <string>

#include "kernels/cuda/attention.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/gemm.h"

namespace moelab::cuda {
namespace {

// The (batch, head) products as strided-batched GEMMs: for each batch b and each position j of
// a query head inside its kv group, one call batched over the kv heads g (query head
// h = g·group + j). Query-side operands step by group·dim between batch entries, kv-side ones by
// dim, the [S,S] probability blocks by group·S·S. B·group calls per product (B for MHA).
struct PairLayout {
  const AttentionDims& a;
  int group() const { return a.heads / a.kv_heads; }
  long ss() const { return static_cast<long>(a.seq) * a.seq; }
  // Offsets of the query-head (h = g·group + j) operands for batch b, entry g = 0.
  long q(int b, int j) const { return static_cast<long>(b) * a.seq * a.ldq + long(j) * a.qk_dim; }
  long o(int b, int j) const { return static_cast<long>(b) * a.seq * a.ldo + long(j) * a.v_dim; }
  long k(int b) const { return static_cast<long>(b) * a.seq * a.ldk; }
  long v(int b) const { return static_cast<long>(b) * a.seq * a.ldv; }
  long p(int b, int j) const { return (static_cast<long>(b) * a.heads + j) * ss(); }
  long q_stride() const { return long(group()) * a.qk_dim; }
  long o_stride() const { return long(group()) * a.v_dim; }
  long p_stride() const { return long(group()) * ss(); }
};

__global__ void FillNegInf(float* x, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] = -INFINITY;
}

// One block per (pair, query row i). Raw logits (already scaled) in P's row: the row max over
// j ≤ i is the pair's S_max candidate (atomic max, exact); then soft-cap, masked softmax. Every
// column j > i of P (and of C) is written 0, which the backward relies on.
__global__ void SoftmaxRowsKernel(float* probs, float* capped, float* pair_max, int seq, float cap,
                                  bf16* probs16) {
  __shared__ float shared[32];
  const long row = blockIdx.x;  // pair·S + i
  const int i = static_cast<int>(row % seq);
  const long pair = row / seq;
  float* p = probs + row * seq;
  float* c = cap > 0 ? capped + row * seq : nullptr;
  float rmax = -INFINITY;
  for (int j = threadIdx.x; j <= i; j += blockDim.x) rmax = fmaxf(rmax, p[j]);
  rmax = detail::BlockMax(rmax, shared, -INFINITY);
  if (threadIdx.x == 0) detail::AtomicMaxFloat(pair_max + pair, rmax);
  float m = rmax;
  if (c) {
    for (int j = threadIdx.x; j < seq; j += blockDim.x) {
      if (j <= i) {
        const float t = tanhf(p[j] / cap);
        c[j] = t;
        p[j] = cap * t;
      } else {
        c[j] = 0;
      }
    }
    m = cap * tanhf(rmax / cap);  // tanh is monotonic: the capped row max
  }
  float sum = 0;
  for (int j = threadIdx.x; j <= i; j += blockDim.x) {
    const float e = expf(p[j] - m);
    p[j] = e;
    sum += e;
  }
  sum = detail::BlockSum(sum, shared);
  const float inv = 1.0f / sum;
  for (int j = threadIdx.x; j < seq; j += blockDim.x) {
    const float value = j <= i ? p[j] * inv : 0.0f;
    p[j] = value;
    if (probs16) probs16[row * seq + j] = __float2bfloat16(value);
  }
}

// dS = P ⊙ (dP − Σ_j P·dP) (⊙ (1 − C²) with a soft-cap), in place in ds.
__global__ void SoftmaxBackwardRowsKernel(const float* probs, const float* capped, float* ds,
                                          int seq, bf16* ds16) {
  __shared__ float shared[32];
  const long row = blockIdx.x;
  const float* p = probs + row * seq;
  const float* c = capped ? capped + row * seq : nullptr;
  float* d = ds + row * seq;
  float dot = 0;
  for (int j = threadIdx.x; j < seq; j += blockDim.x) dot += p[j] * d[j];
  dot = detail::BlockSum(dot, shared);
  for (int j = threadIdx.x; j < seq; j += blockDim.x) {
    float v = p[j] * (d[j] - dot);
    if (c) v *= 1.0f - c[j] * c[j];
    d[j] = v;
    if (ds16) ds16[row * seq + j] = __float2bfloat16(v);
  }
}

__global__ void MaxOverBatchKernel(const float* pair_max, int batch, int heads, float* out) {
  const int h = blockIdx.x * blockDim.x + threadIdx.x;
  if (h >= heads) return;
  float m = -INFINITY;
  for (int b = 0; b < batch; ++b) m = fmaxf(m, pair_max[static_cast<long>(b) * heads + h]);
  out[h] = m;
}

int RowThreads(int seq) { return seq >= 512 ? 256 : (seq >= 128 ? 128 : 32); }

}  // namespace

void ValidateAttentionDims(const AttentionDims& a, const char* who) {
  auto fail = [&](const std::string& why) {
    throw std::invalid_argument(std::string(who) + ": " + why);
  };
  if (a.batch < 0 || a.seq < 0 || a.heads <= 0 || a.kv_heads <= 0 || a.qk_dim <= 0 ||
      a.v_dim <= 0) {
    fail("non-positive dimension");
  }
  if (a.heads % a.kv_heads != 0) fail("heads must be a multiple of kv_heads");
  if (a.ldq < a.heads * a.qk_dim) fail("ldq smaller than heads*qk_dim");
  if (a.ldk < a.kv_heads * a.qk_dim) fail("ldk smaller than kv_heads*qk_dim");
  if (a.ldv < a.kv_heads * a.v_dim) fail("ldv smaller than kv_heads*v_dim");
  if (a.ldo < a.heads * a.v_dim) fail("ldo smaller than heads*v_dim");
}

size_t AttentionScratchSize(const AttentionDims& a) {
  return static_cast<size_t>(a.batch) * a.heads * a.seq * a.seq;
}

namespace {

// Both precisions' pair products and softmax (fp32: every operand float; bf16: bf16 operands and
// fp32 probabilities, with a bf16 copy `probs16` that the value GEMM reads as `pv`), so the two
// paths cannot drift apart. S = scale·Q·Kᵀ, then the row softmax, then O = P·V.
template <typename In, typename P, typename Out>
void ForwardPairs(const AttentionDims& a, const In* q, const In* k, const In* v, float* probs,
                  bf16* probs16, const P* pv, float* capped, Out* out, float* pair_max,
                  const char* softmax_what, cudaStream_t stream) {
  const PairLayout L{a};
  const int S = a.seq, G = a.kv_heads, group = L.group();
  const int pairs = a.batch * a.heads;
  if (pairs <= 0 || S <= 0) return;
  FillNegInf<<<(pairs + 255) / 256, 256, 0, stream>>>(pair_max, pairs);
  for (int b = 0; b < a.batch; ++b) {
    for (int j = 0; j < group; ++j) {
      GemmStridedBatched(false, true, S, S, a.qk_dim, static_cast<float>(a.scale), q + L.q(b, j),
                         a.ldq, L.q_stride(), k + L.k(b), a.ldk, a.qk_dim, 0.0f, probs + L.p(b, j),
                         S, L.p_stride(), G, stream);
    }
  }
  SoftmaxRowsKernel<<<static_cast<long>(pairs) * S, RowThreads(S), 0, stream>>>(
      probs, capped, pair_max, S, static_cast<float>(a.softcap), probs16);
  CheckLaunch(softmax_what);
  for (int b = 0; b < a.batch; ++b) {
    for (int j = 0; j < group; ++j) {
      GemmStridedBatched(false, false, S, a.v_dim, S, 1.0f, pv + L.p(b, j), S, L.p_stride(),
                         v + L.v(b), a.ldv, a.v_dim, 0.0f, out + L.o(b, j), a.ldo, L.o_stride(), G,
                         stream);
    }
  }
}

// The backward's, likewise: dS (fp32 in `ds`, with a bf16 copy `ds16` for the bf16 path) is
// read by the dQ and dK GEMMs as `dsv`, the probabilities by the dV GEMM as `pv`.
template <typename In, typename P>
void BackwardPairs(const AttentionDims& a, const In* q, const In* k, const In* v,
                   const float* probs, const P* pv, const float* capped, const In* dout, float* dq,
                   float* dk, float* dv, float* ds, bf16* ds16, const P* dsv,
                   const char* softmax_what, cudaStream_t stream) {
  const PairLayout L{a};
  const int S = a.seq, G = a.kv_heads, group = L.group();
  const int pairs = a.batch * a.heads;
  if (pairs <= 0 || S <= 0) return;
  const float scale = static_cast<float>(a.scale);
  // dP = dO·Vᵀ for every pair.
  for (int b = 0; b < a.batch; ++b) {
    for (int j = 0; j < group; ++j) {
      GemmStridedBatched(false, true, S, S, a.v_dim, 1.0f, dout + L.o(b, j), a.ldo, L.o_stride(),
                         v + L.v(b), a.ldv, a.v_dim, 0.0f, ds + L.p(b, j), S, L.p_stride(), G,
                         stream);
    }
  }
  SoftmaxBackwardRowsKernel<<<static_cast<long>(pairs) * S, RowThreads(S), 0, stream>>>(
      probs, a.softcap > 0 ? capped : nullptr, ds, S, ds16);
  CheckLaunch(softmax_what);
  for (int b = 0; b < a.batch; ++b) {
    for (int j = 0; j < group; ++j) {
      // dQ = scale·dS·K.
      GemmStridedBatched(false, false, S, a.qk_dim, S, scale, dsv + L.p(b, j), S, L.p_stride(),
                         k + L.k(b), a.ldk, a.qk_dim, 0.0f, dq + L.q(b, j), a.ldq, L.q_stride(), G,
                         stream);
      // dV = Pᵀ·dO and dK = scale·dSᵀ·Q; the group's first query head overwrites, the others
      // accumulate in head order.
      const float beta = j == 0 ? 0.0f : 1.0f;
      GemmStridedBatched(true, false, S, a.v_dim, S, 1.0f, pv + L.p(b, j), S, L.p_stride(),
                         dout + L.o(b, j), a.ldo, L.o_stride(), beta, dv + L.v(b), a.ldv, a.v_dim,
                         G, stream);
      GemmStridedBatched(true, false, S, a.qk_dim, S, scale, dsv + L.p(b, j), S, L.p_stride(),
                         q + L.q(b, j), a.ldq, L.q_stride(), beta, dk + L.k(b), a.ldk, a.qk_dim, G,
                         stream);
    }
  }
}

}  // namespace

// The fp32 kernels read and write float only (T = float is the one instantiation).
template <typename T>
void AttentionForward(const AttentionDims& a, const T* q, const T* k, const T* v, T* probs,
                      T* capped, T* out, T* pair_max, cudaStream_t stream) {
  ValidateAttentionDims(a, "cuda::AttentionForward");
  ForwardPairs(a, q, k, v, probs, nullptr, probs, capped, out, pair_max, "AttentionForward softmax",
               stream);
}

template <typename T>
void AttentionBackward(const AttentionDims& a, const T* q, const T* k, const T* v, const T* probs,
                       const T* capped, const T* dout, T* dq, T* dk, T* dv, T* scratch,
                       cudaStream_t stream) {
  ValidateAttentionDims(a, "cuda::AttentionBackward");
  BackwardPairs(a, q, k, v, probs, probs, capped, dout, dq, dk, dv, scratch, nullptr, scratch,
                "AttentionBackward softmax", stream);
}

template <typename T>
void AttentionMaxOverBatch(const T* pair_max, int batch, int heads, T* head_max,
                           cudaStream_t stream) {
  if (heads <= 0) return;
  MaxOverBatchKernel<<<(heads + 127) / 128, 128, 0, stream>>>(pair_max, batch, heads, head_max);
  CheckLaunch("AttentionMaxOverBatch");
}

void AttentionForwardBf16(const AttentionDims& a, const bf16* q, const bf16* k, const bf16* v,
                          float* probs, bf16* probs16, float* capped, bf16* out, float* pair_max,
                          cudaStream_t stream) {
  ValidateAttentionDims(a, "cuda::AttentionForwardBf16");
  ForwardPairs(a, q, k, v, probs, probs16, probs16, capped, out, pair_max,
               "AttentionForwardBf16 softmax", stream);
}

void AttentionBackwardBf16(const AttentionDims& a, const bf16* q, const bf16* k, const bf16* v,
                           const float* probs, const bf16* probs16, const float* capped,
                           const bf16* dout, float* dq, float* dk, float* dv, float* scratch,
                           bf16* scratch16, cudaStream_t stream) {
  ValidateAttentionDims(a, "cuda::AttentionBackwardBf16");
  BackwardPairs(a, q, k, v, probs, probs16, capped, dout, dq, dk, dv, scratch, scratch16, scratch16,
                "AttentionBackwardBf16 softmax", stream);
}

template void AttentionForward<float>(const AttentionDims&, const float*, const float*,
                                      const float*, float*, float*, float*, float*, cudaStream_t);
template void AttentionBackward<float>(const AttentionDims&, const float*, const float*,
                                       const float*, const float*, const float*, const float*,
                                       float*, float*, float*, float*, cudaStream_t);
template void AttentionMaxOverBatch<float>(const float*, int, int, float*, cudaStream_t);

}  // namespace moelab::cuda
