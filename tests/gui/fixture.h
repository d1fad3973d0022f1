// A small moelab database for the GUI tests, written through db::RunWriter like a trainer
// would: a sweep of four MoE runs (sparsity 8/16/32/48; AdamW, Muon, MuonClip with τ = 30) with
// per-step metrics, evaluations, per-head max logits, clip events and expert counts.
#pragma once

#include <memory>
#include <string>

#include "db/writer.h"

namespace moelab::gui::testing {

inline constexpr int kLayers = 4, kHeads = 8, kMoeLayers = 2, kExperts = 8;
inline constexpr int kSteps = 400;
inline constexpr double kTau = 30.0;

// Writes runs 1..4 (finished) to `path`. When live is non-null it also starts a fifth run,
// "live", that stays running at step 200 of 1000 for as long as the caller keeps the writer.
void BuildFixture(const std::string& path, std::unique_ptr<db::RunWriter>* live = nullptr);

// A sweep for the scaling-law view: two families (run variable "heads" = 4 and 8), four model
// sizes each, ten evaluations per run on L = E + A·(C/1e12)^-α with the 8-head family slightly
// better at every budget.
void BuildScalingFixture(const std::string& path);

// Runs a newcomer's database has and the first fixture lacks, in sweep "gaps" (id 1):
//   1 a run with missing steps 151..250 (a gap in every series), evaluations every 50 steps;
//   2 a run evaluated every 3 steps (a dense validation line);
//   3 a run stopped at step 100 of 400;
//   4 a MuonClip run (τ = 30) for the max-logit view's clip panel.
// Runs 1 and 2 have names longer than a Compare column (kLongName1, kLongName2).
inline constexpr const char* kLongName1 =
    "sparsity-law/seed-1/experts-32-active-8-shared-1/budget-3200-steps/lr-3e-3/wsd-decay-0.2/a";
inline constexpr const char* kLongName2 =
    "sparsity-law/seed-1/experts-32-active-8-shared-1/budget-3200-steps/lr-3e-3/wsd-decay-0.2/b";
void BuildGapFixture(const std::string& path);

// Appends steps (from, to] to a writer created by BuildFixture.
void WriteSteps(db::RunWriter* writer, int from, int to, bool clip, double scale);

}  // namespace moelab::gui::testing
