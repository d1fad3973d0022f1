// The transformer's forward pass and its explicit reverse walk over the layers (llm.c style),
// written once over the backend seam (core/model/backend.h): every op is a backend call, every
// buffer lives in the backend's memory. See docs/model.md for the layout and conventions.
#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "core/model/model_impl.h"

namespace moelab {

template <typename T>
size_t Model<T>::Impl::LayoutActivations(int batch, size_t saved, size_t scratch, T* base) {
  const size_t n = static_cast<size_t>(batch) * S;
  size_t total = 0;
  auto take = [&](size_t count) -> T* {
    if (count == 0) return nullptr;
    T* p = base ? base + total : nullptr;
    total += PadCount<T>(count);
    return p;
  };
  la.assign(L, LayerActs{});
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
    a.saved = take(saved);
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
  logit_rows = LogitChunkRows(static_cast<int>(n), V);
  logits = take(static_cast<size_t>(logit_rows) * V);
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
  att_scratch = take(scratch);
  pair_max = take(static_cast<size_t>(batch) * H);
  head_max = take(static_cast<size_t>(L) * H);
  return total;
}

template <typename T>
void Model<T>::Impl::Reserve(int batch) {
  dims.batch = std::max(batch, cap_batch);
  const size_t scratch = be->AttentionScratchElements(dims);
  if (batch <= cap_batch && scratch <= cap_scratch) return;
  cap_batch = dims.batch;
  cap_scratch = scratch;
  const size_t saved = be->AttentionSavedElements(dims);
  acts.Resize(LayoutActivations(cap_batch, saved, scratch, nullptr));
  LayoutActivations(cap_batch, saved, scratch, acts.data());
  const size_t n = static_cast<size_t>(cap_batch) * S;
  inputs.Resize(n);
  targets.Resize(n);
  host_inputs.resize(n);
  host_targets.resize(n);
  row_scratch.Resize(2 * n + 2);
}

template <typename T>
AttentionCore<T> Model<T>::Impl::Core(int l, int n) {
  const Layer& ly = layers[l];
  LayerActs& a = la[l];
  const T* P = params.data();
  AttentionCore<T> c;
  c.dims = dims;
  c.x = a.ln1, c.wqkv = P + ly.wq, c.wo = P + ly.wo;
  c.n = n, c.d = d, c.qdim = qdim, c.kvdim = kvdim, c.odim = odim, c.head_dim = hd;
  c.cos = rope_cos.data(), c.sin = rope_sin.data();
  if (qk_norm) {
    c.q_norm = P + ly.q_norm, c.k_norm = P + ly.k_norm, c.norm_eps = m.norm_eps;
    c.qk_raw = a.qk_raw, c.rstd_q = a.rstd_q, c.rstd_k = a.rstd_k;
  }
  c.qkv = a.qkv, c.saved = a.saved, c.att = a.att, c.pair_max = pair_max;
  return c;
}

template <typename T>
void Model<T>::Impl::MlaForward(int l, int n) {
  const Layer& ly = layers[l];
  LayerActs& a = la[l];
  const T* P = params.data();
  const T* cs = rope_cos.data();
  const T* sn = rope_sin.data();
  // MLA. Queries: [q^C | q^R] = c_q·[q_b_nope; q_b_rope]ᵀ with c_q = RMSNorm(x̂·q_aᵀ) (or x̂).
  const T* qin = a.ln1;
  int qin_dim = d;
  if (rq > 0) {
    be->Linear(a.ln1, P + ly.q_a, n, d, rq, a.cq_raw, false);
    be->RmsNorm(a.cq_raw, P + ly.q_a_norm, n, rq, m.norm_eps, a.cq, a.rstd_cq);
    qin = a.cq;
    qin_dim = rq;
  }
  be->Linear(qin, P + ly.q_b, n, qin_dim, H * dqk, a.qb, false);
  // Keys/values: [c_kv_raw | k^R] = x̂·[kv_a; k_rope]ᵀ; c_kv = RMSNorm(c_kv_raw);
  // [k^C | v] = c_kv·[kv_b_k; kv_b_v]ᵀ.
  const int lda = rkv + dr, ldb = H * (dn + dvh), ldf = H * dqk;
  be->Linear(a.ln1, P + ly.kv_a, n, d, lda, a.kva, false);
  be->RmsNormGroups(a.kva, lda, a.ckv, rkv, n, 1, rkv, P + ly.kv_a_norm, m.norm_eps, a.rstd_kv);
  be->Linear(a.ckv, P + ly.kv_b, n, rkv, ldb, a.kvb, false);
  // RoPE in one op on every head's q^R (in place in qb, which the backward does not read) and on
  // the shared key (once), then per-head q = [q^C_h | q^R_h], k = [k^C_h | k^R].
  be->RopeQk({a.qb, H * dqk, H, dr, H * dn}, {a.kva, lda, 1, dr, rkv}, n, S, dr, cs, sn, false);
  be->CopyHeads(a.qb, H * dqk, dn, 0, a.qf, ldf, dqk, 0, n, H, dn);
  be->CopyHeads(a.qb, H * dqk, dr, H * dn, a.qf, ldf, dqk, dn, n, H, dr);
  be->CopyHeads(a.kvb, ldb, dn, 0, a.kf, ldf, dqk, 0, n, H, dn);
  be->CopyHeads(a.kva, lda, 0, rkv, a.kf, ldf, dqk, dn, n, H, dr);
  be->AttentionForward(dims, a.qf, a.kf, a.kvb + H * dn, a.saved, a.att, pair_max);
}

template <typename T>
void Model<T>::Impl::MlaBackward(int l, int n) {
  const Layer& ly = layers[l];
  LayerActs& a = la[l];
  const T* P = params.data();
  T* G = grads.data();
  const T* cs = rope_cos.data();
  const T* sn = rope_sin.data();
  const int lda = rkv + dr, ldb = H * (dn + dvh), ldf = H * dqk;
  // dv lands directly in the v columns of dkvb.
  be->AttentionBackward(dims, a.qf, a.kf, a.kvb + H * dn, a.att, a.saved, datt, dqf, dkf,
                        dkvb + H * dn, att_scratch);
  // Scatter per-head gradients back to the projection layouts; the shared rotary key sums its
  // heads' gradients in head order; then RoPE⁻¹ in one op on the q^R columns of dqb and on the
  // shared key (the rotation acts on each value alone, so it commutes with the copies).
  be->CopyHeads(dqf, ldf, dqk, 0, dqb, H * dqk, dn, 0, n, H, dn);
  be->CopyHeads(dqf, ldf, dqk, dn, dqb, H * dqk, dr, H * dn, n, H, dr);
  be->CopyHeads(dkf, ldf, dqk, 0, dkvb, ldb, dn, 0, n, H, dn);
  be->SumHeads(dkf, ldf, dqk, dn, dkva + rkv, lda, n, H, dr);
  be->RopeQk({dqb, H * dqk, H, dr, H * dn}, {dkva, lda, 1, dr, rkv}, n, S, dr, cs, sn, true);
  // kv path: dc_kv, then through the latent norm into the first rkv columns of dkva.
  be->LinearBackward(a.ckv, P + ly.kv_b, dkvb, n, rkv, ldb, dcq, G + ly.kv_b, false, false);
  be->RmsNormGroupsBackward(a.kva, lda, P + ly.kv_a_norm, a.rstd_kv, dcq, rkv, dkva, lda, n, 1, rkv,
                            G + ly.kv_a_norm);
  be->LinearBackward(a.ln1, P + ly.kv_a, dkva, n, d, lda, dln, G + ly.kv_a, false, false);
  // q path, accumulating into dx̂.
  if (rq > 0) {
    be->LinearBackward(a.cq, P + ly.q_b, dqb, n, rq, H * dqk, dcq, G + ly.q_b, false, false);
    be->RmsNormGroupsBackward(a.cq_raw, rq, P + ly.q_a_norm, a.rstd_cq, dcq, rq, dcq, rq, n, 1, rq,
                              G + ly.q_a_norm);
    be->LinearBackward(a.ln1, P + ly.q_a, dcq, n, d, rq, dln, G + ly.q_a, /*accumulate_dx=*/true,
                       false);
  } else {
    be->LinearBackward(a.ln1, P + ly.q_b, dqb, n, d, H * dqk, dln, G + ly.q_b,
                       /*accumulate_dx=*/true, false);
  }
}

// LM head + cross-entropy over row chunks of at most LogitChunkRows rows, so the [n, vocab]
// logits never exist at once (a 32k vocabulary at 32k rows would be 4 GiB of fp32): each
// chunk's logits become its dlogits in place, and with backward its share of dW_head and of
// d lnf (into dln) is formed at once. One chunk (every small model) is the unchunked
// arithmetic bit for bit; several weight each chunk's mean by its share of the rows. The whole
// head is one backend op (LmHeadLoss) over LmHeadLossChunk ops: the CPU composes the finer ops,
// CUDA in bf16 keeps the logits and dlogits in bf16 and reads the summed terms once.
template <typename T>
LossTerms Model<T>::Impl::OutputLoss(int n, bool backward) {
  const size_t head = m.tie_embeddings ? embedding : lm_head;
  LmHeadChunk<T> all;
  all.rows = n;
  all.x = lnf;
  all.w = params.data() + head;
  all.targets = targets.data();
  all.d = d, all.vocab = V, all.z_coef = m.z_loss;
  all.backward = backward;
  all.logits = logits;
  all.row_scratch = row_scratch.data();
  all.dx = dln;
  all.dw = grads.data() + head;
  return be->LmHeadLoss(all, std::min(LogitChunkRows(n, V), logit_rows));  // the arena's, at most
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
      host_inputs[static_cast<size_t>(b) * S + s] = row[s];
      host_targets[static_cast<size_t>(b) * S + s] = row[s + 1];
    }
  }
  inputs.Upload(host_inputs.data(), n);
  targets.Upload(host_targets.data(), n);
  bias.Upload(router_bias.data(), router_bias.size());
  if (stats) stats->expert_counts.assign(static_cast<size_t>(num_moe) * E, 0);
  T* P = params.data();
  const size_t nd = static_cast<size_t>(n) * d;

  be->Embedding(P + embedding, inputs.data(), n, d, la[0].res);
  be->RmsNorm(la[0].res, P + layers[0].attn_norm, n, d, m.norm_eps, la[0].ln1, la[0].rstd1);
  double aux = 0;
  for (int l = 0; l < L; ++l) {
    const Layer& ly = layers[l];
    LayerActs& a = la[l];
    // Attention block: mid = res + wo·Attn(RMSNorm(res)); RMSNorm(res) (ln1, rstd1) was formed
    // with res at the previous boundary.
    // mid = res, then the output projection accumulates onto it (the residual add for free).
    be->Copy(a.mid, a.res, nd * sizeof(T));
    if (mla) {
      MlaForward(l, n);
      be->Linear(a.att, P + ly.wo, n, odim, d, a.mid, /*accumulate=*/true);
    } else {
      be->AttentionCoreForward(Core(l, n), a.mid);
    }
    be->HeadMax(pair_max, batch, H, head_max + static_cast<size_t>(l) * H);
    // FFN block: next = mid + FFN(RMSNorm(mid)); the FFN output goes through dln as scratch.
    be->RmsNorm(a.mid, P + ly.ffn_norm, n, d, m.norm_eps, a.ln2, a.rstd2);
    if (ly.moe_index < 0) {
      be->FfnForward(a.ln2, n, d, F, P + ly.w1, P + ly.w3, P + ly.w2, a.h1, a.h3, a.act, dln);
    } else {
      const int mi = ly.moe_index;
      int64_t* counts = stats ? stats->expert_counts.data() + static_cast<size_t>(mi) * E : nullptr;
      aux += moe_layers[mi]->Forward(Moe(P, ly), bias.data() + static_cast<size_t>(mi) * E, a.ln2,
                                     n, dln, counts);
    }
    // The layer boundary: next = mid + FFN output, with the next norm (layer l+1's attention
    // norm, or the final norm) in the same op.
    if (l + 1 < L) {
      LayerActs& b = la[l + 1];
      be->AddRmsNorm(a.mid, dln, b.res, P + layers[l + 1].attn_norm, n, d, m.norm_eps, b.ln1,
                     b.rstd1);
    } else {
      be->AddRmsNorm(a.mid, dln, res_final, P + final_norm, n, d, m.norm_eps, lnf, rstdf);
    }
  }
  const LossTerms ce = OutputLoss(n, backward);
  if (stats) {
    // S_max per (layer, head): the raw maximum, and after the soft-cap when there is one.
    be->ToHost(host_head_max.data(), head_max, sizeof(T) * host_head_max.size());
    stats->max_logit_raw.resize(host_head_max.size());
    stats->max_logit.resize(host_head_max.size());
    for (size_t i = 0; i < host_head_max.size(); ++i) {
      const double raw = static_cast<double>(host_head_max[i]);
      stats->max_logit_raw[i] = static_cast<float>(raw);
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

template <typename T>
void Model<T>::Impl::Backward(int batch) {
  const int n = batch * S;
  T* P = params.data();
  T* G = grads.data();
  // The LM head's gradients (dln = d lnf, dW_head) were formed with the loss (OutputLoss); with
  // tied embeddings the token scatter below adds into the same tensor.
  if (!m.tie_embeddings) be->Zero(G + embedding, sizeof(T) * V * static_cast<size_t>(d));
  be->RmsNormBackward(res_final, P + final_norm, rstdf, dln, n, d, dres, G + final_norm, false);
  if (grad_ready) grad_ready(final_norm, arena);
  for (int l = L - 1; l >= 0; --l) {
    const Layer& ly = layers[l];
    LayerActs& a = la[l];
    // dres holds d/d(layer output). FFN block: dres += RMSNorm'(FFN'(dres)).
    if (ly.moe_index < 0) {
      be->FfnBackward(a.ln2, n, d, F, P + ly.w1, P + ly.w3, P + ly.w2, a.h1, a.h3, a.act, dres, dln,
                      G + ly.w1, G + ly.w3, G + ly.w2, ffn_scratch);
    } else {
      moe_layers[ly.moe_index]->Backward(Moe(P, ly), Moe(G, ly), a.ln2, dres, n, dln);
    }
    be->RmsNormBackward(a.mid, P + ly.ffn_norm, a.rstd2, dln, n, d, dres, G + ly.ffn_norm, true);
    // Attention block: dres += RMSNorm'(Attn'(wo'(dres))).
    if (mla) {
      be->LinearBackward(a.att, P + ly.wo, dres, n, odim, d, datt, G + ly.wo, false, false);
      MlaBackward(l, n);
    } else {
      AttentionCoreGrads<T> g;
      g.dy = dres, g.datt = datt, g.dqkv = dqkv, g.scratch = att_scratch, g.dx = dln;
      g.dwqkv = G + ly.wq, g.dwo = G + ly.wo;
      if (qk_norm) g.dq_norm = G + ly.q_norm, g.dk_norm = G + ly.k_norm;
      be->AttentionCoreBackward(Core(l, n), g);
    }
    be->RmsNormBackward(a.res, P + ly.attn_norm, a.rstd1, dln, n, d, dres, G + ly.attn_norm, true);
    if (grad_ready) grad_ready(layer_begin[l], l + 1 < L ? layer_begin[l + 1] : final_norm);
  }
  be->EmbeddingBackward(inputs.data(), dres, n, d, G + embedding);
  if (grad_ready) grad_ready(0, layer_begin[0]);
}

template struct Model<float>::Impl;
template struct Model<double>::Impl;

}  // namespace moelab
