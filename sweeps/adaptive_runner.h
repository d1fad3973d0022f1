// `moelab sweep run --adaptive` / `sweep resume` of an adaptive sweep: batches chosen by
// sweeps/adaptive_chooser.h, each trained by the ordinary sweep runner (dedupe, WSD branching,
// retries, crash-safe resume), a look at the estimand after each, until the stopping rule fires,
// the budget is spent or the space is exhausted.
//
// Crash safety: a batch is recorded (adaptive_batches) before any of its runs starts, and its
// look (adaptive_looks) after every run of it has finished. A killed sweep, resumed, first
// finishes its last recorded batch (the runner resumes those runs from their checkpoints and
// reuses the done ones: nothing lost, nothing trained twice), looks, and only then chooses: the
// chooser reads the same database and so continues its own choices.
#pragma once

#include <cstdio>
#include <string>

#include "sweeps/runner.h"
#include "sweeps/spec.h"

namespace moelab::sweeps {

struct AdaptiveSummary {
  int batches = 0;  // recorded batches (this invocation and earlier ones)
  int seeds = 0;    // seeds in the last look
  double spent_flops = 0;
  std::string decision;  // the last look's decision
  // 0: stopped by the rule, the budget or the space; 1: a run failed for good; 4: Ctrl-C.
  int exit_code = 0;
};

// Throws SweepBusyError when another process runs this adaptive sweep.
AdaptiveSummary RunAdaptiveSweep(const Sweep& sweep, const RunOptions& options);

// Whether the database records adaptive batches of the sweep (`sweep resume` then continues
// adaptively). False when the database or the sweep does not exist.
bool HasAdaptiveBatches(const std::string& db_path, const std::string& sweep_name);

// The looks so far, one line per batch (for `sweep status` and the tests).
void PrintAdaptiveStatus(const std::string& db_path, const Sweep& sweep, std::FILE* out);

}  // namespace moelab::sweeps
