// The shape a run row records (matrix sizes for max logits and expert loads, parameter counts,
// FLOPs per token, planned steps), computed from a config in one place for `moelab train`, the
// sweep runner and promotion.
#pragma once

#include "core/config.h"
#include "db/types.h"

namespace moelab::sweeps {

db::RunShape RunShapeOf(const RunConfig& config);

}  // namespace moelab::sweeps
