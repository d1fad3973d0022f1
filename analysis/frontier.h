// The report's sparsity estimand (issue 35.3; DESIGN.md "Statistics"): for each family (a
// sparsity S) and seed, the lower envelope of loss over compute across the family's model sizes
// — the compute-optimal frontier — and the FLOPs multiplier at a fixed loss read model-free on
// that envelope: per seed, a t interval on the mean log ratio (df = seeds − 1), the exact
// sign-flip p and the seed bootstrap ("seed range" below 8 seeds), as analysis/model_free.h
// reads any comparison. The fitted law on the same envelopes (analysis/run_fit.h, power form) is
// the secondary, smoothed reading.
//
// Beside it, the same reading at each single model size: that is a training curve, the
// "fixed size" estimand the earlier single-size experiment measured. The two answer different
// questions and are labelled so wherever a number is shown: a constant gap between two
// training curves that flatten raises their FLOPs ratio as the target falls by itself, while on
// the frontier a larger model takes over before a curve flattens.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "analysis/model_free.h"
#include "analysis/scaling.h"

namespace moelab::analysis {

// Which comparison a model-free or fitted number is.
enum class Estimand {
  kFrontier,   // every family has ≥ 2 model sizes: the lower envelope over them
  kFixedSize,  // every family has one model size: a training curve
  kMixed,      // some families one size, some several: neither, and said so
};

// "frontier (compute-optimal)", "fixed size (training curve)", "mixed (...)".
std::string EstimandLabel(Estimand e);

// The estimand the observations give, from the model sizes (distinct active parameter counts)
// of each family.
Estimand EstimandOf(const std::vector<Observation>& obs);

// The model size of each run (Observation::run → label). From its sweep variables when the runs
// vary model-size keys (analysis/family_design.h IsModelSizeKey: "d_model=32, expert_hidden=32"),
// else the rank of its active parameters inside its family ("size 1" the smallest): sizes of
// different families are matched by rank then (their router makes their parameters differ).
std::map<std::string, std::string> ModelSizeOfRuns(
    const std::vector<Observation>& obs,
    const std::map<std::string, std::map<std::string, std::string>>& run_vars);

// One (family, seed) frontier: which model sizes make up its envelope.
struct EnvelopeUse {
  std::string family, seed;
  std::vector<std::string> sizes;  // on the envelope, smallest compute first, each once
  int points = 0;                  // envelope points
  // Per target (FrontierReport::frontier.targets): the size(s) of the envelope points that
  // bracket L* ("size a" or "size a -> size b"; "" when the envelope does not bracket it).
  std::vector<std::string> size_at_target;
};

// The fixed-size contrast at one model size.
struct FixedSizeTable {
  std::string size;
  std::optional<ModelFreeTable> table;  // none when `error` says why
  std::string error;
};

struct FrontierReport {
  Estimand estimand = Estimand::kFixedSize;
  std::vector<std::string> sizes;  // the model sizes, smallest active parameters first
  ModelFreeTable frontier;         // model-free on each (family, seed)'s envelope over sizes
  std::vector<EnvelopeUse> envelopes;
  std::vector<FixedSizeTable> fixed_size;  // per size, at the frontier's targets
  // (family, seed) envelopes made of one size, targets met at the largest size (the size grid
  // may not bracket the optimum there), ...
  std::vector<std::string> notes;
};

// The frontier estimand of `obs` with `reference` as the reference family at `targets` (empty:
// the model-free defaults inside the range every (family, seed) envelope covers), and each
// model size's fixed-size table at the same targets. Throws AnalysisError when the frontier
// table cannot be read (no shared loss range, no reference family).
FrontierReport AnalyzeFrontier(
    const std::vector<Observation>& obs,
    const std::map<std::string, std::map<std::string, std::string>>& run_vars,
    const std::string& reference, const std::vector<double>& targets,
    const ModelFreeOptions& options = {});

void to_json(nlohmann::json& j, const EnvelopeUse& v);
void to_json(nlohmann::json& j, const FrontierReport& v);

}  // namespace moelab::analysis
