// Shared by the spec tests (spec_test.cc, size_guard_test.cc): a tiny MoE base config.
#pragma once

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

}  // namespace moelab::sweeps::test_specs
