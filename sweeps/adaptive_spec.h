// The "adaptive" block of a sweep spec (issue 38): the question the sweep answers, the space its
// runs may be drawn from, the budget and the stopping rule. The sweep's own axes are the space:
// an adaptive sweep trains a subset of the runs its spec expands to, chosen batch by batch
// (sweeps/adaptive_chooser.h), and the full expansion is the fixed grid it is compared with.
//
//   "adaptive": {
//     "estimand": {"kind": "flops_ratio", "key": "sparsity", "arm": 32, "reference": 48,
//                  "target_loss": 3.90},
//     (or {"kind": "slope", "key": "sparsity", "arms": [8, 16, 32], "reference": 48, ...})
//     "budget_key": "train.steps",
//     "budget": {"flops": 2e15},
//     "stop": {"excludes": 1.0, "width": 0.10},
//     "alpha": 0.10, "min_seeds": 3, "seeds_per_batch": 1
//   }
//
// Every problem is a SpecError naming the JSON path (`adaptive.stop.width: ...`) before
// anything runs. docs/sweeps-adaptive.md is the reference.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace moelab::sweeps {

struct Sweep;

struct AdaptiveSpec {
  // The estimand, read seed by seed from what `moelab fit` reports in its model-free table:
  //   "flops_ratio" / "tokens_ratio": the multiplier C_arm / C_reference at target_loss (one arm);
  //   "slope": the per-doubling slope β in log(C_S / C_reference) = β · log2(reference / S),
  //            through the origin over the arms S (analysis/sparsity_slope.h), reported as the
  //            FLOPs factor per doubling exp(β). Arms and reference must be positive numbers.
  // Either way the interval is drawn on the log scale and reported exponentiated, so the stop
  // rule's `excludes` is a factor (1: no difference / no slope).
  std::string kind = "flops_ratio";
  std::string key;  // the sweep key whose values are the arms (a grid/zip/runs key)
  // The compared values: one for a ratio ("arm"), one or more for a slope ("arms"). A run's
  // "side" in the space is 0 for the reference and k for arms[k - 1].
  std::vector<nlohmann::ordered_json> arms;
  nlohmann::ordered_json reference;
  double target_loss = 0;

  bool IsSlope() const { return kind == "slope"; }
  int Sides() const { return static_cast<int>(arms.size()) + 1; }
  // The value of `side` (0: the reference).
  const nlohmann::ordered_json& SideValue(int side) const {
    return side == 0 ? reference : arms.at(side - 1);
  }
  // The trunk-length axis: runs of one (arm, seed) differing only in this key are one WSD
  // family (the longest is the trunk, the others branch from it).
  std::string budget_key = "train.steps";
  double budget_flops = 0;  // training FLOPs the sweep may spend in all (done runs included)
  // Stopping rule: stop when the repeated interval excludes `excludes` (when set), or when its
  // relative width hi/lo − 1 is below `width` (when set); at least one is given.
  std::optional<double> excludes;
  std::optional<double> width;
  double alpha = 0.10;  // the error rate the rule keeps over every look
  int min_seeds = 3;    // no look before this many seeds reach the target in both arms
  int seeds_per_batch = 1;
  int max_seeds = 0;  // the spec's seeds axis length (the space)

  // The seeds of the space in the spec's order.
  std::vector<int64_t> seeds;
};

// Parses and validates `spec["adaptive"]` against the expanded sweep (the key and both arms must
// be among the runs' variables, the budget key must vary, the spec needs a "seeds" axis with at
// least min_seeds seeds). Throws SpecError naming the JSON path.
AdaptiveSpec ParseAdaptiveSpec(const nlohmann::ordered_json& block, const Sweep& sweep);

// One line: "flops_ratio sparsity=32 / sparsity=48 at loss 3.9; stop: excludes 1 or width <
// 0.1; alpha 0.1; budget 2e15 FLOPs" (a slope: "slope of the FLOPs factor per doubling of
// sparsity in {8, 16, 32} against sparsity=48 at loss 3.9; ...").
std::string DescribeQuestion(const AdaptiveSpec& a);

}  // namespace moelab::sweeps
