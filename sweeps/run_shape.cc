#include "sweeps/run_shape.h"

#include "core/flops.h"

namespace moelab::sweeps {

db::RunShape RunShapeOf(const RunConfig& c) {
  db::RunShape s;
  s.layers = c.model.layers;
  s.heads = c.model.heads;
  s.moe_layers = c.moe.enabled() ? c.model.layers - c.moe.dense_layers : 0;
  s.experts = c.moe.experts_total;
  const ParamCounts pc = CountParams(c);
  s.params_total = pc.total;
  s.params_active = pc.active;
  s.flops_per_token = ForwardFlopsPerToken(c).training();
  s.total_steps = c.total_steps();
  return s;
}

}  // namespace moelab::sweeps
