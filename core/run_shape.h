// The shape a run records with its database row (matrix sizes for the max logits and expert
// loads, parameter counts, FLOPs per token, planned steps), computed from a config in one place
// for `moelab train`, the sweep runner and promotion. db::RunShape is this struct.
#pragma once

#include <cstdint>

#include "core/config.h"

namespace moelab {

struct RunShape {
  int layers = 0;      // max-logit matrix rows
  int heads = 0;       // max-logit matrix columns
  int moe_layers = 0;  // expert-count matrix rows
  int experts = 0;     // expert-count matrix columns (routed experts)
  int64_t params_total = 0;
  int64_t params_active = 0;
  double flops_per_token = 0;  // training FLOPs per token (analytic)
  int64_t total_steps = 0;     // planned length, for progress and ETA
};

RunShape RunShapeOf(const RunConfig& config);

}  // namespace moelab
