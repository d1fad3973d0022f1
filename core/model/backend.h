// The seam between the one model (core/model/model.cc), the one training loop
// (core/train/trainer.cc) and a device: memory (arrays, copies to and from the host) and coarse
// ops (a GEMM, an attention, a fused norm, an MoE layer's steps), one virtual call each. The CPU
// backend (core/model/cpu_backend.cc) runs kernels/cpu on host memory; the CUDA backend
// (core/model/cuda_backend.cc) runs kernels/cuda on device memory. docs/model.md says why the
// seam is a small virtual op table rather than a template parameter.
//
// Every pointer an op takes is memory of its backend. Ops are coarse on purpose: a call costs a
// few nanoseconds against microseconds (CPU) or a kernel launch (CUDA) of work.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/config.h"
#include "core/model/backend_memory.h"
#include "core/model/moe_experts.h"
#include "core/model/optimizer_ops.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/rope.h"

namespace moelab {

class CudaOpProfiler;

// Attention that keeps its probabilities (the CPU kernel, CUDA's reference path) saves them
// [B,H,S,S], then, when soft-capping, the capped logits of the same size: what it saves, and
// where the capped part starts (null without a soft-cap).
inline size_t ProbabilitiesSaved(const cpu::AttentionDims& a) {
  return (a.softcap > 0 ? 2 : 1) * static_cast<size_t>(a.batch) * a.heads * a.seq * a.seq;
}
template <typename T>
T* CappedPart(T* saved, const cpu::AttentionDims& a) {
  return a.softcap > 0 ? saved + static_cast<size_t>(a.batch) * a.heads * a.seq * a.seq : nullptr;
}

struct LossTerms {
  double loss = 0;    // mean cross-entropy
  double z_loss = 0;  // coefficient included
};

// One row chunk of the LM head and its loss (core/model/model.cc's OutputLoss): logits = x·Wᵀ,
// softmax cross-entropy (+ z-loss), and with backward dlogits scaled by `weight`, then
// dx = dlogits·W and dW (+)= dlogitsᵀ·x. Every pointer is memory of the backend.
template <typename T>
struct LmHeadChunk {
  const T* x = nullptr;              // [rows, d]: the final norm's output
  const T* w = nullptr;              // [vocab, d]: the head (or the tied embedding), in the arena
  const int32_t* targets = nullptr;  // [rows]
  int rows = 0, d = 0, vocab = 0;
  double z_coef = 0;
  // The chunk's share of the mean over all rows (rows / total): scales the gradient only.
  double weight = 1;
  bool backward = false;
  // Scratch of rows·vocab elements of T: the logits, then (backward) dlogits. A backend may
  // store them in a narrower type there (CUDA in bf16 uses half of it).
  T* logits = nullptr;
  double* row_scratch = nullptr;  // [2·rows + 2]
  T* dx = nullptr;                // [rows, d], overwritten (backward)
  T* dw = nullptr;                // [vocab, d], overwritten or accumulated (backward)
  bool accumulate_dw = false;
};

// The MHA/GQA attention of one layer between its norm and the residual (every non-MLA
// attention; core/model/model.cc): qkv = x̂·[Wq; Wk; Wv]ᵀ, QK-norm of q and k (when the gains are
// given), RoPE on q and k (unless the backend's attention applies it), the attention → att, then
// y += att·Woᵀ. qkv and att (and the backward's datt) are read and written by the two core ops
// only, so a backend may hold them in a narrower type inside the model's slots (CUDA in bf16 with
// train.kernels.attention_acts "bf16"). Every pointer is memory of the backend.
template <typename T>
struct AttentionCore {
  cpu::AttentionDims dims;  // with dims.batch the micro-batch
  const T* x = nullptr;     // [n, d] the norm's output
  const T* wqkv = nullptr;  // [qdim + 2·kvdim, d]: wq, wk, wv adjacent
  const T* wo = nullptr;    // [d, odim]
  int n = 0, d = 0, qdim = 0, kvdim = 0, odim = 0;
  int head_dim = 0;                              // the rotated dims of a head too
  const T *cos = nullptr, *sin = nullptr;        // RoPE tables [seq, head_dim/2]
  const T *q_norm = nullptr, *k_norm = nullptr;  // QK-norm gains [head_dim]; null: none
  double norm_eps = 0;
  T* qkv = nullptr;                        // [n, qdim + 2·kvdim], kept for the backward
  T* qk_raw = nullptr;                     // QK-norm: [n, qdim + kvdim] q | k before it, kept
  T *rstd_q = nullptr, *rstd_k = nullptr;  // QK-norm: [n·H], [n·KVH], kept
  T* saved = nullptr;                      // AttentionSavedElements(dims)
  T* att = nullptr;                        // [n, odim], kept
  T* pair_max = nullptr;                   // [B·H]
  int qkv_dim() const { return qdim + 2 * kvdim; }
};
// The backward's gradients: dy (of y) in; dx [n, d] and the weight gradients overwritten;
// datt [n, odim], dqkv [n, qkv_dim] and scratch (AttentionScratchElements) its work space.
template <typename T>
struct AttentionCoreGrads {
  const T* dy = nullptr;
  T *datt = nullptr, *dqkv = nullptr, *scratch = nullptr;
  T* dx = nullptr;
  T *dwqkv = nullptr, *dwo = nullptr, *dq_norm = nullptr, *dk_norm = nullptr;
};

// Chunk r0 of a whole-head description `all` (all.rows rows): rows r0 … r0 + chunk_rows (fewer for
// the last), weighted by its share of the mean (1 for a single chunk), dW accumulating after the
// first.
template <typename T>
LmHeadChunk<T> LmHeadChunkOf(const LmHeadChunk<T>& all, int r0, int chunk_rows) {
  LmHeadChunk<T> c = all;
  c.rows = std::min(chunk_rows, all.rows - r0);
  c.x = all.x + static_cast<size_t>(r0) * all.d;
  c.targets = all.targets + r0;
  c.weight = c.rows == all.rows ? 1.0 : static_cast<double>(c.rows) / all.rows;
  c.dx = all.dx + static_cast<size_t>(r0) * all.d;
  c.accumulate_dw = r0 > 0;
  return c;
}

template <typename T>
class Backend;

// The whole LM head and its loss from LmHeadLossChunk, chunk by chunk in row order, the terms
// summed on the host as weight·terms (one chunk: its terms as they are).
template <typename T>
LossTerms ComposeLmHeadLoss(Backend<T>& be, const LmHeadChunk<T>& all, int chunk_rows);

// The attention core from the finer ops, in the order the model ran them before the ops existed
// (the CPU backend and CUDA without train.kernels.attention_acts "bf16" run these: the finer ops'
// bits).
template <typename T>
void ComposeAttentionCoreForward(Backend<T>& be, const AttentionCore<T>& c, T* y);
template <typename T>
void ComposeAttentionCoreBackward(Backend<T>& be, const AttentionCore<T>& c,
                                  const AttentionCoreGrads<T>& g);

// LmHeadLossChunk from the finer ops, in the order the model used before the op existed:
// Linear, CrossEntropy, Scale (when weight != 1), LinearBackward. The CPU backend and CUDA's fp32
// mode run this; their results are those of the finer ops, bit for bit.
template <typename T>
LossTerms ComposeLmHeadLossChunk(Backend<T>& be, const LmHeadChunk<T>& c);

template <typename T>
class Backend : public BackendMemory {
 public:
  // --- Weights. The model registers its parameter arena once; a backend that computes on a
  // copy (CUDA in bf16) refreshes it in WeightsChanged(), called after every update.
  virtual void SetWeights(const T* params, size_t n) = 0;
  virtual void WeightsChanged() = 0;
  // That copy, for an optimizer to write in its update (core/model/optimizer_ops.h); null: none.
  virtual WeightCopy* weight_copy() { return nullptr; }
  // The ops the optimizers (core/optim) run over this backend's arenas. Default: the host table,
  // right for every backend whose memory is host memory.
  virtual OptimizerOps& optimizer_ops() { return CpuOptimizerOps(); }

  // --- Dense algebra. y = x·Wᵀ (+ y); W [out, in] row-major, inside the weight arena.
  virtual void Linear(const T* x, const T* w, int n, int in, int out, T* y, bool accumulate) = 0;
  // dx = dy·W (+ dx), dW = dyᵀ·x (+ dW); dx may be null.
  virtual void LinearBackward(const T* x, const T* w, const T* dy, int n, int in, int out, T* dx,
                              T* dw, bool accumulate_dx, bool accumulate_dw) = 0;
  // Dense SwiGLU FFN y = W2·(silu(W1·x) ⊙ W3·x), keeping h1, h3, act for the backward; scratch
  // holds [n, 2·hidden].
  virtual void FfnForward(const T* x, int n, int d, int hidden, const T* w1, const T* w3,
                          const T* w2, T* h1, T* h3, T* act, T* y) = 0;
  virtual void FfnBackward(const T* x, int n, int d, int hidden, const T* w1, const T* w3,
                           const T* w2, const T* h1, const T* h3, const T* act, const T* dy, T* dx,
                           T* dw1, T* dw3, T* dw2, T* scratch) = 0;

  // --- Norms (kernels/cpu/norm.h).
  virtual void RmsNorm(const T* x, const T* gain, int n, int d, double eps, T* y, T* rstd) = 0;
  virtual void RmsNormBackward(const T* x, const T* gain, const T* rstd, const T* dy, int n, int d,
                               T* dx, T* dgain, bool accumulate_dx) = 0;
  // The residual add at a layer boundary with the next norm: sum = a + b (sum may alias a or b),
  // y = RMSNorm(sum), rstd kept. The values of Add then RmsNorm, bit for bit; CUDA reads a and b
  // and writes sum and y in one kernel. (The backward needs no twin: RmsNormBackward's
  // accumulate_dx already adds the residual gradient.)
  virtual void AddRmsNorm(const T* a, const T* b, T* sum, const T* gain, int n, int d, double eps,
                          T* y, T* rstd) = 0;
  virtual void RmsNormGroups(const T* x, int ldx, T* y, int ldy, int n, int groups, int d,
                             const T* gain, double eps, T* rstd) = 0;
  virtual void RmsNormGroupsBackward(const T* x, int ldx, const T* gain, const T* rstd, const T* dy,
                                     int lddy, T* dx, int lddx, int n, int groups, int d,
                                     T* dgain) = 0;

  // --- Attention. Which kernel runs is the backend's choice (CUDA: the fused one where it
  // covers the shape); `saved` is what its backward needs (probabilities, or log-sum-exp rows).
  virtual size_t AttentionSavedElements(const cpu::AttentionDims& a) = 0;
  virtual size_t AttentionScratchElements(const cpu::AttentionDims& a) = 0;
  // out [n, ldo]; pair_max [B·H]: per (sequence, head) max raw logit.
  virtual void AttentionForward(const cpu::AttentionDims& a, const T* q, const T* k, const T* v,
                                T* saved, T* out, T* pair_max) = 0;
  virtual void AttentionBackward(const cpu::AttentionDims& a, const T* q, const T* k, const T* v,
                                 const T* out, const T* saved, const T* dout, T* dq, T* dk, T* dv,
                                 T* scratch) = 0;
  // Whether AttentionForward / AttentionBackward with dims a apply the (non-MLA) RoPE of q and k
  // themselves, with the tables given to SetAttentionRope: q and k are then passed un-rotated
  // (and stay so in the caller's buffer), dq and dk come back with respect to them, and the
  // caller skips its RopeQk calls. The answer must not change between a forward and its
  // backward. Default: no (the CPU backend; CUDA unless its fused kernels are told to).
  virtual bool AttentionAppliesRope(const cpu::AttentionDims& a) {
    (void)a;
    return false;
  }
  // The model's RoPE tables (cos, sin [seq, rot_dim/2], memory of this backend, alive as long as
  // the backend is used), registered once after they are uploaded.
  virtual void SetAttentionRope(const T* cos, const T* sin, int rot_dim) {
    (void)cos, (void)sin, (void)rot_dim;
  }
  // The whole MHA/GQA attention of a layer (AttentionCore): y [n, d] accumulates att·Woᵀ.
  virtual void AttentionCoreForward(const AttentionCore<T>& c, T* y) {
    ComposeAttentionCoreForward(*this, c, y);
  }
  virtual void AttentionCoreBackward(const AttentionCore<T>& c, const AttentionCoreGrads<T>& g) {
    ComposeAttentionCoreBackward(*this, c, g);
  }
  // head_max[h] = max over b of pair_max[b·heads + h].
  virtual void HeadMax(const T* pair_max, int batch, int heads, T* head_max) = 0;
  virtual void Rope(T* x, int n, int seq, int ld, int heads, int head_stride, int offset,
                    int rot_dim, const T* cos, const T* sin, bool inverse) = 0;
  // Rope on the q heads and on the k heads (two slices of n rows) in one op: one launch on CUDA.
  virtual void RopeQk(const cpu::RopeSlice<T>& q, const cpu::RopeSlice<T>& k, int n, int seq,
                      int rot_dim, const T* cos, const T* sin, bool inverse) = 0;
  // dst[r·ldd + h·dst_stride + dst_off + j] = src[r·lds + h·src_stride + src_off + j] for rows
  // r < n, heads h, columns j < width (MLA's per-head assembly; src_stride 0 broadcasts).
  virtual void CopyHeads(const T* src, int lds, int src_stride, int src_off, T* dst, int ldd,
                         int dst_stride, int dst_off, int n, int heads, int width) = 0;
  // dst[r·ldd + j] = Σ_h src[r·lds + h·src_stride + src_off + j], in head order.
  virtual void SumHeads(const T* src, int lds, int src_stride, int src_off, T* dst, int ldd, int n,
                        int heads, int width) = 0;
  // rows × cols elements from src (row stride lds) to dst (row stride ldd).
  virtual void CopyRows(const T* src, int lds, T* dst, int ldd, int rows, int cols) = 0;

  // --- Embedding, output, residual.
  virtual void Embedding(const T* table, const int32_t* tokens, int n, int d, T* out) = 0;
  // dtable[token] += dout rows (the caller zeroes dtable first, or not, for tied weights).
  virtual void EmbeddingBackward(const int32_t* tokens, const T* dout, int n, int d, T* dtable) = 0;
  // Softmax cross-entropy (+ z-loss) of logits [n, vocab]; backward: logits become dlogits.
  virtual LossTerms CrossEntropy(T* logits, const int32_t* targets, int n, int vocab, double z_coef,
                                 bool backward, double* row_scratch) = 0;
  // One chunk of the LM head with its loss (LmHeadChunk). Returns the chunk's own mean terms
  // (unweighted); a backend may keep the logits in a narrower type than T (CUDA in bf16).
  virtual LossTerms LmHeadLossChunk(const LmHeadChunk<T>& c) = 0;
  // The LM head and loss over all rows of `all` (all.rows; its weight and accumulate_dw unused)
  // in chunks of at most chunk_rows (LmHeadChunkOf), so the [rows, vocab] logits never exist at
  // once; returns the mean terms. A backend may keep the chunks' terms on the device and read
  // the sum once (CUDA in bf16: one synchronisation instead of one a chunk).
  virtual LossTerms LmHeadLoss(const LmHeadChunk<T>& all, int chunk_rows) {
    return ComposeLmHeadLoss(*this, all, chunk_rows);
  }
  // out[i] = a[i] + b[i] (out may alias a or b).
  virtual void Add(const T* a, const T* b, T* out, size_t n) = 0;

  // --- MoE. One MoE layer's ops (core/model/moe_experts.h), which the one layer
  // (core/model/moe_layer.h) runs. expert_first / expert_count: the routed experts this process
  // holds (all: 0, E).
  virtual std::unique_ptr<MoeExperts<T>> MakeMoeExperts(const ModelConfig& model,
                                                        const MoEConfig& moe, int expert_first,
                                                        int expert_count) = 0;

  // --- What the training loop does with whole arenas (core/train/trainer.cc).
  // Σ x² in double, summed in a fixed order (chunks of 2^16 from x, then the chunks in order):
  // the same bits for every thread count, and for a range of an arena the same bits as the
  // ZeRO-1 shard norms (core/dist/zero.h).
  virtual double SumSquares(const T* x, size_t n) = 0;
  double L2Norm(const T* x, size_t n) { return std::sqrt(SumSquares(x, n)); }
  virtual void Scale(T* x, size_t n, T s) = 0;
  // acc = w·g (first) or acc += w·g: gradient accumulation over micro-batches; FinishScaledSum
  // then writes g = acc + w·g (the last micro-batch joins without another pass).
  virtual void ScaledSum(const T* g, double w, bool first, T* acc, size_t n) = 0;
  virtual void FinishScaledSum(const T* acc, double w, T* g, size_t n) = 0;
  // QK-Clip's row scalings (core/optim/qk_clip_plan.h) on the parameter arena (in T; a float
  // backend passes them to its OptimizerOps::ScaleRows).
  virtual void ScaleRows(const std::vector<RowScale>& rows, T* arena) = 0;

  // Per-op-class timing (CUDA events); null: off. A no-op on the CPU.
  virtual void set_profiler(CudaOpProfiler* profiler) { (void)profiler; }
};

template <typename T>
LossTerms ComposeLmHeadLossChunk(Backend<T>& be, const LmHeadChunk<T>& c) {
  be.Linear(c.x, c.w, c.rows, c.d, c.vocab, c.logits, false);
  const LossTerms part =
      be.CrossEntropy(c.logits, c.targets, c.rows, c.vocab, c.z_coef, c.backward, c.row_scratch);
  if (c.backward) {
    if (c.weight != 1) {
      be.Scale(c.logits, static_cast<size_t>(c.rows) * c.vocab, static_cast<T>(c.weight));
    }
    be.LinearBackward(c.x, c.w, c.logits, c.rows, c.d, c.vocab, c.dx, c.dw, false, c.accumulate_dw);
  }
  return part;
}

template <typename T>
void ComposeAttentionCoreForward(Backend<T>& be, const AttentionCore<T>& c, T* y) {
  const cpu::AttentionDims& a = c.dims;
  const int ld = c.qkv_dim(), hd = c.head_dim;
  be.Linear(c.x, c.wqkv, c.n, c.d, ld, c.qkv, false);
  if (c.q_norm) {
    const int qk = c.qdim + c.kvdim;
    be.CopyRows(c.qkv, ld, c.qk_raw, qk, c.n, qk);
    be.RmsNormGroups(c.qk_raw, qk, c.qkv, ld, c.n, a.heads, hd, c.q_norm, c.norm_eps, c.rstd_q);
    be.RmsNormGroups(c.qk_raw + c.qdim, qk, c.qkv + c.qdim, ld, c.n, a.kv_heads, hd, c.k_norm,
                     c.norm_eps, c.rstd_k);
  }
  if (!be.AttentionAppliesRope(a)) {
    be.RopeQk({c.qkv, ld, a.heads, hd, 0}, {c.qkv + c.qdim, ld, a.kv_heads, hd, 0}, c.n, a.seq, hd,
              c.cos, c.sin, false);
  }
  be.AttentionForward(a, c.qkv, c.qkv + c.qdim, c.qkv + c.qdim + c.kvdim, c.saved, c.att,
                      c.pair_max);
  be.Linear(c.att, c.wo, c.n, c.odim, c.d, y, /*accumulate=*/true);
}

template <typename T>
void ComposeAttentionCoreBackward(Backend<T>& be, const AttentionCore<T>& c,
                                  const AttentionCoreGrads<T>& g) {
  const cpu::AttentionDims& a = c.dims;
  const int ld = c.qkv_dim(), hd = c.head_dim;
  be.LinearBackward(c.att, c.wo, g.dy, c.n, c.odim, c.d, g.datt, g.dwo, false, false);
  be.AttentionBackward(a, c.qkv, c.qkv + c.qdim, c.qkv + c.qdim + c.kvdim, c.att, c.saved, g.datt,
                       g.dqkv, g.dqkv + c.qdim, g.dqkv + c.qdim + c.kvdim, g.scratch);
  if (!be.AttentionAppliesRope(a)) {
    be.RopeQk({g.dqkv, ld, a.heads, hd, 0}, {g.dqkv + c.qdim, ld, a.kv_heads, hd, 0}, c.n, a.seq,
              hd, c.cos, c.sin, true);
  }
  if (c.q_norm) {
    const int qk = c.qdim + c.kvdim;
    be.RmsNormGroupsBackward(c.qk_raw, qk, c.q_norm, c.rstd_q, g.dqkv, ld, g.dqkv, ld, c.n, a.heads,
                             hd, g.dq_norm);
    be.RmsNormGroupsBackward(c.qk_raw + c.qdim, qk, c.k_norm, c.rstd_k, g.dqkv + c.qdim, ld,
                             g.dqkv + c.qdim, ld, c.n, a.kv_heads, hd, g.dk_norm);
  }
  be.LinearBackward(c.x, c.wqkv, g.dqkv, c.n, c.d, ld, g.dx, g.dwqkv, false, false);
}

template <typename T>
LossTerms ComposeLmHeadLoss(Backend<T>& be, const LmHeadChunk<T>& all, int chunk_rows) {
  LossTerms total;
  for (int r0 = 0; r0 < all.rows; r0 += chunk_rows) {
    const LmHeadChunk<T> c = LmHeadChunkOf(all, r0, chunk_rows);
    const LossTerms part = be.LmHeadLossChunk(c);
    if (c.rows == all.rows) {
      total = part;
    } else {
      // One rounding each (std::fma): the same bits whether or not the compiler would contract
      // w·p + t (it does under -march=native), and the same as the CUDA backend's device sum.
      total.loss = std::fma(c.weight, part.loss, total.loss);
      total.z_loss = std::fma(c.weight, part.z_loss, total.z_loss);
    }
  }
  return total;
}

// The backend train.device names: "cpu", or "cuda" (float only; throws without a usable GPU or
// in a build without CUDA, naming why).
template <typename T>
std::unique_ptr<Backend<T>> MakeBackend(const RunConfig& config);
template <typename T>
std::unique_ptr<Backend<T>> MakeCpuBackend();
// core/model/cuda_backend.cc; throws DeviceError without a usable GPU or CUDA in the build.
std::unique_ptr<Backend<float>> MakeCudaBackend(const RunConfig& config);

}  // namespace moelab
