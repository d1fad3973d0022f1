#include "core/optim/qk_clip.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

namespace moelab {
namespace {

// Scales rows [first, first + count) of a row-major [*, cols] tensor by factor.
template <typename T>
void ScaleRows(T* w, int first, int count, int cols, T factor) {
  T* p = w + static_cast<size_t>(first) * cols;
  const size_t n = static_cast<size_t>(count) * cols;
  for (size_t i = 0; i < n; ++i) p[i] *= factor;
}

const ParamInfo* FindLayerParam(const std::vector<ParamInfo>& params, int layer,
                                 const std::string& suffix) {
  for (const ParamInfo& p : params) {
    if (p.layer == layer && p.name.size() >= suffix.size() &&
        p.name.compare(p.name.size() - suffix.size(), suffix.size(), suffix) == 0) {
      return &p;
    }
  }
  throw std::invalid_argument("ApplyQkClip: layer " + std::to_string(layer) + " has no " +
                              suffix + " parameter");
}

// MLA: a head's logit is (q^C·k^C + q^R·k^R)/√(d_nope + d_rope). Head-specific q^C (rows of
// q_b_nope) and k^C (rows of kv_b_k) take γ^α and γ^(1−α), the head's rotary query (rows of
// q_b_rope) takes γ, and the rotary key k_rope, shared by every head, stays untouched, so both
// terms scale by exactly γ.
template <typename T>
std::vector<ClipEvent> ApplyQkClipMla(const RunConfig& cfg, const std::vector<ParamInfo>& params,
                                      T* arena, const std::vector<float>& max_logit,
                                      int64_t step) {
  const ModelConfig& m = cfg.model;
  const OptimizerConfig& opt = cfg.optimizer;
  const double tau = opt.qk_clip_tau, alpha = opt.qk_clip_alpha;
  const int layers = m.layers, heads = m.heads;
  const int dn = m.qk_nope_head_dim, dr = m.qk_rope_head_dim;
  if (max_logit.size() != static_cast<size_t>(layers) * heads) {
    throw std::invalid_argument("ApplyQkClip: max_logit has " + std::to_string(max_logit.size()) +
                                " entries, expected layers*heads");
  }
  std::vector<ClipEvent> events;
  for (int l = 0; l < layers; ++l) {
    const ParamInfo* qc = FindLayerParam(params, l, "attn.q_b_nope");
    const ParamInfo* kc = FindLayerParam(params, l, "attn.kv_b_k");
    const ParamInfo* qr = FindLayerParam(params, l, "attn.q_b_rope");
    if (qc->rows != heads * dn || kc->rows != heads * dn || qr->rows != heads * dr) {
      throw std::invalid_argument("ApplyQkClip: layer " + std::to_string(l) +
                                  " MLA projections do not have the per-head row layout");
    }
    const float* s = max_logit.data() + static_cast<size_t>(l) * heads;
    const double layer_max = *std::max_element(s, s + heads);
    for (int h = 0; h < heads; ++h) {
      const double s_max = opt.qk_clip_mode == "global" ? layer_max : s[h];
      if (!(s_max > tau)) continue;
      const double gamma = tau / s_max;
      ScaleRows(arena + qc->offset, h * dn, dn, qc->cols, static_cast<T>(std::pow(gamma, alpha)));
      ScaleRows(arena + kc->offset, h * dn, dn, kc->cols,
                static_cast<T>(std::pow(gamma, 1.0 - alpha)));
      ScaleRows(arena + qr->offset, h * dr, dr, qr->cols, static_cast<T>(gamma));
      events.push_back({step, l, h, s[h], gamma});
    }
  }
  return events;
}

}  // namespace

template <typename T>
std::vector<ClipEvent> ApplyQkClip(const RunConfig& cfg, const std::vector<ParamInfo>& params,
                                   T* arena, const std::vector<float>& max_logit, int64_t step) {
  const OptimizerConfig& opt = cfg.optimizer;
  const double tau = opt.qk_clip_tau;
  if (!(tau > 0)) return {};
  const bool global = opt.qk_clip_mode == "global";
  if (!global && opt.qk_clip_mode != "per_head") {
    throw std::invalid_argument("optimizer.qk_clip_mode: unknown mode '" + opt.qk_clip_mode +
                                "' (expected \"per_head\" or \"global\")");
  }
  const ModelConfig& m = cfg.model;
  if (m.attention == "mla") return ApplyQkClipMla(cfg, params, arena, max_logit, step);
  const int layers = m.layers, heads = m.heads, kv_heads = m.kv_heads_effective();
  const int hd = m.head_dim_effective();
  if (max_logit.size() != static_cast<size_t>(layers) * heads) {
    throw std::invalid_argument(
        "ApplyQkClip: max_logit has " + std::to_string(max_logit.size()) +
        " entries, expected layers*heads = " + std::to_string(static_cast<size_t>(layers) * heads));
  }

  std::vector<const ParamInfo*> wq(layers, nullptr), wk(layers, nullptr);
  for (const ParamInfo& p : params) {
    if (p.layer < 0 || p.layer >= layers) continue;
    if (p.kind == ParamKind::kAttnQ) wq[p.layer] = &p;
    if (p.kind == ParamKind::kAttnK) wk[p.layer] = &p;
  }
  for (int l = 0; l < layers; ++l) {
    if (!wq[l] || !wk[l]) {
      throw std::invalid_argument("ApplyQkClip: layer " + std::to_string(l) +
                                  " has no attn_q/attn_k parameter");
    }
    if (wq[l]->rows != heads * hd || wk[l]->rows != kv_heads * hd || wq[l]->batch != 1 ||
        wk[l]->batch != 1) {
      throw std::invalid_argument("ApplyQkClip: " + wq[l]->name + "/" + wk[l]->name +
                                  " do not have the [heads*head_dim, d] layout");
    }
  }

  const double alpha = opt.qk_clip_alpha;
  const bool mha = kv_heads == heads;
  std::vector<ClipEvent> events;
  for (int l = 0; l < layers; ++l) {
    T* q = arena + wq[l]->offset;
    T* k = arena + wk[l]->offset;
    const int q_cols = wq[l]->cols, k_cols = wk[l]->cols;
    const float* s = max_logit.data() + static_cast<size_t>(l) * heads;
    if (global) {
      const double s_max = *std::max_element(s, s + heads);
      if (!(s_max > tau)) continue;
      const double gamma = tau / s_max;
      ScaleRows(q, 0, heads * hd, q_cols, static_cast<T>(std::pow(gamma, alpha)));
      ScaleRows(k, 0, kv_heads * hd, k_cols, static_cast<T>(std::pow(gamma, 1.0 - alpha)));
      for (int h = 0; h < heads; ++h) events.push_back({step, l, h, s[h], gamma});
      continue;
    }
    for (int h = 0; h < heads; ++h) {
      // NaN S_max (a diverged step) fails the comparison and clips nothing.
      if (!(s[h] > tau)) continue;
      const double gamma = tau / s[h];
      if (mha) {
        ScaleRows(q, h * hd, hd, q_cols, static_cast<T>(std::pow(gamma, alpha)));
        ScaleRows(k, h * hd, hd, k_cols, static_cast<T>(std::pow(gamma, 1.0 - alpha)));
      } else {
        ScaleRows(q, h * hd, hd, q_cols, static_cast<T>(gamma));
      }
      events.push_back({step, l, h, s[h], gamma});
    }
  }
  return events;
}

template std::vector<ClipEvent> ApplyQkClip<float>(const RunConfig&, const std::vector<ParamInfo>&,
                                                   float*, const std::vector<float>&, int64_t);
template std::vector<ClipEvent> ApplyQkClip<double>(const RunConfig&, const std::vector<ParamInfo>&,
                                                    double*, const std::vector<float>&, int64_t);

}  // namespace moelab
