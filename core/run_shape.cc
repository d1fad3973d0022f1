#include "core/run_shape.h"

#include "core/flops.h"

namespace moelab {

RunShape RunShapeOf(const RunConfig& c) {
  RunShape s;
  s.layers = c.model.layers;
  s.heads = c.model.heads;
  s.moe_layers = MoeLayers(c.model, c.moe);
  s.experts = c.moe.experts_total;
  const ParamCounts pc = CountParams(c);
  s.params_total = pc.total;
  s.params_active = pc.active;
  s.flops_per_token = ForwardFlopsPerToken(c).training();
  s.total_steps = c.total_steps();
  return s;
}

}  // namespace moelab
