// What callers outside the optimizers need to know about a configured optimizer, answered in one
// place: whether Muon takes the hidden matrices, whether it owns a Newton–Schulz bank, how much
// state each parameter carries and under which checkpoint names. The trainer, ZeRO-1, the expert
// shard map, the memory plans and the communication model ask here instead of comparing names.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "core/config.h"
#include "core/param_info.h"

namespace moelab {

struct OptimizerTraits {
  // Muon's update for every 2-D hidden matrix (ParamInfo::is_hidden_matrix): muon, muonclip.
  bool muon = false;
  // A Newton–Schulz bank as large as the hidden matrices (its workspace, in the compute
  // precision).
  bool owns_bank = false;
  // State elements per parameter element: a hidden matrix's (Muon: the momentum) and the rest's
  // (AdamW: m and v).
  int hidden_state = 2;
  int other_state = 2;
  // Every state buffer the unsharded optimizer has, in checkpoint order (an AdamW buffer only
  // exists while some tensor is AdamW's; Muon's momentum always).
  std::vector<std::string> state_names;
  // The state buffers of a hidden matrix, and of every other tensor.
  std::vector<std::string> hidden_buffers, other_buffers;

  // The state buffers a tensor has its state in.
  const std::vector<std::string>& StateOf(const ParamInfo& p) const {
    return muon && p.is_hidden_matrix() ? hidden_buffers : other_buffers;
  }
  // The state elements of the tensor.
  size_t StateElements(const ParamInfo& p) const {
    return (muon && p.is_hidden_matrix() ? hidden_state : other_state) * p.size();
  }
};

// The traits of config.name; throws std::runtime_error naming an optimizer this build lacks.
OptimizerTraits TraitsOf(const OptimizerConfig& config);

}  // namespace moelab
