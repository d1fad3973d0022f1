// QK-Clip on a host arena through the production plan (core/optim/qk_clip_plan.h): what the
// training loop has its backend do, for tests that check the clipped weights.
#pragma once

#include <cstdint>
#include <vector>

#include "core/optim/qk_clip_plan.h"

namespace moelab::testing {

template <typename T>
std::vector<ClipEvent> ClipByPlan(const RunConfig& c, const std::vector<ParamInfo>& params,
                                  T* arena, const std::vector<float>& s_max, int64_t step) {
  const QkClipPlan plan = PlanQkClip(c, params, s_max, step);
  ApplyQkClipPlan(plan, arena);
  return plan.events;
}

}  // namespace moelab::testing
