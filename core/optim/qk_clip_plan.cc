#include "core/optim/qk_clip_plan.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <type_traits>

namespace moelab {
namespace {

const ParamInfo* FindLayerParam(const std::vector<ParamInfo>& params, int layer,
                                const std::string& suffix) {
  for (const ParamInfo& p : params) {
    if (p.layer == layer && p.name.ends_with(suffix)) return &p;
  }
  throw std::invalid_argument("PlanQkClip: layer " + std::to_string(layer) + " has no " + suffix +
                              " parameter");
}

void AddRows(QkClipPlan* plan, const ParamInfo& p, int first, int count, double factor) {
  plan->scales.push_back({p.offset + static_cast<size_t>(first) * p.cols,
                          static_cast<size_t>(count) * p.cols, factor});
}

// Throws unless the tensor has `rows` rows of one matrix (the per-head row layout the plan
// scales).
void RequireRows(const ParamInfo& p, int rows, int layer) {
  if (p.rows != rows || p.batch != 1) {
    throw std::invalid_argument("PlanQkClip: layer " + std::to_string(layer) + " " + p.name +
                                " does not have the per-head row layout");
  }
}

}  // namespace

QkClipPlan PlanQkClip(const RunConfig& cfg, const std::vector<ParamInfo>& params,
                      const std::vector<float>& max_logit, int64_t step) {
  QkClipPlan plan;
  const OptimizerConfig& opt = cfg.optimizer;
  const double tau = opt.qk_clip_tau, alpha = opt.qk_clip_alpha;
  if (!(tau > 0)) return plan;
  const bool global = opt.qk_clip_mode == "global";
  if (!global && opt.qk_clip_mode != "per_head") {
    throw std::invalid_argument("optimizer.qk_clip_mode: unknown mode '" + opt.qk_clip_mode + "'");
  }
  const ModelConfig& m = cfg.model;
  const int layers = m.layers, heads = m.heads;
  if (max_logit.size() != static_cast<size_t>(layers) * heads) {
    throw std::invalid_argument("PlanQkClip: max_logit has " + std::to_string(max_logit.size()) +
                                " entries, expected layers*heads");
  }
  const bool mla = m.attention == "mla";
  const int kv_heads = m.kv_heads_effective(), hd = m.head_dim_effective();
  const bool mha = kv_heads == heads;
  for (int l = 0; l < layers; ++l) {
    const float* s = max_logit.data() + static_cast<size_t>(l) * heads;
    const double layer_max = *std::max_element(s, s + heads);
    if (mla) {
      const int dn = m.qk_nope_head_dim, dr = m.qk_rope_head_dim;
      const ParamInfo* qc = FindLayerParam(params, l, "attn.q_b_nope");
      const ParamInfo* kc = FindLayerParam(params, l, "attn.kv_b_k");
      const ParamInfo* qr = FindLayerParam(params, l, "attn.q_b_rope");
      RequireRows(*qc, heads * dn, l);
      RequireRows(*kc, heads * dn, l);
      RequireRows(*qr, heads * dr, l);
      for (int h = 0; h < heads; ++h) {
        const double s_max = global ? layer_max : s[h];
        if (!(s_max > tau)) continue;
        const double gamma = tau / s_max;
        AddRows(&plan, *qc, h * dn, dn, std::pow(gamma, alpha));
        AddRows(&plan, *kc, h * dn, dn, std::pow(gamma, 1.0 - alpha));
        AddRows(&plan, *qr, h * dr, dr, gamma);
        plan.events.push_back({step, l, h, s[h], gamma});
      }
      continue;
    }
    const ParamInfo* wq = nullptr;
    const ParamInfo* wk = nullptr;
    for (const ParamInfo& p : params) {
      if (p.layer != l) continue;
      if (p.kind == ParamKind::kAttnQ) wq = &p;
      if (p.kind == ParamKind::kAttnK) wk = &p;
    }
    if (!wq || !wk) {
      throw std::invalid_argument("PlanQkClip: layer " + std::to_string(l) +
                                  " has no attn_q/attn_k parameter");
    }
    RequireRows(*wq, heads * hd, l);
    RequireRows(*wk, kv_heads * hd, l);
    if (global) {
      if (!(layer_max > tau)) continue;
      const double gamma = tau / layer_max;
      AddRows(&plan, *wq, 0, heads * hd, std::pow(gamma, alpha));
      AddRows(&plan, *wk, 0, kv_heads * hd, std::pow(gamma, 1.0 - alpha));
      for (int h = 0; h < heads; ++h) plan.events.push_back({step, l, h, s[h], gamma});
      continue;
    }
    for (int h = 0; h < heads; ++h) {
      if (!(s[h] > tau)) continue;
      const double gamma = tau / s[h];
      if (mha) {
        AddRows(&plan, *wq, h * hd, hd, std::pow(gamma, alpha));
        AddRows(&plan, *wk, h * hd, hd, std::pow(gamma, 1.0 - alpha));
      } else {
        AddRows(&plan, *wq, h * hd, hd, gamma);
      }
      plan.events.push_back({step, l, h, s[h], gamma});
    }
  }
  return plan;
}

template <typename T>
void ApplyQkClipPlan(const QkClipPlan& plan, T* arena) {
  if constexpr (std::is_same_v<T, float>) {
    CpuOptimizerOps().ScaleRows(plan.scales, arena, nullptr);
  } else {
    for (const RowScale& r : plan.scales) {
      T* p = arena + r.offset;
      for (size_t i = 0; i < r.count; ++i) p[i] *= static_cast<T>(r.factor);
    }
  }
}

template void ApplyQkClipPlan<float>(const QkClipPlan&, float*);
template void ApplyQkClipPlan<double>(const QkClipPlan&, double*);

}  // namespace moelab
