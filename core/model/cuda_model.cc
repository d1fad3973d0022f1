// The device twin of core/model/model.cc: the same walk over the same flat arenas, with the
// kernels/cuda twins in place of kernels/cpu. Layout and initial values come from a host
// Model<float> of the same config. See core/model/cuda_model.h and docs/cuda.md.
#include "core/model/cuda_model.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <map>
#include <stdexcept>
#include <string>

#include "core/device.h"
#include "core/flops.h"
#include "core/model/attention_dims.h"
#include "core/model/moe.h"

#if MOELAB_HAVE_CUDA
#include "core/model/cuda_model_kernels.h"
#include "core/model/cuda_moe.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/rope.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/cross_entropy.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/embedding.h"
#include "kernels/cuda/flash_attention.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/norm.h"
#include "kernels/cuda/rope.h"
#include "kernels/cuda/swiglu.h"
#endif

namespace moelab {

#if MOELAB_HAVE_CUDA

namespace {

using cuda::bf16;
template <typename T>
using Buf = cuda::DeviceBuffer<T>;

// Dimensions of the device model, from the config alone: what the activation layout and the
// memory plan need (no parameters, no GPU).
struct CudaShape {
  bool use_bf16 = false, mla = false, qk_norm = false, softcap = false;
  bool flash = false;  // attention through kernels/cuda/flash_attention.h (see ChooseFlash)
  int d = 0, L = 0, H = 0, KVH = 0, hd = 0, qdim = 0, kvdim = 0, qkv_dim = 0, F = 0, V = 0, S = 0;
  int E = 0, num_moe = 0, rq = 0, rkv = 0, dn = 0, dr = 0, dvh = 0, dqk = 0, odim = 0;
  int rot_dim = 0;
  std::vector<bool> moe_layer;  // per layer: an MoE FFN (else the dense SwiGLU)
  cpu::AttentionDims dims;

  static CudaShape Of(const RunConfig& c) {
    CudaShape s;
    s.Init(c);
    return s;
  }

  // Widest GEMM input (xb) and output gradient (dyb) of a step, for the bf16 cast buffers.
  size_t CastInWidth() const {
    return std::max<size_t>({static_cast<size_t>(d), static_cast<size_t>(F),
                             static_cast<size_t>(odim), static_cast<size_t>(rq),
                             static_cast<size_t>(rkv)});
  }
  size_t CastOutWidth() const {
    return std::max<size_t>({static_cast<size_t>(d), static_cast<size_t>(F),
                             static_cast<size_t>(qkv_dim), static_cast<size_t>(V),
                             static_cast<size_t>(rq), static_cast<size_t>(H) * dqk,
                             static_cast<size_t>(rkv + dr), static_cast<size_t>(H) * (dn + dvh)});
  }

 private:
  void Init(const RunConfig& c) {
    const ModelConfig& m = c.model;
    const MoEConfig& moe = c.moe;
    use_bf16 = c.train.effective_precision() == "bf16";
    softcap = m.logit_softcap > 0;
    d = m.d_model;
    L = m.layers;
    H = m.heads;
    KVH = m.kv_heads_effective();
    hd = m.head_dim_effective();
    mla = m.attention == "mla";
    qk_norm = m.qk_norm;
    F = m.ffn_hidden;
    V = m.vocab_size;
    S = m.seq_len;
    if (mla) {
      rq = m.q_lora_rank;
      rkv = m.kv_lora_rank;
      dn = m.qk_nope_head_dim;
      dr = m.qk_rope_head_dim;
      dvh = m.v_head_dim;
      dqk = dn + dr;
      KVH = H;
      odim = H * dvh;
      rot_dim = dr;
    } else {
      qdim = H * hd;
      kvdim = KVH * hd;
      qkv_dim = qdim + 2 * kvdim;
      odim = qdim;
      rot_dim = hd;
    }
    if (moe.enabled()) {
      E = moe.experts_total;
      num_moe = MoeLayers(m, moe);
    }
    moe_layer.assign(L, false);
    for (int l = 0; l < L; ++l) moe_layer[l] = moe.enabled() && l >= moe.dense_layers;
    dims = AttentionDimsOf(m);
    flash = ChooseFlash();
  }

  // The fused attention kernels (LSE kept, no [B,H,S,S] probabilities) in bf16 mode wherever they
  // cover the shape; fp32 mode keeps the reference path, the one its CPU twin checks compare.
  // MOELAB_ATTENTION=reference forces the reference path (for comparisons), =fused the fused one.
  bool ChooseFlash() const {
    const char* env = std::getenv("MOELAB_ATTENTION");
    const std::string mode = env ? env : "";
    if (!mode.empty() && mode != "reference" && mode != "fused") {
      throw std::invalid_argument("MOELAB_ATTENTION must be \"reference\" or \"fused\", not \"" +
                                  mode + "\"");
    }
    if (mode == "reference") return false;
    // q, k and v are column slices of arena buffers (256-byte aligned): 16-byte aligned when
    // their column offsets are multiples of 4 floats.
    const bool aligned = mla ? (H * dn) % 4 == 0 : qdim % 4 == 0 && kvdim % 4 == 0;
    std::string why = "q/k/v column offsets not 16-byte aligned";
    const bool ok = aligned && cuda::FlashAttentionSupported(cuda::AttentionDims(dims), 4, &why);
    if (mode == "fused" && !ok) {
      throw std::invalid_argument(
          "MOELAB_ATTENTION=fused: the fused kernels cannot run this model: " + why);
    }
    return ok && (use_bf16 || mode == "fused");
  }
};

// One layer's activations inside the arena (null where the architecture has none).
struct Acts {
  float *res, *ln1, *rstd1, *qkv, *qk_raw, *rstd_q, *rstd_k, *cq_raw, *cq, *rstd_cq, *qb, *kva,
      *ckv, *rstd_kv, *kvb, *qf, *kf, *probs, *capped, *att, *mid, *ln2, *rstd2, *h1, *h3, *act;
  float* lse;  // fused attention: the log-sum-exp rows [B·H·S] (probs and capped stay null)
};

// The activation arena's views: per-layer activations, then the step's shared buffers.
struct ActViews {
  std::vector<Acts> la;
  float *res_final = nullptr, *lnf = nullptr, *rstdf = nullptr, *logits = nullptr;
  float *dres = nullptr, *dln = nullptr, *datt = nullptr, *dqkv = nullptr, *dqf = nullptr;
  float *dkf = nullptr, *dqb = nullptr, *dkva = nullptr, *dkvb = nullptr, *dcq = nullptr;
  float *ffn_scratch = nullptr, *att_scratch = nullptr, *pair_max = nullptr, *head_max = nullptr;
};

// Carves the activation arena for `batch` sequences out of base (null: counts only) into v.
// Returns its size in floats. Reserve and the memory plan both call it: one arithmetic.
size_t LayoutActivations(const CudaShape& s, int batch, float* base, ActViews* v) {
  const size_t n = static_cast<size_t>(batch) * s.S;
  const size_t att = static_cast<size_t>(batch) * s.H * s.S * s.S;
  const int d = s.d, H = s.H, KVH = s.KVH, F = s.F, V = s.V, rq = s.rq, rkv = s.rkv, dr = s.dr;
  const int dn = s.dn, dvh = s.dvh, dqk = s.dqk, odim = s.odim, qkv_dim = s.qkv_dim;
  size_t total = 0;
  auto take = [&](size_t count) -> float* {
    if (count == 0) return nullptr;
    float* p = base ? base + total : nullptr;
    total += (count + 63) / 64 * 64;  // 256-byte aligned
    return p;
  };
  v->la.assign(s.L, Acts{});
  for (int l = 0; l < s.L; ++l) {
    Acts& a = v->la[l];
    a.res = take(n * d);
    a.ln1 = take(n * d);
    a.rstd1 = take(n);
    if (s.mla) {
      if (rq > 0) {
        a.cq_raw = take(n * rq);
        a.cq = take(n * rq);
        a.rstd_cq = take(n);
      }
      a.qb = take(n * H * dqk);
      a.kva = take(n * (rkv + dr));
      a.ckv = take(n * rkv);
      a.rstd_kv = take(n);
      a.kvb = take(n * H * (dn + dvh));
      a.qf = take(n * H * dqk);
      a.kf = take(n * H * dqk);
    } else {
      a.qkv = take(n * qkv_dim);
      if (s.qk_norm) {
        a.qk_raw = take(n * (s.qdim + s.kvdim));
        a.rstd_q = take(n * H);
        a.rstd_k = take(n * KVH);
      }
    }
    if (s.flash) {
      a.lse = take(static_cast<size_t>(batch) * H * s.S);
    } else {
      a.probs = take(att);
      a.capped = s.softcap ? take(att) : nullptr;
    }
    a.att = take(n * odim);
    a.mid = take(n * d);
    a.ln2 = take(n * d);
    a.rstd2 = take(n);
    if (!s.moe_layer[l]) {
      a.h1 = take(n * F);
      a.h3 = take(n * F);
      a.act = take(n * F);
    }
  }
  v->res_final = take(n * d);
  v->lnf = take(n * d);
  v->rstdf = take(n);
  v->logits = take(n * V);
  v->dres = take(n * d);
  v->dln = take(n * d);
  v->datt = take(n * odim);
  if (s.mla) {
    v->dqf = take(n * H * dqk);
    v->dkf = take(n * H * dqk);
    v->dqb = take(n * H * dqk);
    v->dkva = take(n * (rkv + dr));
    v->dkvb = take(n * H * (dn + dvh));
    v->dcq = take(n * std::max(rq, rkv));
  } else {
    v->dqkv = take(n * qkv_dim);
  }
  v->ffn_scratch = take(n * 2 * F);
  cpu::AttentionDims dims = s.dims;
  dims.batch = batch;
  v->att_scratch = take(s.flash ? cuda::FlashAttentionScratchSize(cuda::AttentionDims(dims))
                                : cuda::AttentionScratchSize(cuda::AttentionDims(dims)));
  v->pair_max = take(static_cast<size_t>(batch) * H);
  v->head_max = take(static_cast<size_t>(s.L) * H);
  return total;
}

}  // namespace

struct CudaModel::Impl : CudaShape, ActViews {
  struct Layer {
    size_t attn_norm = 0, wo = 0, ffn_norm = 0, wq = 0, q_norm = 0, k_norm = 0;
    size_t q_a = 0, q_a_norm = 0, q_b = 0, kv_a = 0, kv_a_norm = 0, kv_b = 0;
    size_t w1 = 0, w3 = 0, w2 = 0, router = 0, ew1 = 0, ew3 = 0, ew2 = 0, sw1 = 0, sw3 = 0, sw2 = 0;
    int moe_index = -1;
  };
  explicit Impl(const RunConfig& c) : cfg(c), m(c.model), moe(c.moe), host(c) {}

  RunConfig cfg;
  ModelConfig m;
  MoEConfig moe;
  Model<float> host;
  size_t embedding = 0, final_norm = 0, lm_head = 0;
  std::vector<Layer> layers;
  std::vector<std::unique_ptr<cudamodel::DeviceMoe>> moes;
  cudamodel::MoeScratch moe_scratch;

  Buf<float> params, grads, bias, rope_cos, rope_sin;
  Buf<cuda::bf16> params_bf16, xb, dyb;  // bf16 mode: weights, GEMM input / output-gradient casts

  int cap_batch = 0;
  Buf<float> acts;
  Buf<int32_t> inputs, targets;
  Buf<double> row_scratch;
  Buf<unsigned char> emb_scratch;
  std::vector<int32_t> host_inputs, host_targets;
  CudaOpProfiler* profiler = nullptr;

  void Setup() {
    static_cast<CudaShape&>(*this) = CudaShape::Of(cfg);
    std::map<std::string, size_t> at;
    for (const ParamInfo& p : host.param_infos()) at[p.name] = p.offset;
    auto get = [&](const std::string& name) {
      auto it = at.find(name);
      return it == at.end() ? size_t{0} : it->second;
    };
    embedding = get("embedding");
    final_norm = get("final_norm");
    lm_head = get("lm_head");
    layers.resize(L);
    int mi = 0;
    for (int l = 0; l < L; ++l) {
      Layer& y = layers[l];
      const std::string p = "layers." + std::to_string(l) + ".";
      y.attn_norm = get(p + "attn_norm");
      y.wq = get(p + "attn.wq");
      y.q_norm = get(p + "attn.q_norm");
      y.k_norm = get(p + "attn.k_norm");
      y.q_a = get(p + "attn.q_a");
      y.q_a_norm = get(p + "attn.q_a_norm");
      y.q_b = get(p + "attn.q_b_nope");
      y.kv_a = get(p + "attn.kv_a");
      y.kv_a_norm = get(p + "attn.kv_a_norm");
      y.kv_b = get(p + "attn.kv_b_k");
      y.wo = get(p + "attn.wo");
      y.ffn_norm = get(p + "ffn_norm");
      if (moe.enabled() && l >= moe.dense_layers) {
        y.moe_index = mi++;
        y.router = get(p + "moe.router");
        y.ew1 = get(p + "moe.experts.w1");
        y.ew3 = get(p + "moe.experts.w3");
        y.ew2 = get(p + "moe.experts.w2");
        y.sw1 = get(p + "moe.shared.w1");
        y.sw3 = get(p + "moe.shared.w3");
        y.sw2 = get(p + "moe.shared.w2");
        moes.push_back(std::make_unique<cudamodel::DeviceMoe>(m, moe, use_bf16, &moe_scratch));
      } else {
        y.w1 = get(p + "ffn.w1");
        y.w3 = get(p + "ffn.w3");
        y.w2 = get(p + "ffn.w2");
      }
    }
    const size_t np = host.num_params();
    params.Resize(np);
    grads.Resize(np);
    grads.Zero();
    if (use_bf16) params_bf16.Resize(np);
    if (!host.router_bias().empty()) bias.Resize(host.router_bias().size());
    std::vector<float> cs(static_cast<size_t>(S) * rot_dim / 2), sn(cs.size());
    cpu::RopeTables<float>(S, rot_dim, m.rope_theta, cs.data(), sn.data());
    rope_cos.Upload(cs);
    rope_sin.Upload(sn);
  }

  void AttendForward(Acts& a, const float* q, const float* k, const float* v) {
    if (flash) {
      cuda::FlashAttentionForward<float>(cuda::AttentionDims(dims), q, k, v, a.att, a.lse,
                                         pair_max);
    } else {
      cuda::AttentionForward(cuda::AttentionDims(dims), q, k, v, a.probs, a.capped, a.att,
                             pair_max);
    }
  }
  void AttendBackward(Acts& a, const float* q, const float* k, const float* v, float* dq, float* dk,
                      float* dv) {
    if (flash) {
      cuda::FlashAttentionBackward<float>(cuda::AttentionDims(dims), q, k, v, a.att, a.lse, datt,
                                          dq, dk, dv, att_scratch);
    } else {
      cuda::AttentionBackward(cuda::AttentionDims(dims), q, k, v, a.probs, a.capped, datt, dq, dk,
                              dv, att_scratch);
    }
  }

  void Reserve(int batch) {
    if (batch <= cap_batch) return;
    cap_batch = batch;
    const size_t n = static_cast<size_t>(batch) * S;
    dims.batch = batch;
    acts.Resize(LayoutActivations(*this, batch, nullptr, this));
    LayoutActivations(*this, batch, acts.data(), this);
    inputs.Resize(n);
    targets.Resize(n);
    row_scratch.Resize(2 * n + 2);
    emb_scratch.Resize(cuda::EmbeddingScratchBytes(static_cast<int>(n)));
    host_inputs.resize(n);
    host_targets.resize(n);
    if (use_bf16) {
      // Sized by the widest GEMM input and output gradient (only dyb ever holds vocab columns).
      xb.Resize(n * CastInWidth());
      dyb.Resize(n * CastOutWidth());
    }
  }

  // An MoE layer's weights in the arenas: fp32 masters, and the bf16 copy in bf16 mode.
  cudamodel::MoeLayerParams MoeParams(const Layer& ly) const {
    const float* P = params.data();
    cudamodel::MoeLayerParams p;
    p.router = P + ly.router;
    p.w1 = P + ly.ew1, p.w3 = P + ly.ew3, p.w2 = P + ly.ew2;
    p.bias = bias.data() + static_cast<size_t>(ly.moe_index) * E;
    const bool shared = moe.shared_experts > 0;
    if (shared) p.s1 = P + ly.sw1, p.s3 = P + ly.sw3, p.s2 = P + ly.sw2;
    if (use_bf16) {
      const cuda::bf16* B = params_bf16.data();
      p.w1b = B + ly.ew1, p.w3b = B + ly.ew3, p.w2b = B + ly.ew2;
      if (shared) p.s1b = B + ly.sw1, p.s3b = B + ly.sw3, p.s2b = B + ly.sw2;
    }
    return p;
  }

  // y = x·Wᵀ at weight offset w: fp32, or bf16 inputs (cast here) with fp32 accumulation/output.
  void Lin(const float* x, size_t w, int n, int in, int out, float* y, bool acc = false) {
    ProfileScope ps(profiler, "gemm");
    if (!use_bf16) {
      cuda::LinearForward<float>(x, params.data() + w, n, in, out, y, acc);
      return;
    }
    cuda::CastToBf16(x, xb.data(), static_cast<size_t>(n) * in);
    cuda::LinearForward<cuda::bf16>(xb.data(), params_bf16.data() + w, n, in, out, y, acc);
  }
  void LinB(const float* x, size_t w, const float* dy, int n, int in, int out, float* dx,
            bool acc_dx = false) {
    ProfileScope ps(profiler, "gemm");
    float* dw = grads.data() + w;
    if (!use_bf16) {
      cuda::LinearBackward<float>(x, params.data() + w, dy, n, in, out, dx, dw, acc_dx, false);
      return;
    }
    cuda::CastToBf16(x, xb.data(), static_cast<size_t>(n) * in);
    cuda::CastToBf16(dy, dyb.data(), static_cast<size_t>(n) * out);
    cuda::LinearBackward<cuda::bf16>(xb.data(), params_bf16.data() + w, dyb.data(), n, in, out, dx,
                                     dw, acc_dx, false);
  }

  void AttentionForward(int l, int n) {
    const Layer& ly = layers[l];
    Acts& a = la[l];
    const float* P = params.data();
    const float* cs = rope_cos.data();
    const float* sn = rope_sin.data();
    if (!mla) {
      Lin(a.ln1, ly.wq, n, d, qkv_dim, a.qkv);
      ProfileScope ps(profiler, "attention");
      if (qk_norm) {
        const int ld = qdim + kvdim;
        MOELAB_CUDA_CHECK(cudaMemcpy2DAsync(a.qk_raw, sizeof(float) * ld, a.qkv,
                                            sizeof(float) * qkv_dim, sizeof(float) * ld, n,
                                            cudaMemcpyDeviceToDevice, nullptr));
        cuda::RmsNormGroupsForward(a.qk_raw, ld, a.qkv, qkv_dim, n, H, hd, P + ly.q_norm,
                                   m.norm_eps, a.rstd_q);
        cuda::RmsNormGroupsForward(a.qk_raw + qdim, ld, a.qkv + qdim, qkv_dim, n, KVH, hd,
                                   P + ly.k_norm, m.norm_eps, a.rstd_k);
      }
      cuda::RopeApply(a.qkv, n, S, qkv_dim, H, hd, 0, hd, cs, sn, false);
      cuda::RopeApply(a.qkv + qdim, n, S, qkv_dim, KVH, hd, 0, hd, cs, sn, false);
      AttendForward(a, a.qkv, a.qkv + qdim, a.qkv + qdim + kvdim);
      return;
    }
    const float* qin = a.ln1;
    int qin_dim = d;
    if (rq > 0) {
      Lin(a.ln1, ly.q_a, n, d, rq, a.cq_raw);
      cuda::RmsNormForward(a.cq_raw, P + ly.q_a_norm, n, rq, m.norm_eps, a.cq, a.rstd_cq);
      qin = a.cq;
      qin_dim = rq;
    }
    Lin(qin, ly.q_b, n, qin_dim, H * dqk, a.qb);
    const int lda = rkv + dr, ldb = H * (dn + dvh), ldf = H * dqk;
    Lin(a.ln1, ly.kv_a, n, d, lda, a.kva);
    cuda::RmsNormGroupsForward(a.kva, lda, a.ckv, rkv, n, 1, rkv, P + ly.kv_a_norm, m.norm_eps,
                               a.rstd_kv);
    Lin(a.ckv, ly.kv_b, n, rkv, ldb, a.kvb);
    ProfileScope ps(profiler, "attention");
    cuda::RopeApply(a.kva + rkv, n, S, lda, 1, dr, 0, dr, cs, sn, false);
    // Per-head q = [q^C_h | q^R_h], k = [k^C_h | k^R (shared)].
    cudamodel::CopyHeads(a.qb, H * dqk, dn, 0, a.qf, ldf, dqk, 0, n, H, dn, false);
    cudamodel::CopyHeads(a.qb, H * dqk, dr, H * dn, a.qf, ldf, dqk, dn, n, H, dr, false);
    cudamodel::CopyHeads(a.kvb, ldb, dn, 0, a.kf, ldf, dqk, 0, n, H, dn, false);
    cudamodel::CopyHeads(a.kva, lda, 0, rkv, a.kf, ldf, dqk, dn, n, H, dr, false);
    cuda::RopeApply(a.qf, n, S, ldf, H, dqk, dn, dr, cs, sn, false);
    AttendForward(a, a.qf, a.kf, a.kvb + H * dn);
  }

  void AttentionBackward(int l, int n) {
    const Layer& ly = layers[l];
    Acts& a = la[l];
    const float* P = params.data();
    float* G = grads.data();
    const float* cs = rope_cos.data();
    const float* sn = rope_sin.data();
    if (!mla) {
      {
        ProfileScope ps(profiler, "attention");
        AttendBackward(a, a.qkv, a.qkv + qdim, a.qkv + qdim + kvdim, dqkv, dqkv + qdim,
                       dqkv + qdim + kvdim);
        cuda::RopeApply(dqkv, n, S, qkv_dim, H, hd, 0, hd, cs, sn, true);
        cuda::RopeApply(dqkv + qdim, n, S, qkv_dim, KVH, hd, 0, hd, cs, sn, true);
        if (qk_norm) {
          const int ld = qdim + kvdim;
          cuda::RmsNormGroupsBackward(a.qk_raw, ld, P + ly.q_norm, a.rstd_q, dqkv, qkv_dim, dqkv,
                                      qkv_dim, n, H, hd, G + ly.q_norm);
          cuda::RmsNormGroupsBackward(a.qk_raw + qdim, ld, P + ly.k_norm, a.rstd_k, dqkv + qdim,
                                      qkv_dim, dqkv + qdim, qkv_dim, n, KVH, hd, G + ly.k_norm);
        }
      }
      LinB(a.ln1, ly.wq, dqkv, n, d, qkv_dim, dln);
      return;
    }
    const int lda = rkv + dr, ldb = H * (dn + dvh), ldf = H * dqk;
    {
      ProfileScope ps(profiler, "attention");
      AttendBackward(a, a.qf, a.kf, a.kvb + H * dn, dqf, dkf, dkvb + H * dn);
      cuda::RopeApply(dqf, n, S, ldf, H, dqk, dn, dr, cs, sn, true);
      cudamodel::CopyHeads(dqf, ldf, dqk, 0, dqb, H * dqk, dn, 0, n, H, dn, false);
      cudamodel::CopyHeads(dqf, ldf, dqk, dn, dqb, H * dqk, dr, H * dn, n, H, dr, false);
      cudamodel::CopyHeads(dkf, ldf, dqk, 0, dkvb, ldb, dn, 0, n, H, dn, false);
      cudamodel::SumHeads(dkf, ldf, dqk, dn, dkva + rkv, lda, n, H, dr);
      cuda::RopeApply(dkva + rkv, n, S, lda, 1, dr, 0, dr, cs, sn, true);
    }
    LinB(a.ckv, ly.kv_b, dkvb, n, rkv, ldb, dcq);
    cuda::RmsNormGroupsBackward(a.kva, lda, P + ly.kv_a_norm, a.rstd_kv, dcq, rkv, dkva, lda, n, 1,
                                rkv, G + ly.kv_a_norm);
    LinB(a.ln1, ly.kv_a, dkva, n, d, lda, dln);
    if (rq > 0) {
      LinB(a.cq, ly.q_b, dqb, n, rq, H * dqk, dcq);
      cuda::RmsNormGroupsBackward(a.cq_raw, rq, P + ly.q_a_norm, a.rstd_cq, dcq, rq, dcq, rq, n, 1,
                                  rq, G + ly.q_a_norm);
      LinB(a.ln1, ly.q_a, dcq, n, d, rq, dln, /*acc_dx=*/true);
    } else {
      LinB(a.ln1, ly.q_b, dqb, n, d, H * dqk, dln, /*acc_dx=*/true);
    }
  }

  void FfnForward(const Layer& ly, Acts& a, int n, float* y) {
    if (!use_bf16) {
      ProfileScope ps(profiler, "ffn");
      const float* P = params.data();
      cuda::SwigluForward(a.ln2, n, d, F, P + ly.w1, P + ly.w3, P + ly.w2, a.h1, a.h3, a.act, y);
      return;
    }
    Lin(a.ln2, ly.w1, n, d, F, a.h1);
    Lin(a.ln2, ly.w3, n, d, F, a.h3);
    cuda::SwigluActivation(a.h1, a.h3, static_cast<size_t>(n) * F, a.act);
    Lin(a.act, ly.w2, n, F, d, y);
  }

  void FfnBackward(const Layer& ly, Acts& a, int n, const float* dy, float* dx) {
    if (!use_bf16) {
      ProfileScope ps(profiler, "ffn");
      const float* P = params.data();
      float* G = grads.data();
      cuda::SwigluBackward(a.ln2, n, d, F, P + ly.w1, P + ly.w3, P + ly.w2, a.h1, a.h3, a.act, dy,
                           dx, G + ly.w1, G + ly.w3, G + ly.w2, ffn_scratch);
      return;
    }
    const size_t nf = static_cast<size_t>(n) * F;
    float* dact = ffn_scratch;  // [n,F], then dh1 = dact in place, dh3 in the second half
    float* dh3 = ffn_scratch + nf;
    LinB(a.act, ly.w2, dy, n, F, d, dact);
    cuda::SwigluActivationBackward(a.h1, a.h3, dact, nf, dact, dh3);
    LinB(a.ln2, ly.w1, dact, n, d, F, dx);
    LinB(a.ln2, ly.w3, dh3, n, d, F, dx, /*acc_dx=*/true);
  }

  double Run(const int32_t* tokens, int batch, StepStats* stats, bool backward) {
    Reserve(batch);
    const int n = batch * S;
    dims.batch = batch;
    for (int b = 0; b < batch; ++b) {
      const int32_t* row = tokens + static_cast<long>(b) * (S + 1);
      for (int s = 0; s < S; ++s) {
        if (row[s] < 0 || row[s] >= V || row[s + 1] < 0 || row[s + 1] >= V)
          throw std::out_of_range("model: token id outside the vocabulary");
        host_inputs[static_cast<size_t>(b) * S + s] = row[s];
        host_targets[static_cast<size_t>(b) * S + s] = row[s + 1];
      }
    }
    MOELAB_CUDA_CHECK(
        cudaMemcpy(inputs.data(), host_inputs.data(), sizeof(int32_t) * n, cudaMemcpyHostToDevice));
    MOELAB_CUDA_CHECK(cudaMemcpy(targets.data(), host_targets.data(), sizeof(int32_t) * n,
                                 cudaMemcpyHostToDevice));
    if (stats) stats->expert_counts.assign(static_cast<size_t>(num_moe) * E, 0);
    float* P = params.data();
    const size_t nd = static_cast<size_t>(n) * d;
    {
      ProfileScope ps(profiler, "embedding");
      cuda::EmbeddingForward(P + embedding, inputs.data(), n, d, la[0].res);
    }
    double aux = 0;
    for (int l = 0; l < L; ++l) {
      const Layer& ly = layers[l];
      Acts& a = la[l];
      float* next = l + 1 < L ? la[l + 1].res : res_final;
      {
        ProfileScope ps(profiler, "norm");
        cuda::RmsNormForward(a.res, P + ly.attn_norm, n, d, m.norm_eps, a.ln1, a.rstd1);
      }
      AttentionForward(l, n);
      cuda::AttentionMaxOverBatch(pair_max, batch, H, head_max + static_cast<size_t>(l) * H);
      MOELAB_CUDA_CHECK(
          cudaMemcpyAsync(a.mid, a.res, sizeof(float) * nd, cudaMemcpyDeviceToDevice, nullptr));
      Lin(a.att, ly.wo, n, odim, d, a.mid, /*acc=*/true);
      {
        ProfileScope ps(profiler, "norm");
        cuda::RmsNormForward(a.mid, P + ly.ffn_norm, n, d, m.norm_eps, a.ln2, a.rstd2);
      }
      if (ly.moe_index < 0) {
        FfnForward(ly, a, n, dln);
      } else {
        ProfileScope ps(profiler, "moe");
        const int mi = ly.moe_index;
        int64_t* counts =
            stats ? stats->expert_counts.data() + static_cast<size_t>(mi) * E : nullptr;
        aux += moes[mi]->Forward(MoeParams(ly), a.ln2, n, dln, counts);
      }
      cudamodel::Add(a.mid, dln, next, nd);
    }
    {
      ProfileScope ps(profiler, "norm");
      cuda::RmsNormForward(res_final, P + final_norm, n, d, m.norm_eps, lnf, rstdf);
    }
    const size_t head = m.tie_embeddings ? embedding : lm_head;
    Lin(lnf, head, n, d, V, logits);
    cuda::CrossEntropyResult ce;
    {
      ProfileScope ps(profiler, "cross_entropy");
      ce = cuda::CrossEntropy(logits, targets.data(), n, V, m.z_loss, backward, row_scratch.data());
    }
    if (stats) {
      std::vector<float> hm(static_cast<size_t>(L) * H);
      MOELAB_CUDA_CHECK(
          cudaMemcpy(hm.data(), head_max, sizeof(float) * hm.size(), cudaMemcpyDeviceToHost));
      stats->max_logit_raw = hm;
      stats->max_logit.resize(hm.size());
      for (size_t i = 0; i < hm.size(); ++i) {
        const double raw = hm[i];
        stats->max_logit[i] = static_cast<float>(
            m.logit_softcap > 0 ? m.logit_softcap * std::tanh(raw / m.logit_softcap) : raw);
      }
      stats->loss = ce.loss;
      stats->aux_loss = aux;
      stats->z_loss = ce.z_loss;
    }
    if (backward) Backward(batch);
    return ce.loss + aux + ce.z_loss;
  }

  void Backward(int batch) {
    const int n = batch * S;
    float* P = params.data();
    float* G = grads.data();
    const size_t head = m.tie_embeddings ? embedding : lm_head;
    LinB(lnf, head, logits, n, d, V, dln);
    if (!m.tie_embeddings) {
      MOELAB_CUDA_CHECK(
          cudaMemsetAsync(G + embedding, 0, sizeof(float) * V * static_cast<size_t>(d), nullptr));
    }
    {
      ProfileScope ps(profiler, "norm");
      cuda::RmsNormBackward(res_final, P + final_norm, rstdf, dln, n, d, dres, G + final_norm,
                            false);
    }
    for (int l = L - 1; l >= 0; --l) {
      const Layer& ly = layers[l];
      Acts& a = la[l];
      if (ly.moe_index < 0) {
        FfnBackward(ly, a, n, dres, dln);
      } else {
        ProfileScope ps(profiler, "moe");
        cudamodel::MoeLayerGrads g{G + ly.router, G + ly.ew1, G + ly.ew3, G + ly.ew2};
        if (moe.shared_experts > 0) g.s1 = G + ly.sw1, g.s3 = G + ly.sw3, g.s2 = G + ly.sw2;
        moes[ly.moe_index]->Backward(MoeParams(ly), g, a.ln2, dres, dln);
      }
      {
        ProfileScope ps(profiler, "norm");
        cuda::RmsNormBackward(a.mid, P + ly.ffn_norm, a.rstd2, dln, n, d, dres, G + ly.ffn_norm,
                              true);
      }
      LinB(a.att, ly.wo, dres, n, odim, d, datt);
      AttentionBackward(l, n);
      {
        ProfileScope ps(profiler, "norm");
        cuda::RmsNormBackward(a.res, P + ly.attn_norm, a.rstd1, dln, n, d, dres, G + ly.attn_norm,
                              true);
      }
    }
    ProfileScope ps(profiler, "embedding");
    cuda::EmbeddingBackward(inputs.data(), dres, n, d, G + embedding, emb_scratch.data());
  }
};

CudaModel::CudaModel(const RunConfig& config) {
  RequireDevice(config.train);
  impl_ = std::make_unique<Impl>(config);
  impl_->use_bf16 = config.train.effective_precision() == "bf16";
  impl_->Setup();
}

CudaModel::~CudaModel() = default;

bool CudaModel::ForwardBackwardAvailable(std::string* why) {
  if (why) why->clear();
  return true;
}

void CudaModel::Init(uint64_t seed) {
  impl_->host.Init(seed);
  UploadParams(impl_->host.params());
  UploadRouterBias();
}

const std::vector<ParamInfo>& CudaModel::param_infos() const { return impl_->host.param_infos(); }
size_t CudaModel::num_params() const { return impl_->host.num_params(); }
bool CudaModel::bf16() const { return impl_->use_bf16; }
float* CudaModel::params() { return impl_->params.data(); }
float* CudaModel::grads() { return impl_->grads.data(); }

void CudaModel::DownloadParams(float* host) const {
  MOELAB_CUDA_CHECK(
      cudaMemcpy(host, impl_->params.data(), sizeof(float) * num_params(), cudaMemcpyDeviceToHost));
}

void CudaModel::UploadParams(const float* host) {
  MOELAB_CUDA_CHECK(
      cudaMemcpy(impl_->params.data(), host, sizeof(float) * num_params(), cudaMemcpyHostToDevice));
  ParamsChanged();
}

std::vector<float>& CudaModel::router_bias() { return impl_->host.router_bias(); }

void CudaModel::UploadRouterBias() {
  std::vector<float>& b = impl_->host.router_bias();
  if (!b.empty()) {
    MOELAB_CUDA_CHECK(
        cudaMemcpy(impl_->bias.data(), b.data(), sizeof(float) * b.size(), cudaMemcpyHostToDevice));
  }
}

int CudaModel::moe_layers() const { return impl_->num_moe; }

double CudaModel::ForwardBackward(const int32_t* tokens, int batch, StepStats* stats) {
  return impl_->Run(tokens, batch, stats, true);
}

double CudaModel::Forward(const int32_t* tokens, int batch, StepStats* stats) {
  return impl_->Run(tokens, batch, stats, false);
}

void CudaModel::UpdateRouterBias(const std::vector<int64_t>& counts, double rate) {
  Impl& I = *impl_;
  if (counts.size() < static_cast<size_t>(I.num_moe) * I.E)
    throw std::invalid_argument("UpdateRouterBias: counts has the wrong size");
  for (int mi = 0; mi < I.num_moe; ++mi)
    UpdateSelectionBias(router_bias().data() + static_cast<size_t>(mi) * I.E,
                        counts.data() + static_cast<size_t>(mi) * I.E, I.E, rate);
  UploadRouterBias();
}

void CudaModel::ParamsChanged() {
  Impl& I = *impl_;
  if (I.use_bf16) cuda::CastToBf16(I.params.data(), I.params_bf16.data(), I.params.size());
}

void CudaModel::set_profiler(CudaOpProfiler* profiler) { impl_->profiler = profiler; }

DeviceMemoryPlan PlanCudaMemory(const RunConfig& c, int micro_batch, int local_batch) {
  DeviceMemoryPlan plan;
  plan.micro_batch = micro_batch;
  const CudaShape s = CudaShape::Of(c);
  const double np = static_cast<double>(CountParams(c).total);
  plan.params = 4 * np + (s.use_bf16 ? 2 * np : 0);
  plan.grads = 4 * np + (micro_batch < local_batch ? 4 * np : 0);
  // Muon's Newton–Schulz: the same-shape bank plus one ping buffer of the largest bank (bounded
  // here by the bank itself), in the compute precision.
  const double ns_elem = s.use_bf16 ? 2 : 4;
  plan.optimizer = 4.0 * static_cast<double>(OptimizerStateElements(c)) +
                   2 * ns_elem * static_cast<double>(OptimizerWorkspaceElements(c));
  ActViews views;
  const size_t n = static_cast<size_t>(micro_batch) * s.S;
  double act = 4.0 * static_cast<double>(LayoutActivations(s, micro_batch, nullptr, &views));
  // The embedding backward's radix-sort scratch: cub sizes it through a device query, so the plan
  // (which needs no GPU) takes a bound: double-buffered int32 keys and values, plus 1 MiB.
  act += 8.0 * n + 8.0 * (2 * n + 2) + 16.0 * n + (1 << 20);
  if (s.use_bf16) act += 2.0 * n * (s.CastInWidth() + s.CastOutWidth());
  if (c.moe.enabled()) {
    act += static_cast<double>(s.num_moe) *
           static_cast<double>(cudamodel::DeviceMoe::Bytes(c.moe, s.d, n, s.use_bf16));
    act += static_cast<double>(cudamodel::MoeScratch::Bytes(c.moe, s.d, n, s.use_bf16));
  }
  plan.activations = act;
  plan.runtime = 1.0 * (1 << 30);
  return plan;
}

int LargestFittingMicroBatch(const RunConfig& c, int local_batch, double budget_bytes) {
  for (int m = local_batch; m >= 1; --m) {
    if (PlanCudaMemory(c, m, local_batch).total() <= budget_bytes) return m;
  }
  return 0;
}

void RequireCudaMemory(const RunConfig& c, int local_batch, bool print) {
  const int micro = c.train.micro_batch > 0 && c.train.micro_batch < local_batch
                        ? c.train.micro_batch
                        : local_batch;
  const DeviceMemoryPlan plan = PlanCudaMemory(c, micro, local_batch);
  size_t free_bytes = 0, total_bytes = 0;
  MOELAB_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  constexpr double kGiB = 1024.0 * 1024 * 1024;
  if (print) {
    fmt::print(stderr, "moelab train: device memory estimate: {} ({:.1f} GiB free of {:.1f})\n",
               plan.Describe(), free_bytes / kGiB, total_bytes / kGiB);
  }
  if (plan.total() <= static_cast<double>(free_bytes)) return;
  const int fits = LargestFittingMicroBatch(c, local_batch, static_cast<double>(free_bytes));
  throw DeviceError(fmt::format(
      "the run needs about {:.1f} GiB of device memory ({}) but {:.1f} GiB are free; {}",
      plan.total() / kGiB, plan.Describe(), free_bytes / kGiB,
      fits > 0 ? fmt::format("set train.micro_batch to {} or less (the largest that fits)", fits)
               : std::string("no micro-batch fits: use a smaller model or more GPUs")));
}

DeviceGradAccumulator::~DeviceGradAccumulator() {
  if (buf_) cudaFree(buf_);
}

void DeviceGradAccumulator::Add(const float* g, double w, bool first) {
  if (!buf_) MOELAB_CUDA_CHECK(cudaMalloc(&buf_, sizeof(float) * std::max<size_t>(n_, 1)));
  cudamodel::Axpy(g, static_cast<float>(w), first, buf_, n_);
  MOELAB_CUDA_CHECK(cudaGetLastError());
}

void DeviceGradAccumulator::Finish(float* g, double w) {
  cudamodel::FinishAxpy(buf_, static_cast<float>(w), g, n_);
  MOELAB_CUDA_CHECK(cudaGetLastError());
}

#else  // no CUDA in this build: every entry point reports that.

struct CudaModel::Impl {};

CudaModel::CudaModel(const RunConfig& config) {
  RequireDevice(config.train);
  throw std::runtime_error("this moelab was built without CUDA");
}
CudaModel::~CudaModel() = default;
bool CudaModel::ForwardBackwardAvailable(std::string* why) {
  if (why) *why = "this moelab was built without CUDA";
  return false;
}
void CudaModel::Init(uint64_t) {}
const std::vector<ParamInfo>& CudaModel::param_infos() const {
  static const std::vector<ParamInfo> none;
  return none;
}
size_t CudaModel::num_params() const { return 0; }
bool CudaModel::bf16() const { return false; }
float* CudaModel::params() { return nullptr; }
float* CudaModel::grads() { return nullptr; }
void CudaModel::DownloadParams(float*) const {}
void CudaModel::UploadParams(const float*) {}
std::vector<float>& CudaModel::router_bias() {
  static std::vector<float> none;
  return none;
}
void CudaModel::UploadRouterBias() {}
int CudaModel::moe_layers() const { return 0; }
double CudaModel::ForwardBackward(const int32_t*, int, StepStats*) {
  throw std::runtime_error("this moelab was built without CUDA");
}
double CudaModel::Forward(const int32_t*, int, StepStats*) {
  throw std::runtime_error("this moelab was built without CUDA");
}
void CudaModel::UpdateRouterBias(const std::vector<int64_t>&, double) {}
void CudaModel::ParamsChanged() {}
void CudaModel::set_profiler(CudaOpProfiler*) {}

DeviceMemoryPlan PlanCudaMemory(const RunConfig&, int, int) {
  throw std::runtime_error("this moelab was built without CUDA");
}
int LargestFittingMicroBatch(const RunConfig&, int, double) {
  throw std::runtime_error("this moelab was built without CUDA");
}

void RequireCudaMemory(const RunConfig&, int, bool) {
  throw DeviceError("this moelab was built without CUDA");
}
DeviceGradAccumulator::~DeviceGradAccumulator() = default;
void DeviceGradAccumulator::Add(const float*, double, bool) {
  throw std::runtime_error("this moelab was built without CUDA");
}
void DeviceGradAccumulator::Finish(float*, double) {
  throw std::runtime_error("this moelab was built without CUDA");
}

#endif

std::string DeviceMemoryPlan::Describe() const {
  constexpr double kGiB = 1024.0 * 1024 * 1024;
  return fmt::format(
      "params {:.2f} GiB, grads {:.2f} GiB, optimizer {:.2f} GiB, activations {:.2f} GiB "
      "(micro-batch {}), runtime {:.2f} GiB: total {:.2f} GiB",
      params / kGiB, grads / kGiB, optimizer / kGiB, activations / kGiB, micro_batch,
      runtime / kGiB, total() / kGiB);
}

}  // namespace moelab
