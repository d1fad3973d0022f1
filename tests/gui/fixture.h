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

// Appends steps (from, to] to a writer created by BuildFixture.
void WriteSteps(db::RunWriter* writer, int from, int to, bool clip, double scale);

}  // namespace moelab::gui::testing
