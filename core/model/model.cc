// The transformer, llm.c style: one parameter arena, one gradient arena with the same layout, one
// activation arena sized for the largest batch seen, and a forward pass followed by an explicit
// reverse walk over the layers. See docs/model.md for the parameter layout and conventions.
#include "core/model/model.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <new>
#include <stdexcept>
#include <tuple>

#include "core/data/random.h"
#include "core/model/attention_dims.h"
#include "core/model/moe.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/cross_entropy.h"
#include "kernels/cpu/embedding.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/norm.h"
#include "kernels/cpu/rope.h"
#include "kernels/cpu/swiglu.h"

namespace moelab {

namespace {

// Every tensor (and activation buffer) starts on a 64-byte boundary so AVX-512 loads of a row
// start aligned; sizes are padded up to a multiple of this many bytes.
constexpr size_t kAlignBytes = 64;

template <typename T>
size_t PadCount(size_t n) {
  const size_t per = kAlignBytes / sizeof(T);
  return (n + per - 1) / per * per;
}

// A zero-initialised, 64-byte aligned array; reallocated only by Resize.
template <typename T>
class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
  ~AlignedBuffer() { std::free(data_); }
  void Resize(size_t n) {
    std::free(data_);
    data_ = nullptr;
    size_ = n;
    if (n == 0) return;
    data_ = static_cast<T*>(std::aligned_alloc(kAlignBytes, PadCount<T>(n) * sizeof(T)));
    if (!data_) throw std::bad_alloc();
    std::memset(data_, 0, PadCount<T>(n) * sizeof(T));
  }
  T* data() { return data_; }
  const T* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  T* data_ = nullptr;
  size_t size_ = 0;
};

uint64_t HashName(const std::string& s) {  // FNV-1a
  uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ULL;
  return h;
}

// Uniform in (0, 1]: never 0, so log() in Box–Muller is finite.
double UnitOpenZero(uint64_t bits) { return (static_cast<double>(bits >> 11) + 1.0) * 0x1.0p-53; }

// Standard normals 2·pair and 2·pair+1 of the stream `key` (one Box–Muller draw): a
// counter-based generator, so every tensor's values depend only on (seed, tensor name, element
// index) — not on thread count, tensor order or which other tensors exist (tied and untied
// models share their embedding init).
void NormalPair(uint64_t key, uint64_t pair, double* z0, double* z1) {
  const double u1 = UnitOpenZero(data::SplitMix64(key ^ data::SplitMix64(2 * pair)));
  const double u2 = UnitOpenZero(data::SplitMix64(key ^ data::SplitMix64(2 * pair + 1)));
  const double r = std::sqrt(-2.0 * std::log(u1));
  const double a = 6.283185307179586476925 * u2;
  *z0 = r * std::cos(a);
  *z1 = r * std::sin(a);
}

}  // namespace

template <typename T>
struct Model<T>::Impl {
  // Offsets of one layer's tensors in the arenas.
  struct Layer {
    size_t attn_norm = 0, wo = 0, ffn_norm = 0;
    size_t wq = 0, wk = 0, wv = 0;  // MHA/GQA: adjacent, one fused [qdim + 2·kvdim, d] GEMM
    size_t q_norm = 0, k_norm = 0;  // QK-norm gains [head_dim]
    // MLA: q_b_nope|q_b_rope, kv_a|k_rope and kv_b_k|kv_b_v are adjacent pairs (fused GEMMs).
    size_t q_a = 0, q_a_norm = 0, q_b = 0, kv_a = 0, kv_a_norm = 0, kv_b = 0;
    size_t w1 = 0, w3 = 0, w2 = 0;                 // dense FFN
    size_t router = 0, ew1 = 0, ew3 = 0, ew2 = 0;  // MoE routed experts
    size_t sw1 = 0, sw3 = 0, sw2 = 0;              // MoE shared experts
    int moe_index = -1;                            // -1: dense layer
  };
  // Saved activations of one layer (pointers into the activation arena).
  struct LayerActs {
    T* res = nullptr;    // [n,d] layer input (residual stream)
    T* ln1 = nullptr;    // [n,d]
    T* rstd1 = nullptr;  // [n]
    // MHA/GQA
    T* qkv = nullptr;     // [n, qdim + 2·kvdim] q | k | v, q and k after (QK-norm and) RoPE
    T* qk_raw = nullptr;  // [n, qdim + kvdim] q | k before QK-norm
    T* rstd_q = nullptr;  // [n·H]
    T* rstd_k = nullptr;  // [n·KVH]
    // MLA
    T* cq_raw = nullptr;   // [n, rq] x̂·W_q_aᵀ
    T* cq = nullptr;       // [n, rq] normalised query latent
    T* rstd_cq = nullptr;  // [n]
    T* qb = nullptr;       // [n, H·dn + H·dr] per-head q^C | q^R (before RoPE)
    T* kva = nullptr;      // [n, rkv + dr] kv latent | shared rotary key (after RoPE)
    T* ckv = nullptr;      // [n, rkv] normalised kv latent
    T* rstd_kv = nullptr;  // [n]
    T* kvb = nullptr;      // [n, H·dn + H·dv] per-head k^C | v
    T* qf = nullptr;       // [n, H·(dn+dr)] assembled per-head queries
    T* kf = nullptr;       // [n, H·(dn+dr)] assembled per-head keys
    // Both
    T* probs = nullptr;   // [B,H,S,S]
    T* capped = nullptr;  // [B,H,S,S] tanh(raw/cap) when soft-capping
    T* att = nullptr;     // [n, odim] attention output before wo
    T* mid = nullptr;     // [n,d] residual after attention
    T* ln2 = nullptr;     // [n,d]
    T* rstd2 = nullptr;   // [n]
    T* h1 = nullptr;      // [n,F] dense SwiGLU
    T* h3 = nullptr;
    T* act = nullptr;
  };

  // allocate false: the layout only (FullLayout).
  Impl(const RunConfig& config, ExpertShard shard, bool allocate);
  size_t AddParam(const std::string& name, ParamKind kind, int layer, int batch, int rows, int cols,
                  bool align = true);
  void Reserve(int batch);
  double Run(const int32_t* tokens, int batch, StepStats* stats, bool backward);
  void Backward(int batch);
  // x̂ = la[l].ln1 -> la[l].att; pair_max filled.
  void AttentionForward(int l, int n);
  // datt -> dln (= dx̂, overwritten); the layer's attention grads written.
  void AttentionBackward(int l, int n);
  MoeWeights<T> Moe(T* base, const Layer& l) const {
    return {base + l.router,
            base + l.ew1,
            base + l.ew3,
            base + l.ew2,
            moe.shared_experts > 0 ? base + l.sw1 : nullptr,
            moe.shared_experts > 0 ? base + l.sw3 : nullptr,
            moe.shared_experts > 0 ? base + l.sw2 : nullptr};
  }

  RunConfig cfg;
  ModelConfig m;
  MoEConfig moe;
  bool mla = false, qk_norm = false;
  int d, L, H, KVH, hd, qdim, kvdim, qkv_dim, F, V, S, E = 0, EH = 0, num_moe = 0;
  int expert_first = 0, expert_count = 0;                 // the routed experts held (ExpertShard)
  int rq = 0, rkv = 0, dn = 0, dr = 0, dvh = 0, dqk = 0;  // MLA dims
  int odim = 0;                                           // attention output width (wo's input)
  int rot_dim = 0;                                        // RoPE dims per head

  std::vector<ParamInfo> infos;
  size_t arena = 0;
  size_t embedding = 0, final_norm = 0, lm_head = 0;
  std::vector<Layer> layers;
  std::vector<size_t> layer_begin;  // arena offset of each layer's first tensor
  GradReadyHook grad_ready;
  AlignedBuffer<T> params, grads;
  std::vector<T> router_bias;
  std::vector<std::unique_ptr<MoeLayer<T>>> moe_layers;
  std::vector<T> rope_cos, rope_sin;

  // Activation arena, sized for cap_batch sequences and cap_threads OpenMP threads.
  int cap_batch = 0, cap_threads = 0;
  AlignedBuffer<T> acts;
  std::vector<LayerActs> la;
  T* res_final = nullptr;    // [n,d]
  T* lnf = nullptr;          // [n,d]
  T* rstdf = nullptr;        // [n]
  T* logits = nullptr;       // [n,V], becomes dlogits
  T* dres = nullptr;         // [n,d] gradient of the residual stream
  T* dln = nullptr;          // [n,d] gradient of a norm output / FFN output scratch
  T* datt = nullptr;         // [n, odim]
  T* dqkv = nullptr;         // MHA: [n, qkv_dim]
  T* dqf = nullptr;          // MLA: [n, H·dqk]
  T* dkf = nullptr;          // MLA: [n, H·dqk]
  T* dqb = nullptr;          // MLA: [n, H·(dn+dr)]
  T* dkva = nullptr;         // MLA: [n, rkv + dr]
  T* dkvb = nullptr;         // MLA: [n, H·(dn+dv)]
  T* dcq = nullptr;          // MLA: [n, max(rq, rkv)]
  T* ffn_scratch = nullptr;  // [n, 2F]
  T* att_scratch = nullptr;  // AttentionScratchSize
  T* pair_max = nullptr;     // [B·H]
  std::vector<int32_t> inputs, targets;
  std::vector<double> row_scratch;
  std::vector<int64_t> counts_scratch;
  cpu::AttentionDims dims;
};

template <typename T>
size_t Model<T>::Impl::AddParam(const std::string& name, ParamKind kind, int layer, int batch,
                                int rows, int cols, bool align) {
  if (align) arena = PadCount<T>(arena);
  ParamInfo p;
  p.name = name;
  p.kind = kind;
  p.layer = layer;
  p.offset = arena;
  p.batch = batch;
  p.rows = rows;
  p.cols = cols;
  arena += p.size();
  infos.push_back(p);
  return p.offset;
}

template <typename T>
Model<T>::Impl::Impl(const RunConfig& config, ExpertShard shard, bool allocate)
    : cfg(config), m(config.model), moe(config.moe) {
  d = m.d_model;
  L = m.layers;
  H = m.heads;
  KVH = m.kv_heads_effective();
  hd = m.head_dim_effective();
  mla = m.attention == "mla";
  qk_norm = m.qk_norm;
  if (m.attention != "mha" && !mla)
    throw std::invalid_argument("model.attention: '" + m.attention + "' is not mha or mla");
  if (mla && qk_norm)
    throw std::invalid_argument("model.qk_norm: QK-norm cannot be combined with MLA");
  if (H <= 0 || KVH <= 0 || H % KVH != 0)
    throw std::invalid_argument("model.kv_heads: must divide heads");
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
    if (dr % 2 != 0) throw std::invalid_argument("model.qk_rope_head_dim: must be even");
    KVH = H;  // every head has its own k^C and v
    odim = H * dvh;
    rot_dim = dr;
  } else {
    if (hd % 2 != 0) throw std::invalid_argument("model.head_dim: must be even for RoPE");
    qdim = H * hd;
    kvdim = KVH * hd;
    qkv_dim = qdim + 2 * kvdim;
    odim = qdim;
    rot_dim = hd;
  }
  if (moe.enabled()) {
    E = moe.experts_total;
    EH = moe.expert_hidden;
    num_moe = MoeLayers(m, moe);
    expert_first = shard.first;
    expert_count = shard.count < 0 ? E : shard.count;
    if (expert_first < 0 || expert_count < 1 || expert_first + expert_count > E) {
      throw std::invalid_argument("model: expert shard outside moe.experts_total");
    }
  } else if (shard.count >= 0) {
    throw std::invalid_argument("model: an expert shard needs an MoE model");
  }

  embedding = AddParam("embedding", ParamKind::kEmbedding, -1, 1, V, d);
  layers.resize(L);
  int mi = 0;
  for (int l = 0; l < L; ++l) {
    Layer& ly = layers[l];
    const std::string p = "layers." + std::to_string(l) + ".";
    ly.attn_norm = AddParam(p + "attn_norm", ParamKind::kNorm, l, 1, 1, d);
    layer_begin.push_back(ly.attn_norm);
    if (mla) {
      const int qin = rq > 0 ? rq : d;
      if (rq > 0) {
        ly.q_a = AddParam(p + "attn.q_a", ParamKind::kMla, l, 1, rq, d);
        ly.q_a_norm = AddParam(p + "attn.q_a_norm", ParamKind::kNorm, l, 1, 1, rq);
      }
      // Rows h·dn..(h+1)·dn of q_b_nope are head h's q^C; rows h·dr.. of q_b_rope its q^R.
      ly.q_b = AddParam(p + "attn.q_b_nope", ParamKind::kMla, l, 1, H * dn, qin);
      AddParam(p + "attn.q_b_rope", ParamKind::kMla, l, 1, H * dr, qin, false);
      // kv_a: the kv latent; k_rope: the single rotary key shared by all heads.
      ly.kv_a = AddParam(p + "attn.kv_a", ParamKind::kMla, l, 1, rkv, d);
      AddParam(p + "attn.k_rope", ParamKind::kMla, l, 1, dr, d, false);
      ly.kv_a_norm = AddParam(p + "attn.kv_a_norm", ParamKind::kNorm, l, 1, 1, rkv);
      // Rows h·dn.. of kv_b_k are head h's k^C; rows h·dv.. of kv_b_v its value projection.
      ly.kv_b = AddParam(p + "attn.kv_b_k", ParamKind::kMla, l, 1, H * dn, rkv);
      AddParam(p + "attn.kv_b_v", ParamKind::kMla, l, 1, H * dvh, rkv, false);
    } else {
      // wq, wk, wv are adjacent (no padding between them) so one GEMM with the stacked
      // [qdim + 2·kvdim, d] matrix computes all three projections.
      ly.wq = AddParam(p + "attn.wq", ParamKind::kAttnQ, l, 1, qdim, d);
      ly.wk = AddParam(p + "attn.wk", ParamKind::kAttnK, l, 1, kvdim, d, false);
      ly.wv = AddParam(p + "attn.wv", ParamKind::kAttnV, l, 1, kvdim, d, false);
      if (qk_norm) {
        ly.q_norm = AddParam(p + "attn.q_norm", ParamKind::kNorm, l, 1, 1, hd);
        ly.k_norm = AddParam(p + "attn.k_norm", ParamKind::kNorm, l, 1, 1, hd);
      }
    }
    ly.wo = AddParam(p + "attn.wo", ParamKind::kAttnO, l, 1, d, odim);
    ly.ffn_norm = AddParam(p + "ffn_norm", ParamKind::kNorm, l, 1, 1, d);
    if (moe.enabled() && l >= moe.dense_layers) {
      ly.moe_index = mi++;
      ly.router = AddParam(p + "moe.router", ParamKind::kRouter, l, 1, E, d);
      // The held experts only (all unless sharded).
      const std::tuple<size_t*, const char*, int, int> expert_tensors[] = {
          {&ly.ew1, "w1", EH, d}, {&ly.ew3, "w3", EH, d}, {&ly.ew2, "w2", d, EH}};
      for (auto [off, name, rows, cols] : expert_tensors) {
        *off = AddParam(p + "moe.experts." + name, ParamKind::kExpert, l, expert_count, rows, cols);
        if (expert_count != E) {
          infos.back().batch_first = expert_first;
          infos.back().batch_total = E;
        }
      }
      const int sh = moe.shared_experts;
      if (sh > 0) {
        ly.sw1 = AddParam(p + "moe.shared.w1", ParamKind::kSharedExpert, l, sh, EH, d);
        ly.sw3 = AddParam(p + "moe.shared.w3", ParamKind::kSharedExpert, l, sh, EH, d);
        ly.sw2 = AddParam(p + "moe.shared.w2", ParamKind::kSharedExpert, l, sh, d, EH);
      }
    } else {
      ly.w1 = AddParam(p + "ffn.w1", ParamKind::kFfn, l, 1, F, d);
      ly.w3 = AddParam(p + "ffn.w3", ParamKind::kFfn, l, 1, F, d);
      ly.w2 = AddParam(p + "ffn.w2", ParamKind::kFfn, l, 1, d, F);
    }
  }
  final_norm = AddParam("final_norm", ParamKind::kNorm, -1, 1, 1, d);
  if (!m.tie_embeddings) lm_head = AddParam("lm_head", ParamKind::kLmHead, -1, 1, V, d);
  arena = PadCount<T>(arena);
  if (!allocate) return;
  params.Resize(arena);
  grads.Resize(arena);
  router_bias.assign(static_cast<size_t>(num_moe) * E, T(0));
  for (int i = 0; i < num_moe; ++i) {
    moe_layers.push_back(std::make_unique<MoeLayer<T>>(m, moe));
    if (expert_count != E) moe_layers.back()->SetExpertShard(expert_first, expert_count);
  }
  rope_cos.resize(static_cast<size_t>(S) * rot_dim / 2);
  rope_sin.resize(static_cast<size_t>(S) * rot_dim / 2);
  cpu::RopeTables<T>(S, rot_dim, m.rope_theta, rope_cos.data(), rope_sin.data());

  dims = AttentionDimsOf(m);
}

template <typename T>
void Model<T>::Impl::Reserve(int batch) {
  const int threads = omp_get_max_threads();
  if (batch <= cap_batch && threads <= cap_threads) return;
  cap_batch = std::max(batch, cap_batch);
  cap_threads = std::max(threads, cap_threads);
  const size_t n = static_cast<size_t>(cap_batch) * S;
  const size_t att = static_cast<size_t>(cap_batch) * H * S * S;
  dims.batch = cap_batch;
  // Two passes over the same carve-up: first count, then point.
  size_t total = 0;
  T* base = nullptr;
  auto take = [&](size_t count) -> T* {
    if (count == 0) return nullptr;
    T* p = base ? base + total : nullptr;
    total += PadCount<T>(count);
    return p;
  };
  la.assign(L, LayerActs{});
  for (int pass = 0; pass < 2; ++pass) {
    total = 0;
    for (int l = 0; l < L; ++l) {
      LayerActs& a = la[l];
      a.res = take(n * d);
      a.ln1 = take(n * d);
      a.rstd1 = take(n);
      if (mla) {
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
        if (qk_norm) {
          a.qk_raw = take(n * (qdim + kvdim));
          a.rstd_q = take(n * H);
          a.rstd_k = take(n * KVH);
        }
      }
      a.probs = take(att);
      a.capped = m.logit_softcap > 0 ? take(att) : nullptr;
      a.att = take(n * odim);
      a.mid = take(n * d);
      a.ln2 = take(n * d);
      a.rstd2 = take(n);
      if (layers[l].moe_index < 0) {
        a.h1 = take(n * F);
        a.h3 = take(n * F);
        a.act = take(n * F);
      }
    }
    res_final = take(n * d);
    lnf = take(n * d);
    rstdf = take(n);
    logits = take(n * V);
    dres = take(n * d);
    dln = take(n * d);
    datt = take(n * odim);
    if (mla) {
      dqf = take(n * H * dqk);
      dkf = take(n * H * dqk);
      dqb = take(n * H * dqk);
      dkva = take(n * (rkv + dr));
      dkvb = take(n * H * (dn + dvh));
      dcq = take(n * std::max(rq, rkv));
    } else {
      dqkv = take(n * qkv_dim);
    }
    ffn_scratch = take(n * 2 * F);
    att_scratch = take(cpu::AttentionScratchSize(dims, cap_threads));
    pair_max = take(static_cast<size_t>(cap_batch) * H);
    if (pass == 0) {
      acts.Resize(total);
      base = acts.data();
    }
  }
  inputs.resize(n);
  targets.resize(n);
  row_scratch.resize(2 * n);
  counts_scratch.resize(static_cast<size_t>(std::max(1, E)));
}

template <typename T>
void Model<T>::Impl::AttentionForward(int l, int n) {
  const Layer& ly = layers[l];
  LayerActs& a = la[l];
  const T* P = params.data();
  const T* cs = rope_cos.data();
  const T* sn = rope_sin.data();
  if (!mla) {
    // q | k | v = x̂·[wq; wk; wv]ᵀ in one GEMM, then (QK-norm and) RoPE on q and k in place.
    cpu::LinearForward(a.ln1, P + ly.wq, n, d, qkv_dim, a.qkv);
    if (qk_norm) {
      const int ld = qdim + kvdim;
      for (int r = 0; r < n; ++r)
        std::memcpy(a.qk_raw + static_cast<long>(r) * ld, a.qkv + static_cast<long>(r) * qkv_dim,
                    sizeof(T) * ld);
      cpu::RmsNormGroupsForward(a.qk_raw, ld, a.qkv, qkv_dim, n, H, hd, P + ly.q_norm, m.norm_eps,
                                a.rstd_q);
      cpu::RmsNormGroupsForward(a.qk_raw + qdim, ld, a.qkv + qdim, qkv_dim, n, KVH, hd,
                                P + ly.k_norm, m.norm_eps, a.rstd_k);
    }
    cpu::RopeApply(a.qkv, n, S, qkv_dim, H, hd, 0, hd, cs, sn, false);
    cpu::RopeApply(a.qkv + qdim, n, S, qkv_dim, KVH, hd, 0, hd, cs, sn, false);
    cpu::AttentionForward(dims, a.qkv, a.qkv + qdim, a.qkv + qdim + kvdim, a.probs, a.capped, a.att,
                          pair_max);
    return;
  }
  // MLA. Queries: [q^C | q^R] = c_q·[q_b_nope; q_b_rope]ᵀ with c_q = RMSNorm(x̂·q_aᵀ) (or x̂).
  const T* qin = a.ln1;
  int qin_dim = d;
  if (rq > 0) {
    cpu::LinearForward(a.ln1, P + ly.q_a, n, d, rq, a.cq_raw);
    cpu::RmsNormForward(a.cq_raw, P + ly.q_a_norm, n, rq, m.norm_eps, a.cq, a.rstd_cq);
    qin = a.cq;
    qin_dim = rq;
  }
  cpu::LinearForward(qin, P + ly.q_b, n, qin_dim, H * dqk, a.qb);
  // Keys/values: [c_kv_raw | k^R] = x̂·[kv_a; k_rope]ᵀ; c_kv = RMSNorm(c_kv_raw);
  // [k^C | v] = c_kv·[kv_b_k; kv_b_v]ᵀ.
  const int lda = rkv + dr, ldb = H * (dn + dvh);
  cpu::LinearForward(a.ln1, P + ly.kv_a, n, d, lda, a.kva);
  cpu::RmsNormGroupsForward(a.kva, lda, a.ckv, rkv, n, 1, rkv, P + ly.kv_a_norm, m.norm_eps,
                            a.rstd_kv);
  cpu::LinearForward(a.ckv, P + ly.kv_b, n, rkv, ldb, a.kvb);
  // RoPE on the shared key (once) and on every head's q^R, then assemble per-head q and k.
  cpu::RopeApply(a.kva + rkv, n, S, lda, 1, dr, 0, dr, cs, sn, false);
  const int ldf = H * dqk;
  const bool par = static_cast<long>(n) * ldf > 65536;
#pragma omp parallel for schedule(static) if (par)
  for (int r = 0; r < n; ++r) {
    const T* qb = a.qb + static_cast<long>(r) * H * dqk;
    const T* kvb = a.kvb + static_cast<long>(r) * ldb;
    const T* kr = a.kva + static_cast<long>(r) * lda + rkv;
    T* qf = a.qf + static_cast<long>(r) * ldf;
    T* kf = a.kf + static_cast<long>(r) * ldf;
    for (int h = 0; h < H; ++h) {
      std::memcpy(qf + h * dqk, qb + h * dn, sizeof(T) * dn);
      std::memcpy(qf + h * dqk + dn, qb + H * dn + h * dr, sizeof(T) * dr);
      std::memcpy(kf + h * dqk, kvb + h * dn, sizeof(T) * dn);
      std::memcpy(kf + h * dqk + dn, kr, sizeof(T) * dr);
    }
  }
  cpu::RopeApply(a.qf, n, S, ldf, H, dqk, dn, dr, cs, sn, false);
  cpu::AttentionForward(dims, a.qf, a.kf, a.kvb + H * dn, a.probs, a.capped, a.att, pair_max);
}

template <typename T>
void Model<T>::Impl::AttentionBackward(int l, int n) {
  const Layer& ly = layers[l];
  LayerActs& a = la[l];
  const T* P = params.data();
  T* G = grads.data();
  const T* cs = rope_cos.data();
  const T* sn = rope_sin.data();
  if (!mla) {
    cpu::AttentionBackward(dims, a.qkv, a.qkv + qdim, a.qkv + qdim + kvdim, a.probs, a.capped, datt,
                           dqkv, dqkv + qdim, dqkv + qdim + kvdim, att_scratch);
    cpu::RopeApply(dqkv, n, S, qkv_dim, H, hd, 0, hd, cs, sn, true);
    cpu::RopeApply(dqkv + qdim, n, S, qkv_dim, KVH, hd, 0, hd, cs, sn, true);
    if (qk_norm) {
      const int ld = qdim + kvdim;
      cpu::RmsNormGroupsBackward(a.qk_raw, ld, P + ly.q_norm, a.rstd_q, dqkv, qkv_dim, dqkv,
                                 qkv_dim, n, H, hd, G + ly.q_norm);
      cpu::RmsNormGroupsBackward(a.qk_raw + qdim, ld, P + ly.k_norm, a.rstd_k, dqkv + qdim, qkv_dim,
                                 dqkv + qdim, qkv_dim, n, KVH, hd, G + ly.k_norm);
    }
    cpu::LinearBackward(a.ln1, P + ly.wq, dqkv, n, d, qkv_dim, dln, G + ly.wq);
    return;
  }
  const int lda = rkv + dr, ldb = H * (dn + dvh), ldf = H * dqk;
  // dv lands directly in the v columns of dkvb.
  cpu::AttentionBackward(dims, a.qf, a.kf, a.kvb + H * dn, a.probs, a.capped, datt, dqf, dkf,
                         dkvb + H * dn, att_scratch);
  cpu::RopeApply(dqf, n, S, ldf, H, dqk, dn, dr, cs, sn, true);
  // Scatter per-head gradients back to the projection layouts; the shared rotary key sums its
  // heads' gradients in head order (then RoPE⁻¹ once).
  const bool par = static_cast<long>(n) * ldf > 65536;
#pragma omp parallel for schedule(static) if (par)
  for (int r = 0; r < n; ++r) {
    const T* qf = dqf + static_cast<long>(r) * ldf;
    const T* kf = dkf + static_cast<long>(r) * ldf;
    T* qb = dqb + static_cast<long>(r) * H * dqk;
    T* kvb = dkvb + static_cast<long>(r) * ldb;
    T* kr = dkva + static_cast<long>(r) * lda + rkv;
    for (int j = 0; j < dr; ++j) kr[j] = 0;
    for (int h = 0; h < H; ++h) {
      std::memcpy(qb + h * dn, qf + h * dqk, sizeof(T) * dn);
      std::memcpy(qb + H * dn + h * dr, qf + h * dqk + dn, sizeof(T) * dr);
      std::memcpy(kvb + h * dn, kf + h * dqk, sizeof(T) * dn);
      for (int j = 0; j < dr; ++j) kr[j] += kf[h * dqk + dn + j];
    }
  }
  cpu::RopeApply(dkva + rkv, n, S, lda, 1, dr, 0, dr, cs, sn, true);
  // kv path: dc_kv, then through the latent norm into the first rkv columns of dkva.
  cpu::LinearBackward(a.ckv, P + ly.kv_b, dkvb, n, rkv, ldb, dcq, G + ly.kv_b);
  cpu::RmsNormGroupsBackward(a.kva, lda, P + ly.kv_a_norm, a.rstd_kv, dcq, rkv, dkva, lda, n, 1,
                             rkv, G + ly.kv_a_norm);
  cpu::LinearBackward(a.ln1, P + ly.kv_a, dkva, n, d, lda, dln, G + ly.kv_a);
  // q path, accumulating into dx̂.
  if (rq > 0) {
    cpu::LinearBackward(a.cq, P + ly.q_b, dqb, n, rq, H * dqk, dcq, G + ly.q_b);
    cpu::RmsNormGroupsBackward(a.cq_raw, rq, P + ly.q_a_norm, a.rstd_cq, dcq, rq, dcq, rq, n, 1, rq,
                               G + ly.q_a_norm);
    cpu::LinearBackward(a.ln1, P + ly.q_a, dcq, n, d, rq, dln, G + ly.q_a, /*accumulate_dx=*/true);
  } else {
    cpu::LinearBackward(a.ln1, P + ly.q_b, dqb, n, d, H * dqk, dln, G + ly.q_b,
                        /*accumulate_dx=*/true);
  }
}

template <typename T>
double Model<T>::Impl::Run(const int32_t* tokens, int batch, StepStats* stats, bool backward) {
  Reserve(batch);
  const int n = batch * S;
  dims.batch = batch;
  for (int b = 0; b < batch; ++b) {
    const int32_t* row = tokens + static_cast<long>(b) * (S + 1);
    for (int s = 0; s < S; ++s) {
      if (row[s] < 0 || row[s] >= V || row[s + 1] < 0 || row[s + 1] >= V)
        throw std::out_of_range("model: token id outside the vocabulary");
      inputs[static_cast<size_t>(b) * S + s] = row[s];
      targets[static_cast<size_t>(b) * S + s] = row[s + 1];
    }
  }
  if (stats) {
    stats->max_logit.assign(static_cast<size_t>(L) * H, 0.0f);
    stats->max_logit_raw.assign(static_cast<size_t>(L) * H, 0.0f);
    stats->expert_counts.assign(static_cast<size_t>(num_moe) * E, 0);
  }
  T* P = params.data();
  const long nd = static_cast<long>(n) * d;

  cpu::EmbeddingForward(P + embedding, inputs.data(), n, d, la[0].res);
  double aux = 0;
  for (int l = 0; l < L; ++l) {
    const Layer& ly = layers[l];
    LayerActs& a = la[l];
    T* next = l + 1 < L ? la[l + 1].res : res_final;
    // Attention block: mid = res + wo·Attn(RMSNorm(res)).
    cpu::RmsNormForward(a.res, P + ly.attn_norm, n, d, m.norm_eps, a.ln1, a.rstd1);
    AttentionForward(l, n);
    if (stats) {
      for (int h = 0; h < H; ++h) {
        T mx = -std::numeric_limits<T>::infinity();
        for (int b = 0; b < batch; ++b) mx = std::max(mx, pair_max[b * H + h]);
        const double raw = static_cast<double>(mx);
        stats->max_logit_raw[static_cast<size_t>(l) * H + h] = static_cast<float>(raw);
        stats->max_logit[static_cast<size_t>(l) * H + h] = static_cast<float>(
            m.logit_softcap > 0 ? m.logit_softcap * std::tanh(raw / m.logit_softcap) : raw);
      }
    }
    // mid = res, then the output projection accumulates onto it (the residual add for free).
#pragma omp parallel for simd schedule(static) if (nd > 65536)
    for (long i = 0; i < nd; ++i) a.mid[i] = a.res[i];
    cpu::LinearForward(a.att, P + ly.wo, n, odim, d, a.mid, /*accumulate=*/true);
    // FFN block: next = mid + FFN(RMSNorm(mid)); the FFN output goes through dln as scratch.
    cpu::RmsNormForward(a.mid, P + ly.ffn_norm, n, d, m.norm_eps, a.ln2, a.rstd2);
    if (ly.moe_index < 0) {
      cpu::SwigluForward(a.ln2, n, d, F, P + ly.w1, P + ly.w3, P + ly.w2, a.h1, a.h3, a.act, dln);
    } else {
      const int mi = ly.moe_index;
      int64_t* counts =
          stats ? stats->expert_counts.data() + static_cast<size_t>(mi) * E : counts_scratch.data();
      aux += moe_layers[mi]->Forward(Moe(P, ly), router_bias.data() + static_cast<size_t>(mi) * E,
                                     a.ln2, n, dln, counts);
    }
#pragma omp parallel for simd schedule(static) if (nd > 65536)
    for (long i = 0; i < nd; ++i) next[i] = a.mid[i] + dln[i];
  }
  cpu::RmsNormForward(res_final, P + final_norm, n, d, m.norm_eps, lnf, rstdf);
  const T* head = P + (m.tie_embeddings ? embedding : lm_head);
  cpu::LinearForward(lnf, head, n, d, V, logits);
  const cpu::CrossEntropyResult ce =
      cpu::CrossEntropy(logits, targets.data(), n, V, m.z_loss, backward, row_scratch.data());
  if (stats) {
    stats->loss = ce.loss;
    stats->aux_loss = aux;
    stats->z_loss = ce.z_loss;
  }
  if (backward) Backward(batch);
  return ce.loss + aux + ce.z_loss;
}

template <typename T>
void Model<T>::Impl::Backward(int batch) {
  const int n = batch * S;
  T* P = params.data();
  T* G = grads.data();
  // LM head: logits holds dlogits. dW_head is overwritten; with tied embeddings the token
  // scatter below adds into the same tensor.
  const size_t head = m.tie_embeddings ? embedding : lm_head;
  cpu::LinearBackward(lnf, P + head, logits, n, d, V, dln, G + head);
  if (!m.tie_embeddings) std::memset(G + embedding, 0, sizeof(T) * V * static_cast<size_t>(d));
  cpu::RmsNormBackward(res_final, P + final_norm, rstdf, dln, n, d, dres, G + final_norm, false);
  if (grad_ready) grad_ready(final_norm, arena);
  for (int l = L - 1; l >= 0; --l) {
    const Layer& ly = layers[l];
    LayerActs& a = la[l];
    // dres holds d/d(layer output). FFN block: dres += RMSNorm'(FFN'(dres)).
    if (ly.moe_index < 0) {
      cpu::SwigluBackward(a.ln2, n, d, F, P + ly.w1, P + ly.w3, P + ly.w2, a.h1, a.h3, a.act, dres,
                          dln, G + ly.w1, G + ly.w3, G + ly.w2, ffn_scratch);
    } else {
      moe_layers[ly.moe_index]->Backward(Moe(P, ly), Moe(G, ly), a.ln2, dres, n, dln);
    }
    cpu::RmsNormBackward(a.mid, P + ly.ffn_norm, a.rstd2, dln, n, d, dres, G + ly.ffn_norm, true);
    // Attention block: dres += RMSNorm'(Attn'(wo'(dres))).
    cpu::LinearBackward(a.att, P + ly.wo, dres, n, odim, d, datt, G + ly.wo);
    AttentionBackward(l, n);
    cpu::RmsNormBackward(a.res, P + ly.attn_norm, a.rstd1, dln, n, d, dres, G + ly.attn_norm, true);
    if (grad_ready) grad_ready(layer_begin[l], l + 1 < L ? layer_begin[l + 1] : final_norm);
  }
  cpu::EmbeddingBackward(inputs.data(), dres, n, d, G + embedding);
  if (grad_ready) grad_ready(0, layer_begin[0]);
}

template <typename T>
Model<T>::Model(const RunConfig& config, ExpertShard shard)
    : impl_(std::make_unique<Impl>(config, shard, true)) {}

template <typename T>
std::vector<ParamInfo> Model<T>::FullLayout(const RunConfig& config, size_t* num_params) {
  const Impl layout(config, ExpertShard{}, false);
  if (num_params) *num_params = layout.arena;
  return layout.infos;
}

template <typename T>
Model<T>::~Model() = default;

template <typename T>
void Model<T>::Init(uint64_t seed) {
  Impl& I = *impl_;
  T* P = I.params.data();
  const double out_scale = 1.0 / std::sqrt(2.0 * I.L);
  for (const ParamInfo& p : I.infos) {
    T* w = P + p.offset;
    const long count = static_cast<long>(p.size());
    if (p.kind == ParamKind::kNorm) {
      std::fill(w, w + count, T(1));
      continue;
    }
    const bool is_out = p.name.ends_with(".wo") || p.name.ends_with(".w2");
    const double std = I.m.init_std * (is_out ? out_scale : 1.0);
    const uint64_t key = data::SplitMix64(seed ^ data::SplitMix64(HashName(p.name)));
    // Element i is element base + i of the whole tensor (base > 0 for a sharded expert block),
    // so every layout initialises every expert alike.
    const long base = static_cast<long>(p.batch_first) * p.rows * p.cols;
    const long first_pair = base / 2, end_pair = (base + count + 1) / 2;
#pragma omp parallel for schedule(static) if (count > 4096)
    for (long pr = first_pair; pr < end_pair; ++pr) {
      double z0, z1;
      NormalPair(key, pr, &z0, &z1);
      const long i = 2 * pr - base;
      if (i >= 0) w[i] = static_cast<T>(std * z0);
      if (i + 1 < count) w[i + 1] = static_cast<T>(std * z1);
    }
  }
  std::fill(I.router_bias.begin(), I.router_bias.end(), T(0));
}

template <typename T>
size_t Model<T>::activation_bytes() const {
  const Impl& I = *impl_;
  size_t bytes = I.acts.size() * sizeof(T) + (I.inputs.size() + I.targets.size()) * 4 +
                 I.row_scratch.size() * sizeof(double);
  for (const auto& layer : I.moe_layers) bytes += layer->workspace_bytes();
  return bytes;
}

template <typename T>
const std::vector<ParamInfo>& Model<T>::param_infos() const {
  return impl_->infos;
}
template <typename T>
size_t Model<T>::num_params() const {
  return impl_->arena;
}
template <typename T>
T* Model<T>::params() {
  return impl_->params.data();
}
template <typename T>
T* Model<T>::grads() {
  return impl_->grads.data();
}
template <typename T>
const T* Model<T>::params() const {
  return impl_->params.data();
}
template <typename T>
std::vector<T>& Model<T>::router_bias() {
  return impl_->router_bias;
}
template <typename T>
const std::vector<T>& Model<T>::router_bias() const {
  return impl_->router_bias;
}
template <typename T>
int Model<T>::moe_layers() const {
  return impl_->num_moe;
}

template <typename T>
double Model<T>::ForwardBackward(const int32_t* tokens, int batch, StepStats* stats) {
  return impl_->Run(tokens, batch, stats, true);
}

template <typename T>
double Model<T>::Forward(const int32_t* tokens, int batch, StepStats* stats) {
  return impl_->Run(tokens, batch, stats, false);
}

template <typename T>
void Model<T>::UpdateRouterBias(const std::vector<int64_t>& counts, double rate) {
  Impl& I = *impl_;
  if (counts.size() < static_cast<size_t>(I.num_moe) * I.E)
    throw std::invalid_argument("UpdateRouterBias: counts has the wrong size");
  for (int mi = 0; mi < I.num_moe; ++mi)
    UpdateSelectionBias(I.router_bias.data() + static_cast<size_t>(mi) * I.E,
                        counts.data() + static_cast<size_t>(mi) * I.E, I.E, rate);
}

template <typename T>
void Model<T>::SetGradReadyHook(GradReadyHook hook) {
  impl_->grad_ready = std::move(hook);
}

template <typename T>
void Model<T>::SetMoeBatchStatsHook(MoeBatchStatsHook hook) {
  for (size_t mi = 0; mi < impl_->moe_layers.size(); ++mi)
    impl_->moe_layers[mi]->SetBatchStatsHook(hook, static_cast<int>(mi));
}

template class Model<float>;
template class Model<double>;

}  // namespace moelab
