// QK-Clip as a plan of row scalings, so a device arena can apply exactly what ApplyQkClip
// (core/optim/qk_clip.h) applies to a host arena: the same heads, the same γ, the same factors.
// Kept apart from qk_clip.cc (which this mirrors rule for rule; a test checks they agree).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/config.h"
#include "core/metrics.h"
#include "core/model/model.h"

namespace moelab {

// Multiply `count` consecutive elements starting at arena offset `offset` by `factor`
// (rows first..first+count of a row-major tensor, already flattened).
struct RowScale {
  size_t offset = 0;
  size_t count = 0;
  float factor = 1;
};

struct QkClipPlan {
  std::vector<RowScale> scales;
  std::vector<ClipEvent> events;  // as ApplyQkClip returns them
};

// The plan for this step's raw S_max ([layers * heads]); empty when qk_clip_tau <= 0 or no head
// exceeds τ. Throws std::invalid_argument like ApplyQkClip.
QkClipPlan PlanQkClip(const RunConfig& cfg, const std::vector<ParamInfo>& params,
                      const std::vector<float>& max_logit, int64_t step);

// Applies a plan to a host arena (what the device kernel does, for tests).
void ApplyQkClipPlan(const QkClipPlan& plan, float* arena);

}  // namespace moelab
