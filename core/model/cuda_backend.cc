// The CUDA backend (core/model/cuda_backend.h): the ops of core/model/backend.h over device
// memory, with kernels/cuda in place of kernels/cpu. The memory plan is cuda_memory_plan.cc, the
// supports-checks cuda_supports.cc, the kernel-choice reading cuda_backend_choices.cc.
#include "core/model/cuda_backend.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <stdexcept>
#include <string>

#include "core/device.h"
#include "core/comm/collective_wait.h"
#include "core/comm/nccl_communicator.h"
#include "core/flops.h"
#include "core/model/attention_dims.h"
#include "core/model/backend.h"
#include "core/model/model.h"
#include "core/optimizer_traits.h"

#if MOELAB_HAVE_CUDA
#include "core/cuda_profiler.h"
#include "core/model/cuda_backend_choices.h"
#include "core/model/cuda_backend_kernels.h"
#include "core/model/cuda_moe.h"
#include "core/model/cuda_optimizer_ops.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/cross_entropy.h"
#include "kernels/cuda/cudnn_grouped_matmul.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/embedding.h"
#include "kernels/cuda/flash_attention.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/moe_routing.h"
#include "kernels/cuda/norm.h"
#include "kernels/cuda/rope.h"
#include "kernels/cuda/swiglu.h"
#endif

namespace moelab {

#if MOELAB_HAVE_CUDA

namespace {

using cuda::bf16;

// (ChooseFlash, KernelSelectionOf and the attention sizes: core/model/cuda_backend_choices.cc)

// Also the MoE ops' host (core/model/cuda_moe.h): their bf16 weights and profiler.
class CudaBackend final : public Backend<float>, public cudamodel::CudaMoeHost {
 public:
  explicit CudaBackend(const RunConfig& c)
      : kernels_(KernelSelectionOf(c.train.kernels)),
        use_bf16_(c.train.effective_precision() == "bf16"),
        flash_(ChooseFlash(c)),
        ffn_fused_(use_bf16_ && c.train.kernels.ffn == "fused"),
        attention_acts_bf16_(use_bf16_ && AttentionActsBf16(c)),
        optimizer_ops_(this, use_bf16_) {}

  std::string name() const override { return "cuda"; }
  bool is_host() const override { return false; }
  void* Allocate(size_t bytes) override {
    if (bytes == 0) return nullptr;
    void* p = nullptr;
    MOELAB_CUDA_CHECK(cudaMalloc(&p, bytes));
    MOELAB_CUDA_CHECK(cudaMemset(p, 0, bytes));
    return p;
  }
  void Release(void* p) noexcept override { cudaFree(p); }
  void ToBackend(void* dst, const void* host, size_t bytes) override {
    WritingTo(dst, bytes);
    if (bytes) MOELAB_CUDA_CHECK(cudaMemcpy(dst, host, bytes, cudaMemcpyHostToDevice));
  }
  void ToHost(void* host, const void* src, size_t bytes) const override {
    if (bytes) MOELAB_CUDA_CHECK(cudaMemcpy(host, src, bytes, cudaMemcpyDeviceToHost));
  }
  void Copy(void* dst, const void* src, size_t bytes) override {
    WritingTo(dst, bytes);
    if (bytes) {
      ProfileScope ps(profiler_, "copy");  // the residual copy before the output projection
      MOELAB_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, nullptr));
    }
  }
  void Zero(void* p, size_t bytes) override {
    WritingTo(p, bytes);
    if (bytes) MOELAB_CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, nullptr));
  }

  void SetWeights(const float* params, size_t n) override {
    weights_ = params;
    num_weights_ = n;
    if (use_bf16_) weights_bf16_.Resize(n);
  }
  // Casts what the optimizer did not write in its update (WeightCopy): everything after a
  // checkpoint load, the other ranks' shards under ZeRO-1 (they arrive by all-gather).
  void WeightsChanged() override {
    if (use_bf16_) weights_bf16_.Refresh(weights_);
  }
  WeightCopy* weight_copy() override { return use_bf16_ ? &weights_bf16_ : nullptr; }
  // Newton–Schulz in the run's precision.
  OptimizerOps& optimizer_ops() override { return optimizer_ops_; }
  // The bf16 copy of a weight inside the arena (bf16 mode).
  const bf16* Bf16Of(const float* w) const override {
    if (!w) return nullptr;
    if (w < weights_ || w >= weights_ + num_weights_) {
      throw std::logic_error("cuda backend: a GEMM weight outside the parameter arena");
    }
    return weights_bf16_.values() + (w - weights_);
  }
  bool uses_bf16() const { return use_bf16_; }
  // A write into the weights other than the optimizer's: the next refresh casts them all.
  void WritingTo(const void* p, size_t bytes) {
    const char* a = static_cast<const char*>(p);
    const char* w = reinterpret_cast<const char*>(weights_);
    if (use_bf16_ && bytes && a < w + num_weights_ * sizeof(float) && w < a + bytes) {
      weights_bf16_.Forget();
    }
    norm_copy_.ForgetIfOverlaps(p, bytes);
  }

  // y = x·Wᵀ: fp32, or bf16 inputs (cast here) with fp32 accumulation and output.
  void Linear(const float* x, const float* w, int n, int in, int out, float* y,
              bool accumulate) override {
    ProfileScope ps(profiler_, "gemm");
    if (!use_bf16_) {
      cuda::LinearForward<float>(x, w, n, in, out, y, accumulate);
      return;
    }
    bf16* xb = Cast(x, &xb_, static_cast<size_t>(n) * in);
    cuda::LinearForward<bf16>(xb, Bf16Of(w), n, in, out, y, accumulate);
  }
  void LinearBackward(const float* x, const float* w, const float* dy, int n, int in, int out,
                      float* dx, float* dw, bool accumulate_dx, bool accumulate_dw) override {
    ProfileScope ps(profiler_, "gemm");
    if (!use_bf16_) {
      cuda::LinearBackward<float>(x, w, dy, n, in, out, dx, dw, accumulate_dx, accumulate_dw);
      return;
    }
    bf16* xb = Cast(x, &xb_, static_cast<size_t>(n) * in);
    bf16* dyb = Cast(dy, &dyb_, static_cast<size_t>(n) * out);
    cuda::LinearBackward<bf16>(xb, Bf16Of(w), dyb, n, in, out, dx, dw, accumulate_dx,
                               accumulate_dw);
  }
  void FfnForward(const float* x, int n, int d, int hidden, const float* w1, const float* w3,
                  const float* w2, float* h1, float* h3, float* act, float* y) override {
    if (!use_bf16_) {
      ProfileScope ps(profiler_, "ffn");
      cuda::SwigluForward(x, n, d, hidden, w1, w3, w2, h1, h3, act, y);
      return;
    }
    if (ffn_fused_) {
      // bf16 intermediates in the model's fp32 slots: h13 [n, 2F] bf16 fills h1's, act [n, F]
      // bf16 half of act's (only FfnBackward reads them); h3's slot stays unused.
      ProfileScope ps(profiler_, "ffn");
      bf16* xb = Cast(x, &xb_, static_cast<size_t>(n) * d);
      cuda::GatedFfnForwardBf16(xb, n, d, hidden, Bf16Of(w1), Bf16Of(w3), Bf16Of(w2),
                                reinterpret_cast<bf16*>(h1), reinterpret_cast<bf16*>(act), y,
                                false);
      return;
    }
    Linear(x, w1, n, d, hidden, h1, false);
    Linear(x, w3, n, d, hidden, h3, false);
    {
      ProfileScope ps(profiler_, "swiglu");
      cuda::SwigluActivation(h1, h3, static_cast<size_t>(n) * hidden, act);
    }
    Linear(act, w2, n, hidden, d, y, false);
  }
  void FfnBackward(const float* x, int n, int d, int hidden, const float* w1, const float* w3,
                   const float* w2, const float* h1, const float* h3, const float* act,
                   const float* dy, float* dx, float* dw1, float* dw3, float* dw2,
                   float* scratch) override {
    if (!use_bf16_) {
      ProfileScope ps(profiler_, "ffn");
      cuda::SwigluBackward(x, n, d, hidden, w1, w3, w2, h1, h3, act, dy, dx, dw1, dw3, dw2,
                           scratch);
      return;
    }
    if (ffn_fused_) {  // what FfnForward left in h1's and act's slots; dh13 in the scratch
      ProfileScope ps(profiler_, "ffn");
      bf16* xb = Cast(x, &xb_, static_cast<size_t>(n) * d);
      bf16* dyb = Cast(dy, &dyb_, static_cast<size_t>(n) * d);
      cuda::GatedFfnBackwardBf16(xb, dyb, n, d, hidden, Bf16Of(w1), Bf16Of(w3), Bf16Of(w2),
                                 reinterpret_cast<const bf16*>(h1),
                                 reinterpret_cast<const bf16*>(act),
                                 reinterpret_cast<bf16*>(scratch), dx, false, dw1, dw3, dw2);
      return;
    }
    const size_t nf = static_cast<size_t>(n) * hidden;
    float* dact = scratch;  // [n,F], then dh1 = dact in place, dh3 in the second half
    float* dh3 = scratch + nf;
    LinearBackward(act, w2, dy, n, hidden, d, dact, dw2, false, false);
    {
      ProfileScope ps(profiler_, "swiglu");
      cuda::SwigluActivationBackward(h1, h3, dact, nf, dact, dh3);
    }
    LinearBackward(x, w1, dact, n, d, hidden, dx, dw1, false, false);
    LinearBackward(x, w3, dh3, n, d, hidden, dx, dw3, /*accumulate_dx=*/true, false);
  }

  // bf16 mode: the norms feeding GEMMs also write their output in bf16, into the GEMM operand
  // buffer, and Cast hands that out instead of casting y again (NormCopy).
  void RmsNorm(const float* x, const float* gain, int n, int d, double eps, float* y,
               float* rstd) override {
    ProfileScope ps(profiler_, "norm");
    if (!use_bf16_) {
      cuda::RmsNormForward(x, gain, n, d, eps, y, rstd);
      return;
    }
    cuda::RmsNormForwardBf16(x, gain, n, d, eps, y, NormCopyOf(y, static_cast<size_t>(n) * d),
                             rstd);
  }
  void RmsNormBackward(const float* x, const float* gain, const float* rstd, const float* dy, int n,
                       int d, float* dx, float* dgain, bool accumulate_dx) override {
    ProfileScope ps(profiler_, "norm");
    norm_copy_.ForgetIfOverlaps(dx, sizeof(float) * n * d);
    cuda::RmsNormBackward(x, gain, rstd, dy, n, d, dx, dgain, accumulate_dx);
  }
  void AddRmsNorm(const float* a, const float* b, float* sum, const float* gain, int n, int d,
                  double eps, float* y, float* rstd) override {
    ProfileScope ps(profiler_, "norm");
    if (!use_bf16_) {
      cuda::AddRmsNormForward(a, b, sum, gain, n, d, eps, y, rstd);
      return;
    }
    const size_t nd = static_cast<size_t>(n) * d;
    norm_copy_.ForgetIfOverlaps(sum, sizeof(float) * nd);
    cuda::AddRmsNormForwardBf16(a, b, sum, gain, n, d, eps, y, NormCopyOf(y, nd), rstd);
  }
  // Strided outputs (QK-norm, MLA latents) keep fp32 only; one over the copied norm drops it.
  void RmsNormGroups(const float* x, int ldx, float* y, int ldy, int n, int groups, int d,
                     const float* gain, double eps, float* rstd) override {
    ProfileScope ps(profiler_, "norm");
    norm_copy_.ForgetIfOverlaps(y, sizeof(float) * n * ldy);
    cuda::RmsNormGroupsForward(x, ldx, y, ldy, n, groups, d, gain, eps, rstd);
  }
  void RmsNormGroupsBackward(const float* x, int ldx, const float* gain, const float* rstd,
                             const float* dy, int lddy, float* dx, int lddx, int n, int groups,
                             int d, float* dgain) override {
    ProfileScope ps(profiler_, "norm");
    norm_copy_.ForgetIfOverlaps(dx, sizeof(float) * n * lddx);
    cuda::RmsNormGroupsBackward(x, ldx, gain, rstd, dy, lddy, dx, lddx, n, groups, d, dgain);
  }

  size_t AttentionSavedElements(const cpu::AttentionDims& a) override {
    return AttentionSaved(flash_, a);
  }
  size_t AttentionScratchElements(const cpu::AttentionDims& a) override {
    return AttentionScratch(flash_, a);
  }
  // RoPE inside the fused mma kernels (train.kernels.rope "fused", opt-in; flash_attention.h):
  // only where the fused kernels run, the tables are registered and the kernels cover the shape
  // with a whole-head rotation (non-MLA: the model asks only there).
  bool AttentionAppliesRope(const cpu::AttentionDims& a) override {
    return flash_ && rope_.cos != nullptr && cuda::FlashRopeFused() &&
           cuda::FlashRopeSupported(cuda::AttentionDims(a), sizeof(float), rope_.rot_dim);
  }
  void SetAttentionRope(const float* cos, const float* sin, int rot_dim) override {
    rope_ = {cos, sin, rot_dim};
  }
  void AttentionForward(const cpu::AttentionDims& a, const float* q, const float* k, const float* v,
                        float* saved, float* out, float* pair_max) override {
    ProfileScope ps(profiler_, "attention fwd");
    if (flash_) {
      cuda::FlashAttentionForward<float>(cuda::AttentionDims(a), q, k, v, out, saved, pair_max,
                                         nullptr, AttentionAppliesRope(a) ? &rope_ : nullptr);
      return;
    }
    float* capped = CappedPart(saved, a);
    cuda::AttentionForward(cuda::AttentionDims(a), q, k, v, saved, capped, out, pair_max);
  }
  void AttentionBackward(const cpu::AttentionDims& a, const float* q, const float* k,
                         const float* v, const float* out, const float* saved, const float* dout,
                         float* dq, float* dk, float* dv, float* scratch) override {
    ProfileScope ps(profiler_, "attention bwd");
    if (flash_) {
      cuda::FlashAttentionBackward<float>(cuda::AttentionDims(a), q, k, v, out, saved, dout, dq, dk,
                                          dv, scratch, nullptr,
                                          AttentionAppliesRope(a) ? &rope_ : nullptr);
      return;
    }
    const float* capped = CappedPart(saved, a);
    cuda::AttentionBackward(cuda::AttentionDims(a), q, k, v, saved, capped, dout, dq, dk, dv,
                            scratch);
  }
  // bf16 attention activations (train.kernels.attention_acts "bf16", opt-in, bf16 mode, the fused
  // kernels, no QK-norm): qkv, att and datt are bf16 in the first half of the model's slots (only
  // these two ops touch them). The projection writes qkv in bf16 (no fp32 qkv, no cast on the
  // attention's loads), RoPE rotates the bf16 heads, the kernels read bf16 q, k, v and write bf16
  // att, which the output projection reads uncast; backward, datt = dy·Wo is written in bf16, the
  // kernels return dq, dk, dv in fp32 into dqkv as before. Elsewhere: the finer ops (their bits).
  bool NarrowAttention(const AttentionCore<float>& c) const {
    return use_bf16_ && flash_ && c.q_norm == nullptr && attention_acts_bf16_ && c.qdim % 8 == 0 &&
           c.kvdim % 8 == 0 &&
           cuda::FlashAttentionSupported(cuda::AttentionDims(c.dims), sizeof(bf16));
  }
  void AttentionCoreForward(const AttentionCore<float>& c, float* y) override {
    if (!NarrowAttention(c)) {
      ComposeAttentionCoreForward<float>(*this, c, y);
      return;
    }
    const cpu::AttentionDims& a = c.dims;
    const int ld = c.qkv_dim(), hd = c.head_dim;
    bf16* qkv = reinterpret_cast<bf16*>(c.qkv);
    bf16* att = reinterpret_cast<bf16*>(c.att);
    {
      ProfileScope ps(profiler_, "gemm");
      bf16* xb = Cast(c.x, &xb_, static_cast<size_t>(c.n) * c.d);
      cuda::Gemm(false, true, c.n, ld, c.d, 1.0f, xb, c.d, Bf16Of(c.wqkv), c.d, 0.0f, qkv, ld);
    }
    {
      ProfileScope ps(profiler_, "rope");
      cuda::RopeApplyQk(cpu::RopeSlice<bf16>{qkv, ld, a.heads, hd, 0},
                        cpu::RopeSlice<bf16>{qkv + c.qdim, ld, a.kv_heads, hd, 0}, c.n, a.seq, hd,
                        c.cos, c.sin, false);
    }
    {
      ProfileScope ps(profiler_, "attention fwd");
      cuda::FlashAttentionForward<bf16>(cuda::AttentionDims(a), qkv, qkv + c.qdim,
                                        qkv + c.qdim + c.kvdim, att, c.saved, c.pair_max);
    }
    ProfileScope ps(profiler_, "gemm");
    cuda::LinearForward<bf16>(att, Bf16Of(c.wo), c.n, c.odim, c.d, y, /*accumulate=*/true);
  }
  void AttentionCoreBackward(const AttentionCore<float>& c,
                             const AttentionCoreGrads<float>& g) override {
    if (!NarrowAttention(c)) {
      ComposeAttentionCoreBackward<float>(*this, c, g);
      return;
    }
    const cpu::AttentionDims& a = c.dims;
    const int ld = c.qkv_dim(), hd = c.head_dim;
    const bf16* qkv = reinterpret_cast<const bf16*>(c.qkv);
    const bf16* att = reinterpret_cast<const bf16*>(c.att);
    bf16* datt = reinterpret_cast<bf16*>(g.datt);
    {
      ProfileScope ps(profiler_, "gemm");
      const bf16* wo = Bf16Of(c.wo);
      bf16* dyb = Cast(g.dy, &dyb_, static_cast<size_t>(c.n) * c.d);
      cuda::Gemm(false, false, c.n, c.odim, c.d, 1.0f, dyb, c.d, wo, c.odim, 0.0f, datt, c.odim);
      cuda::LinearBackward<bf16>(att, wo, dyb, c.n, c.odim, c.d, nullptr, g.dwo, false, false);
    }
    {
      ProfileScope ps(profiler_, "attention bwd");
      cuda::FlashAttentionBackward<bf16>(cuda::AttentionDims(a), qkv, qkv + c.qdim,
                                         qkv + c.qdim + c.kvdim, att, c.saved, datt, g.dqkv,
                                         g.dqkv + c.qdim, g.dqkv + c.qdim + c.kvdim, g.scratch);
    }
    RopeQk({g.dqkv, ld, a.heads, hd, 0}, {g.dqkv + c.qdim, ld, a.kv_heads, hd, 0}, c.n, a.seq, hd,
           c.cos, c.sin, true);
    LinearBackward(c.x, c.wqkv, g.dqkv, c.n, c.d, ld, g.dx, g.dwqkv, false, false);
  }
  void HeadMax(const float* pair_max, int batch, int heads, float* head_max) override {
    cuda::AttentionMaxOverBatch(pair_max, batch, heads, head_max);
  }
  void Rope(float* x, int n, int seq, int ld, int heads, int head_stride, int offset, int rot_dim,
            const float* cos, const float* sin, bool inverse) override {
    ProfileScope ps(profiler_, "rope");
    cuda::RopeApply(x, n, seq, ld, heads, head_stride, offset, rot_dim, cos, sin, inverse);
  }
  void RopeQk(const cpu::RopeSlice<float>& q, const cpu::RopeSlice<float>& k, int n, int seq,
              int rot_dim, const float* cos, const float* sin, bool inverse) override {
    ProfileScope ps(profiler_, "rope");
    cuda::RopeApplyQk(q, k, n, seq, rot_dim, cos, sin, inverse);
  }
  void CopyHeads(const float* src, int lds, int src_stride, int src_off, float* dst, int ldd,
                 int dst_stride, int dst_off, int n, int heads, int width) override {
    ProfileScope ps(profiler_, "attention layout");
    cudamodel::CopyHeads(src, lds, src_stride, src_off, dst, ldd, dst_stride, dst_off, n, heads,
                         width, false);
  }
  void SumHeads(const float* src, int lds, int src_stride, int src_off, float* dst, int ldd, int n,
                int heads, int width) override {
    ProfileScope ps(profiler_, "attention layout");
    cudamodel::SumHeads(src, lds, src_stride, src_off, dst, ldd, n, heads, width);
  }
  void CopyRows(const float* src, int lds, float* dst, int ldd, int rows, int cols) override {
    ProfileScope ps(profiler_, "attention layout");
    MOELAB_CUDA_CHECK(cudaMemcpy2DAsync(dst, sizeof(float) * ldd, src, sizeof(float) * lds,
                                        sizeof(float) * cols, rows, cudaMemcpyDeviceToDevice,
                                        nullptr));
  }

  void Embedding(const float* table, const int32_t* tokens, int n, int d, float* out) override {
    ProfileScope ps(profiler_, "embedding");
    cuda::EmbeddingForward(table, tokens, n, d, out);
  }
  void EmbeddingBackward(const int32_t* tokens, const float* dout, int n, int d,
                         float* dtable) override {
    ProfileScope ps(profiler_, "embedding");
    const size_t bytes = cuda::EmbeddingScratchBytes(n);
    if (emb_scratch_.size() < bytes) emb_scratch_.Resize(bytes);
    cuda::EmbeddingBackward(tokens, dout, n, d, dtable, emb_scratch_.data());
  }
  LossTerms CrossEntropy(float* logits, const int32_t* targets, int n, int vocab, double z_coef,
                         bool backward, double* row_scratch) override {
    ProfileScope ps(profiler_, "cross_entropy");
    const cuda::CrossEntropyResult r =
        cuda::CrossEntropy(logits, targets, n, vocab, z_coef, backward, row_scratch);
    return {r.loss, r.z_loss};
  }
  // fp32: the finer ops (their bits). bf16: x cast once; logits = x·Wᵀ written in bf16 (fp32
  // accumulation) into the first half of the fp32 scratch; the cross-entropy kernel reads them and
  // writes the weighted dlogits over them in bf16; the backward GEMMs read those (dx, dW in fp32,
  // dW accumulating across chunks). No fp32 logits and no cast of dlogits.
  LossTerms LmHeadLossChunk(const LmHeadChunk<float>& c) override {
    if (!use_bf16_) return ComposeLmHeadLossChunk<float>(*this, c);
    double host[2];
    MOELAB_CUDA_CHECK(cudaMemcpy(host, LmHeadChunkBf16(c), sizeof(host), cudaMemcpyDeviceToHost));
    return {host[0], host[1]};
  }
  // bf16: every chunk's terms summed on the device (AccumulateLoss: the host's arithmetic), read
  // once at the end: one synchronisation for the head instead of one a chunk (64 a micro-batch
  // of 32 × 1024 rows over a 32k vocabulary).
  LossTerms LmHeadLoss(const LmHeadChunk<float>& all, int chunk_rows) override {
    if (!use_bf16_) return ComposeLmHeadLoss<float>(*this, all, chunk_rows);
    loss_sum_.Resize(2);
    MOELAB_CUDA_CHECK(cudaMemsetAsync(loss_sum_.data(), 0, 2 * sizeof(double), nullptr));
    for (int r0 = 0; r0 < all.rows; r0 += chunk_rows) {
      const LmHeadChunk<float> c = LmHeadChunkOf(all, r0, chunk_rows);
      cuda::AccumulateLoss(LmHeadChunkBf16(c), c.weight, loss_sum_.data());
    }
    double host[2];
    MOELAB_CUDA_CHECK(cudaMemcpy(host, loss_sum_.data(), sizeof(host), cudaMemcpyDeviceToHost));
    return {host[0], host[1]};
  }
  // One bf16 chunk, asynchronous: returns where on the device its {loss, z_loss} land (in its row
  // scratch, valid until the next chunk's cross-entropy).
  const double* LmHeadChunkBf16(const LmHeadChunk<float>& c) {
    bf16* xb = Cast(c.x, &xb_, static_cast<size_t>(c.rows) * c.d);
    const bf16* wb = Bf16Of(c.w);
    bf16* logits = reinterpret_cast<bf16*>(c.logits);
    double* terms = c.row_scratch + 2 * static_cast<size_t>(c.rows);
    {
      ProfileScope ps(profiler_, "gemm");
      cuda::Gemm(false, true, c.rows, c.vocab, c.d, 1.0f, xb, c.d, wb, c.d, 0.0f, logits, c.vocab);
    }
    {
      ProfileScope ps(profiler_, "cross_entropy");
      cuda::CrossEntropyAsync(logits, c.targets, c.rows, c.vocab, c.z_coef, c.backward, c.weight,
                              c.row_scratch, terms);
    }
    if (c.backward) {
      ProfileScope ps(profiler_, "gemm");
      cuda::LinearBackward<bf16>(xb, wb, logits, c.rows, c.d, c.vocab, c.dx, c.dw, false,
                                 c.accumulate_dw);
    }
    return terms;
  }
  void Add(const float* a, const float* b, float* out, size_t n) override {
    cudamodel::Add(a, b, out, n);
  }

  std::unique_ptr<MoeExperts<float>> MakeMoeExperts(const ModelConfig& m, const MoEConfig& e,
                                                    int first, int count) override {
    return std::make_unique<cudamodel::DeviceMoe>(m, e, use_bf16_, &moe_scratch_, this, first,
                                                  count);
  }

  double SumSquares(const float* x, size_t n) override { return optimizer_ops_.SumSquares(x, n); }
  void Scale(float* x, size_t n, float s) override { optimizer_ops_.Scale(x, n, s); }
  void ScaledSum(const float* g, double w, bool first, float* acc, size_t n) override {
    cudamodel::Axpy(g, static_cast<float>(w), first, acc, n);
    MOELAB_CUDA_CHECK(cudaGetLastError());
  }
  void FinishScaledSum(const float* acc, double w, float* g, size_t n) override {
    cudamodel::FinishAxpy(acc, static_cast<float>(w), g, n);
    MOELAB_CUDA_CHECK(cudaGetLastError());
  }
  void ScaleRows(const std::vector<RowScale>& rows, float* arena) override {
    optimizer_ops_.ScaleRows(rows, arena, arena == weights_ ? weight_copy() : nullptr);
  }

  void set_profiler(CudaOpProfiler* profiler) override { profiler_ = profiler; }
  CudaOpProfiler* profiler() const override { return profiler_; }

 private:
  // x cast to bf16 in *buf (grown to the widest GEMM operand seen), or, when x lies in the norm
  // output that xb_ still holds in bf16 (NormCopy), that copy with no kernel at all: the same bits
  // (the norm kernels round as the cast does). Any other cast drops the copy: xb_ is overwritten
  // or, into dyb_, the forward's use of the norm output is over. The casts left (the residual
  // gradients, the backward's re-casts of norm outputs, att, act) are their own profile class
  // under the op's ("gemm/cast").
  bf16* Cast(const float* x, cuda::DeviceBuffer<bf16>* buf, size_t n) {
    if (buf == &xb_ && norm_copy_.Holds(x, n)) return xb_.data() + (x - norm_copy_.y);
    norm_copy_ = {};
    ProfileScope ps(profiler_, "cast");
    if (buf->size() < n) buf->Resize(n);
    cuda::CastToBf16(x, buf->data(), n);
    return buf->data();
  }
  // Where a bf16 norm writes its copy of y (count elements): xb_, recorded as holding y.
  bf16* NormCopyOf(const float* y, size_t count) {
    if (xb_.size() < count) xb_.Resize(count);
    norm_copy_ = {y, count};
    return xb_.data();
  }

  // The norm output whose bf16 rounding xb_ holds, written by the norm itself (bf16 mode). Valid
  // while neither changes: the model writes its norm outputs (ln1, ln2, the final norm's, MLA's
  // cq) only through the norm ops, which record anew; a cast that misses it (every other GEMM
  // operand, the whole backward), a norm's strided or backward write over it, and Copy / Zero /
  // ToBackend over it drop it.
  struct NormCopy {
    const float* y = nullptr;
    size_t count = 0;
    // [x, x + n) inside [y, y + count).
    bool Holds(const float* x, size_t n) const {
      return y != nullptr && x >= y && n <= count && static_cast<size_t>(x - y) <= count - n;
    }
    void ForgetIfOverlaps(const void* p, size_t bytes) {
      const char* a = static_cast<const char*>(p);
      const char* b = reinterpret_cast<const char*>(y);
      if (y && bytes && a < b + count * sizeof(float) && b < a + bytes) *this = {};
    }
  };

  // The run's train.kernels for the launchers (process-wide: kernels/cuda/device.h), installed
  // before anything else is made and held as long as this backend lives.
  cuda::ScopedKernelSelection kernels_;
  // ffn_fused_: the dense FFN on GatedFfn*Bf16 (train.kernels.ffn "fused"; FfnBackward must read
  // what FfnForward wrote).
  // attention_acts_bf16_: train.kernels.attention_acts "bf16" (the backward takes the forward's
  // path).
  bool use_bf16_, flash_, ffn_fused_, attention_acts_bf16_;
  cuda::FlashRope rope_;  // the model's tables (SetAttentionRope); null: none registered
  const float* weights_ = nullptr;
  size_t num_weights_ = 0;
  Bf16WeightCopy weights_bf16_;
  CudaOptimizerOps optimizer_ops_;
  cuda::DeviceBuffer<bf16> xb_, dyb_;
  NormCopy norm_copy_;
  cuda::DeviceBuffer<unsigned char> emb_scratch_;
  cuda::DeviceBuffer<double> loss_sum_;  // LmHeadLoss in bf16: the chunks' summed terms
  cudamodel::MoeScratch moe_scratch_;
  CudaOpProfiler* profiler_ = nullptr;
};

}  // namespace

std::unique_ptr<Backend<float>> MakeCudaBackend(const RunConfig& config) {
  RequireDevice(config.train);
  return std::make_unique<CudaBackend>(config);
}

#else  // no CUDA in this build: every entry point says so.

std::unique_ptr<Backend<float>> MakeCudaBackend(const RunConfig& config) {
  RequireDevice(config.train);
  throw DeviceError("this moelab was built without CUDA");
}

#endif

}  // namespace moelab
