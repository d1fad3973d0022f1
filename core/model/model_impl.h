// Model<T>'s insides, shared by its two translation units: model_layout.cc (the parameter layout,
// initialisation, accessors) and model.cc (the activation arena, forward and backward). Private
// to core/model.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/model/backend.h"
#include "core/model/model.h"
#include "core/model/moe_layer.h"

namespace moelab {

// Every tensor and activation buffer starts on a 64-byte boundary (AVX-512 rows on the CPU,
// 16-byte vector loads on the GPU); sizes are padded up to a multiple of this many bytes.
constexpr size_t kModelAlignBytes = 64;

template <typename T>
size_t PadCount(size_t n) {
  const size_t per = kModelAlignBytes / sizeof(T);
  return (n + per - 1) / per * per;
}

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
    T* qb = nullptr;       // [n, H·dn + H·dr] per-head q^C | q^R (after RoPE)
    T* kva = nullptr;      // [n, rkv + dr] kv latent | shared rotary key (after RoPE)
    T* ckv = nullptr;      // [n, rkv] normalised kv latent
    T* rstd_kv = nullptr;  // [n]
    T* kvb = nullptr;      // [n, H·dn + H·dv] per-head k^C | v
    T* qf = nullptr;       // [n, H·(dn+dr)] assembled per-head queries
    T* kf = nullptr;       // [n, H·(dn+dr)] assembled per-head keys
    // Both
    T* saved = nullptr;  // what the backend's attention backward needs (AttentionSavedElements)
    T* att = nullptr;    // [n, odim] attention output before wo
    T* mid = nullptr;    // [n,d] residual after attention
    T* ln2 = nullptr;    // [n,d]
    T* rstd2 = nullptr;  // [n]
    T* h1 = nullptr;     // [n,F] dense SwiGLU
    T* h3 = nullptr;
    T* act = nullptr;
  };

  // allocate false: the layout only (FullLayout, ActivationElements), no backend.
  Impl(const RunConfig& config, ExpertShard shard, std::unique_ptr<Backend<T>> backend,
       bool allocate);
  size_t AddParam(const std::string& name, ParamKind kind, int layer, int batch, int rows, int cols,
                  bool align = true);
  // Carves an activation arena for `batch` sequences out of base (null: counts only); returns
  // its size in elements. saved / scratch: the backend's attention needs at that batch.
  size_t LayoutActivations(int batch, size_t saved, size_t scratch, T* base);
  void Reserve(int batch);
  double Run(const int32_t* tokens, int batch, StepStats* stats, bool backward);
  void Backward(int batch);
  // LM head + cross-entropy (+ their backward) over row chunks; see model.cc.
  LossTerms OutputLoss(int n, bool backward);
  // MHA/GQA: layer l's attention as one backend op (backend.h, AttentionCore).
  AttentionCore<T> Core(int l, int n);
  // MLA: x̂ = la[l].ln1 -> la[l].att; pair_max filled.
  void MlaForward(int l, int n);
  // MLA: datt -> dln (= dx̂, overwritten); the layer's attention grads written (wo's aside).
  void MlaBackward(int l, int n);
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
  std::unique_ptr<Backend<T>> be;  // null for a layout-only Impl
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
  BackendArray<T> params, grads;
  std::vector<T> router_bias;  // host copy (checkpointed); uploaded into bias by every Run
  BackendArray<T> bias;
  std::vector<std::unique_ptr<MoeLayer<T>>> moe_layers;
  BackendArray<T> rope_cos, rope_sin;

  // Activation arena, sized for cap_batch sequences and cap_scratch attention scratch.
  int cap_batch = 0;
  size_t cap_scratch = 0;
  BackendArray<T> acts;
  std::vector<LayerActs> la;
  T* res_final = nullptr;    // [n,d]
  T* lnf = nullptr;          // [n,d]
  T* rstdf = nullptr;        // [n]
  T* logits = nullptr;       // [logit_rows, V] one chunk's logits, become its dlogits
  int logit_rows = 0;        // LogitChunkRows when the arena was carved
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
  T* att_scratch = nullptr;  // AttentionScratchElements
  T* pair_max = nullptr;     // [B·H]
  T* head_max = nullptr;     // [L·H] S_max per (layer, head), raw
  BackendArray<int32_t> inputs, targets;
  std::vector<int32_t> host_inputs, host_targets;
  std::vector<T> host_head_max;
  BackendArray<double> row_scratch;
  cpu::AttentionDims dims;
};

}  // namespace moelab
