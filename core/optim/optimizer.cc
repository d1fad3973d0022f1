#include "core/optim/optimizer.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numbers>
#include <stdexcept>

#include "core/optimizer_traits.h"
#include "core/optim/adamw.h"
#include "core/optim/muon.h"

namespace moelab {

std::unique_ptr<Optimizer> MakeOptimizer(const OptimizerConfig& config,
                                         const std::vector<ParamInfo>& params, OptimizerOps& ops) {
  // MuonClip is Muon plus QK-Clip; the clip itself runs in the training loop after every step.
  if (TraitsOf(config).muon) return std::make_unique<Muon>(config, params, ops);
  return std::make_unique<AdamW>(config, params, ops);
}

std::pair<size_t, size_t> ArenaSpanOf(const std::vector<ParamInfo>& params) {
  size_t begin = SIZE_MAX, end = 0;
  for (const ParamInfo& p : params) {
    begin = std::min(begin, p.offset);
    end = std::max(end, p.offset + p.size());
  }
  return begin < end ? std::make_pair(begin, end) : std::make_pair(size_t{0}, size_t{0});
}

double ScheduledLr(const ScheduleConfig& s, double peak_lr, int64_t step, int64_t total_steps) {
  if (s.warmup_steps > 0 && step <= s.warmup_steps) {
    return peak_lr * static_cast<double>(step) / s.warmup_steps;
  }
  const double min_lr = peak_lr * s.min_lr_ratio;
  const double span = std::max<int64_t>(1, total_steps - s.warmup_steps);
  const double progress = std::clamp((step - s.warmup_steps) / span, 0.0, 1.0);
  if (s.type == "constant") return peak_lr;
  if (s.type == "cosine") {
    return min_lr + 0.5 * (peak_lr - min_lr) * (1.0 + std::cos(std::numbers::pi * progress));
  }
  if (s.type == "linear") return peak_lr + (min_lr - peak_lr) * progress;
  if (s.type == "wsd") {
    // Warmup, then stable at the peak, then a linear decay over the last decay_fraction of
    // all steps. The decay start depends only on total_steps, so runs differing only in length
    // share their stable phase (the sweep engine branches them from one checkpoint).
    const int64_t decay_steps =
        std::max<int64_t>(1, static_cast<int64_t>(std::llround(s.decay_fraction * total_steps)));
    const int64_t decay_start = std::max<int64_t>(s.warmup_steps, total_steps - decay_steps);
    if (step <= decay_start) return peak_lr;
    const double t = std::min(1.0, static_cast<double>(step - decay_start) /
                                       std::max<int64_t>(1, total_steps - decay_start));
    return peak_lr + (min_lr - peak_lr) * t;
  }
  throw std::invalid_argument("unknown schedule type '" + s.type + "'");
}

}  // namespace moelab
