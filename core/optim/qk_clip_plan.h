// QK-Clip (Kimi K2, the "Clip" of MuonClip) as a plan of row scalings: after the optimizer step,
// shrink W_q/W_k of every attention head whose max pre-softmax logit S_max^h exceeded τ so that
// the same batch's logit becomes exactly τ. A weight edit outside the gradient path, independent
// of the optimizer (AdamW + QK-Clip is a valid arm). The backend applies the plan
// (OptimizerOps::ScaleRows, core/model/optimizer_ops.h), on host or device arenas alike.
//
// per_head (K2): γ_h = τ / S_max^h for heads with S_max^h > τ.
//   MHA (kv_heads == heads): W_q^h rows ×γ^α, W_k^h rows ×γ^(1−α).
//   GQA (kv_heads < heads): a key head serves its whole group, so it stays untouched (like
//   MLA's shared rotary key) and W_q^h takes all of γ_h; α is unused.
//   MLA: head-specific q^C (q_b_nope rows) ×γ^α and k^C (kv_b_k rows) ×γ^(1−α), the head's
//   rotary query (q_b_rope rows) ×γ, the shared rotary key untouched: both terms of the logit
//   (q^C·k^C + q^R·k^R)/√(d_nope + d_rope) scale by exactly γ.
// global (the naive variant the K2 report compares against): per layer one γ = τ / max_h S_max^h
//   when that max exceeds τ, and every head of the layer gets W_q ×γ^α, W_k ×γ^(1−α). Every
//   head shares γ, so scaling the shared GQA key heads is exact here too.
// Because RoPE is linear and there is no bias/QK-norm on the q/k path (QK-norm + QK-Clip is
// refused by ValidateConfig), the clipped heads' logits all scale by exactly γ.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/config.h"
#include "core/metrics.h"
#include "core/model/model.h"
#include "core/model/optimizer_ops.h"

namespace moelab {

struct QkClipPlan {
  std::vector<RowScale> scales;
  // One event per head whose weights are scaled (global mode: every head of a clipped layer,
  // each with its own S_max and the layer's γ).
  std::vector<ClipEvent> events;
};

// The plan for this step's raw S_max ([layers * heads], layer-major, as StepStats::max_logit_raw:
// the pre-soft-cap values); empty when qk_clip_tau <= 0 or no head exceeds τ (a NaN S_max, a
// diverged step, clips nothing). Throws std::invalid_argument for a bad mode, size or parameter
// layout.
QkClipPlan PlanQkClip(const RunConfig& cfg, const std::vector<ParamInfo>& params,
                      const std::vector<float>& max_logit, int64_t step);

// Applies a plan to a host arena (CpuOptimizerOps().ScaleRows), in float or, for the double
// precision checks, in double.
template <typename T>
void ApplyQkClipPlan(const QkClipPlan& plan, T* arena);

}  // namespace moelab
