// Shared by the spec tests (tests/sweeps/spec_test.cc, size_guard_test.cc, tests/launch/
// launch_test.cc): a tiny MoE base config and the message a spec is refused with.
#pragma once

#include <string>

#include "sweeps/spec.h"

namespace moelab::sweeps::test_specs {

inline ojson Base() {
  return ojson::parse(R"({
    "model": {"vocab_size": 64, "d_model": 32, "layers": 2, "heads": 2, "ffn_hidden": 64,
              "seq_len": 16},
    "moe": {"experts_total": 4, "experts_active": 2, "expert_hidden": 16},
    "data": {"source": "markov"},
    "train": {"batch_size": 2, "steps": 20, "threads": 1},
    "schedule": {"warmup_steps": 2}
  })");
}

// ExpandSpec's SpecError message for `spec`; "" when it expands.
inline std::string ErrorOf(const ojson& spec) {
  try {
    ExpandSpec(spec);
  } catch (const SpecError& e) {
    return e.what();
  }
  return "";
}

}  // namespace moelab::sweeps::test_specs
