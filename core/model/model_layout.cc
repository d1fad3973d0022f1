// The model's parameter layout (one flat arena, llm.c style; docs/model.md), its deterministic
// initialisation and accessors. The forward/backward walk is in model.cc.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <tuple>

#include "core/data/random.h"
#include "core/model/attention_dims.h"
#include "core/model/model_impl.h"
#include "kernels/cpu/rope.h"

namespace moelab {

namespace {

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
Model<T>::Impl::Impl(const RunConfig& config, ExpertShard shard,
                     std::unique_ptr<Backend<T>> backend, bool allocate)
    : cfg(config), m(config.model), moe(config.moe), be(std::move(backend)) {
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
  dims = AttentionDimsOf(m);
  if (!allocate) return;
  for (BackendArray<T>* a : {&params, &grads, &bias, &rope_cos, &rope_sin, &acts}) {
    a->Bind(be.get());
  }
  inputs.Bind(be.get());
  targets.Bind(be.get());
  row_scratch.Bind(be.get());
  params.Resize(arena);
  grads.Resize(arena);
  be->SetWeights(params.data(), arena);
  router_bias.assign(static_cast<size_t>(num_moe) * E, T(0));
  bias.Resize(router_bias.size());
  for (int i = 0; i < num_moe; ++i) {
    moe_layers.push_back(std::make_unique<MoeLayer<T>>(
        m, moe, be->MakeMoeExperts(m, moe, expert_first, expert_count), be.get(), expert_first,
        expert_count));
  }
  // RoPE tables on the host (the same values on every backend), then uploaded.
  std::vector<T> cs(static_cast<size_t>(S) * rot_dim / 2), sn(cs.size());
  cpu::RopeTables<T>(S, rot_dim, m.rope_theta, cs.data(), sn.data());
  rope_cos.Resize(cs.size());
  rope_sin.Resize(sn.size());
  rope_cos.Upload(cs.data(), cs.size());
  rope_sin.Upload(sn.data(), sn.size());
  be->SetAttentionRope(rope_cos.data(), rope_sin.data(), rot_dim);
  host_head_max.resize(static_cast<size_t>(L) * H);
}

namespace {
long logit_chunk_elements = 1L << 24;
}  // namespace

long LogitChunkElements() { return logit_chunk_elements; }
void SetLogitChunkElements(long elements) { logit_chunk_elements = std::max(1L, elements); }
int LogitChunkRows(int rows, int vocab) {
  const long fit = std::max<long>(1, logit_chunk_elements / std::max(1, vocab));
  return static_cast<int>(std::min<long>(rows, fit));
}

template <typename T>
Model<T>::Model(const RunConfig& config, ExpertShard shard)
    : Model(config, shard, MakeBackend<T>(config)) {}

template <typename T>
Model<T>::Model(const RunConfig& config, ExpertShard shard, std::unique_ptr<Backend<T>> backend)
    : impl_(std::make_unique<Impl>(config, shard, std::move(backend), true)) {}

template <typename T>
std::vector<ParamInfo> Model<T>::FullLayout(const RunConfig& config, size_t* num_params) {
  const Impl layout(config, ExpertShard{}, nullptr, false);
  if (num_params) *num_params = layout.arena;
  return layout.infos;
}

template <typename T>
Model<T>::~Model() = default;

template <typename T>
size_t Model<T>::ActivationElements(const RunConfig& config, int batch, size_t attention_saved,
                                    size_t attention_scratch) {
  Impl layout(config, ExpertShard{}, nullptr, false);
  return layout.LayoutActivations(batch, attention_saved, attention_scratch, nullptr);
}

// Computed on the host (the same values for every backend and thread count), then uploaded.
template <typename T>
void Model<T>::Init(uint64_t seed) {
  Impl& I = *impl_;
  std::vector<T> staging;
  if (!I.be->is_host()) staging.resize(I.arena);
  T* P = I.be->is_host() ? I.params.data() : staging.data();
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
  if (!I.be->is_host()) I.params.Upload(staging.data(), staging.size());
  ParamsChanged();
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
Backend<T>& Model<T>::backend() {
  return *impl_->be;
}
template <typename T>
const Backend<T>& Model<T>::backend() const {
  return *impl_->be;
}
template <typename T>
void Model<T>::ReadParams(T* host) const {
  impl_->params.Download(host, impl_->arena);
}
template <typename T>
void Model<T>::WriteParams(const T* host) {
  impl_->params.Upload(host, impl_->arena);
  ParamsChanged();
}
template <typename T>
void Model<T>::ParamsChanged() {
  impl_->be->WeightsChanged();
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
