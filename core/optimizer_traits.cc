#include "core/optimizer_traits.h"

#include <stdexcept>

namespace moelab {

OptimizerTraits TraitsOf(const OptimizerConfig& config) {
  OptimizerTraits t;
  t.other_buffers = {"adamw.m", "adamw.v"};
  if (config.name == "adamw") {
    t.hidden_buffers = t.other_buffers;
    t.state_names = t.other_buffers;
    return t;
  }
  // MuonClip is Muon plus QK-Clip; the clip runs in the training loop after every step.
  if (config.name == "muon" || config.name == "muonclip") {
    t.muon = true;
    t.owns_bank = true;
    t.hidden_state = 1;
    t.hidden_buffers = {"muon.momentum"};
    t.state_names = {"muon.momentum", "adamw.m", "adamw.v"};
    return t;
  }
  throw std::runtime_error("optimizer '" + config.name + "' is not available in this build");
}

}  // namespace moelab
