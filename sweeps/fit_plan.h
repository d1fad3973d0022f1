// What `moelab fit` and `moelab promote` will be able to do with a planned sweep, before any
// run: `moelab sweep plan` builds each run's evaluation points (FLOPs, tokens, size, seed and
// trunk; the loss assumed to fall with compute) and runs the very checks fit and promote apply
// (analysis/family_design.h), family by family.
#pragma once

#include <string>
#include <vector>

#include "analysis/family_design.h"
#include "sweeps/spec.h"

namespace moelab::sweeps {

struct FitPlan {
  // The swept keys that make families (treatments), each axis "key" or "key = derived key";
  // budget and seed keys, and keys that change the model size, are not among them.
  std::vector<std::string> axes;
  std::vector<analysis::FamilyReadiness> families;  // family = "k=v,k=v" ("the sweep": one)
  std::vector<std::string> warnings;  // what fit or promote will refuse, and what to add
  std::vector<std::string> notes;     // `fit --by K` needs --pool for the other axes
};

FitPlan PlanFits(const Sweep& sweep);

}  // namespace moelab::sweeps
