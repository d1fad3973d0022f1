// What one forward pass reports (loss terms, per-head max logits, expert loads): its own header
// so the metrics interface (core/metrics.h) and the database need not include the whole model.
#pragma once

#include <cstdint>
#include <vector>

namespace moelab {

// Statistics of one forward pass. Sized by the model; filled by Forward*/ForwardBackward.
struct StepStats {
  double loss = 0;      // mean next-token cross-entropy (nats)
  double aux_loss = 0;  // load-balancing loss (already multiplied by its coefficient)
  double z_loss = 0;    // output z-loss (already multiplied by its coefficient)
  // S_max^h = max over batch and unmasked (i, j) of q_i·k_j/sqrt(d), [layers * heads].
  std::vector<float> max_logit;
  // Before any soft-cap (equal to max_logit when soft-capping is off).
  std::vector<float> max_logit_raw;
  // Tokens routed to each expert, [moe_layers * experts_total] (top-k assignments).
  std::vector<int64_t> expert_counts;
};

}  // namespace moelab
