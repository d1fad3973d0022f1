// Memory per device of a planned run: the engine's parameter, gradient, optimizer-state and
// activation arenas, computed from the config alone (a promoted model may not fit here). The
// activation count mirrors Model::Impl::Reserve and MoeLayer::Reserve one buffer at a time;
// tests/promote checks it against Model::activation_bytes() of real models.
#include "promote/memory.h"

#include <algorithm>
#include <cstddef>

#include "core/flops.h"
#include "core/model/model.h"
#include "kernels/cpu/attention.h"

namespace moelab::promote {

namespace {

constexpr size_t kAlignFloats = 64 / sizeof(float);
size_t Pad(size_t n) { return (n + kAlignFloats - 1) / kAlignFloats * kAlignFloats; }

}  // namespace

size_t ActivationElements(const RunConfig& c, int batch, int threads) {
  const ModelConfig& m = c.model;
  const bool mla = m.attention == "mla";
  const size_t B = batch, S = m.seq_len, d = m.d_model, H = m.heads, V = m.vocab_size;
  const size_t F = m.ffn_hidden, L = m.layers;
  const size_t n = B * S, att = B * H * S * S;
  const size_t KVH = m.kv_heads_effective(), hd = m.head_dim_effective();
  const size_t rq = m.q_lora_rank, rkv = m.kv_lora_rank, dn = m.qk_nope_head_dim,
               dr = m.qk_rope_head_dim, dvh = m.v_head_dim, dqk = dn + dr;
  const size_t qdim = H * hd, kvdim = KVH * hd, qkv_dim = qdim + 2 * kvdim;
  const size_t odim = mla ? H * dvh : qdim;
  const int dense_layers = m.layers - MoeLayers(m, c.moe);

  size_t total = 0;
  auto take = [&](size_t count) { total += count ? Pad(count) : 0; };
  for (size_t l = 0; l < L; ++l) {
    take(n * d);
    take(n * d);
    take(n);
    if (mla) {
      if (rq > 0) {
        take(n * rq);
        take(n * rq);
        take(n);
      }
      take(n * H * dqk);
      take(n * (rkv + dr));
      take(n * rkv);
      take(n);
      take(n * H * (dn + dvh));
      take(n * H * dqk);
      take(n * H * dqk);
    } else {
      take(n * qkv_dim);
      if (m.qk_norm) {
        take(n * (qdim + kvdim));
        take(n * H);
        take(n * KVH);
      }
    }
    take(att);
    if (m.logit_softcap > 0) take(att);
    take(n * odim);
    take(n * d);
    take(n * d);
    take(n);
    if (static_cast<int>(l) < dense_layers) {
      take(n * F);
      take(n * F);
      take(n * F);
    }
  }
  take(n * d);
  take(n * d);
  take(n);
  take(static_cast<size_t>(LogitChunkRows(static_cast<int>(n), static_cast<int>(V))) * V);
  take(n * d);
  take(n * d);
  take(n * odim);
  if (mla) {
    take(n * H * dqk);
    take(n * H * dqk);
    take(n * H * dqk);
    take(n * (rkv + dr));
    take(n * H * (dn + dvh));
    take(n * std::max(rq, rkv));
  } else {
    take(n * qkv_dim);
  }
  take(n * 2 * F);
  cpu::AttentionDims dims;
  dims.batch = static_cast<int>(B);
  dims.seq = static_cast<int>(S);
  dims.heads = static_cast<int>(H);
  take(cpu::AttentionScratchSize(dims, threads));
  take(B * H);
  total += 2 * n + 4 * n;  // inputs, targets (int32); row scratch (double)

  if (c.moe.enabled()) {
    const size_t E = c.moe.experts_total, k = c.moe.experts_active, EH = c.moe.expert_hidden,
                 sh = c.moe.shared_experts;
    const size_t nk = n * k;
    const size_t chunks = std::clamp<size_t>((n + 511) / 512, 1, 8);
    size_t per = 2 * n * E + 5 * nk + 3 * nk * d + 3 * nk * EH + 3 * sh * n * EH +
                 (sh > 1 ? (sh - 1) * n * d : 0) + (nk + sh * n) * 2 * EH +
                 (chunks > 1 ? sh * chunks * 3 * EH * d : 0) + 2 * (2 * E + 1);
    total += per * MoeLayers(m, c.moe);
  }
  return total;
}

MemoryEstimate EstimateMemory(const RunConfig& c, const PromoteLayout& layout) {
  MemoryEstimate m;
  const ParamCounts pc = CountParams(c);
  double params = static_cast<double>(pc.total);
  double state = static_cast<double>(OptimizerStateElements(c) + OptimizerWorkspaceElements(c));
  const int ep = std::max(1, layout.ep);
  if (ep > 1 && c.moe.enabled()) {
    // Routed experts are split over the EP group; the rest is replicated.
    const double experts = static_cast<double>(pc.routed);
    const double frac = (params - experts + experts / ep) / params;
    params *= frac;
    state *= frac;
  }
  const int dp = std::max(1, layout.ranks / ep);
  const int local_batch = std::max(1, (c.train.batch_size + dp - 1) / dp);
  m.params = 4 * params;
  m.grads = 4 * params;
  m.optimizer = 4 * state;
  m.activations =
      4.0 * static_cast<double>(ActivationElements(c, local_batch, std::max(1, layout.threads)));
  return m;
}

}  // namespace moelab::promote
