// The adaptive sweep's space and its estimand read from the runs so far. The space is the
// sweep's own expansion, seen as a ladder of budgets (the budget key's values) for each arm and
// seed; the estimand is the model-free multiplier C_arm / C_reference at the target loss, read
// seed by seed by analysis::ModelFreeMultipliers (or, for a slope, the per-doubling β through
// the origin over several arms' multipliers), with the repeated interval of
// analysis/sequential.h over the seeds that bracket the target in every arm and the reference.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "analysis/sequential.h"
#include "sweeps/adaptive_spec.h"
#include "sweeps/spec.h"

namespace moelab::sweeps {

// One run of the space: which side of the comparison, which seed, which rung of the ladder.
struct SpaceRun {
  int index = 0;  // SweepRun::index
  int side = 0;   // 0: reference, k: AdaptiveSpec::arms[k - 1]
  int64_t seed = 0;
  int rung = 0;            // position of its budget in the ladder (0: shortest)
  double flops = 0;        // training FLOPs of the whole run
  double decay_flops = 0;  // FLOPs after its WSD decay start (its cost as a branch)
};

struct AdaptiveSpace {
  std::vector<std::string> ladder;  // budget values (ShortValue), shortest first
  std::vector<int64_t> seeds;       // the spec's seeds, in order
  std::vector<SpaceRun> runs;
  // The run at (side, seed, rung), or nullptr when the space has none.
  const SpaceRun* At(int side, int64_t seed, int rung) const;
};

// Throws SpecError (naming adaptive.*) when the arms' runs are not one per (side, seed, budget):
// another swept key would make the comparison ambiguous.
AdaptiveSpace BuildSpace(const Sweep& sweep, const AdaptiveSpec& spec);

// The final evaluation of a done run of the space.
struct RunResult {
  double loss = 0, flops = 0, tokens = 0;
};
using Results = std::map<int, RunResult>;  // by SweepRun::index

// How one (side, seed) covers the target with its done runs.
enum class Cover { kNone, kBracketed, kAbove, kBelow };  // above: every loss above the target
const char* CoverName(Cover c);

struct EstimandReading {
  std::map<std::pair<int, int64_t>, Cover> cover;  // (side, seed) with any done run
  // Bracketed (side, seed): the rungs of the last run at or above the target and of the first
  // run below it, along the ladder (where the seed's curve crossed the target).
  std::map<std::pair<int, int64_t>, std::pair<int, int>> crossing;
  std::vector<int64_t> seeds;  // bracketed in every side, in seed order
  // Per seed, the estimand on its log scale: log(C_arm / C_reference), or a slope's β.
  std::vector<double> log_value;
  bool has_interval = false;            // at least min_seeds seeds
  analysis::RepeatedInterval interval;  // log scale
  double ratio = 0, lo = 0, hi = 0;     // exp of the interval (NaN ends before): the ratio,
                                        // or a slope's factor per doubling
  std::vector<std::string> notes;
};

// `looks`: the seed counts of the earlier looks (strictly increasing, ≥ min_seeds); this
// reading's seed count is appended when larger (a look without a new seed repeats the last one).
EstimandReading ReadEstimand(const AdaptiveSpace& space, const AdaptiveSpec& spec,
                             const Results& results, const std::vector<int>& looks);

// The stopping rule on a reading: "" to continue, else why it stops.
std::string StopReason(const AdaptiveSpec& spec, const EstimandReading& r);

}  // namespace moelab::sweeps
