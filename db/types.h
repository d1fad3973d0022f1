// Plain structs shared by the writer and the reader.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/run_shape.h"
#include "core/run_status.h"

namespace moelab::db {

// Shapes of the per-step matrices and the model size figures recorded with a run (computed by
// moelab::RunShapeOf, which db/ never calls: it stores what it is given).
using RunShape = ::moelab::RunShape;

// One run as listed: the runs row joined with its run_summary row.
struct RunRow {
  int64_t id = 0;
  std::string uuid;  // the run's identity (migration 7), written into its checkpoints
  std::string name;
  std::optional<int64_t> sweep_id;
  std::string config_hash;
  RunStatus status = RunStatus::kQueued;            // as stored
  RunStatus effective_status = RunStatus::kQueued;  // kFailed for a running run gone stale
  bool stale = false;
  std::optional<int64_t> pid;
  std::string host;
  double created_at = 0;
  std::optional<double> started_at;
  std::optional<double> heartbeat_at;
  std::optional<double> ended_at;
  std::string error;
  std::optional<int64_t> diverged_step;
  std::string checkpoint_path;
  std::optional<int64_t> checkpoint_step;
  RunShape shape;
  // run_summary (zeros / nullopt before the first flush).
  int64_t last_step = 0;
  std::optional<double> last_loss;
  std::optional<double> best_val_loss;
  std::optional<double> last_val_loss;
  int64_t tokens = 0;
  double flops = 0;
  std::optional<double> tokens_per_s;
  std::optional<double> updated_at;
  // Layout (migration 4): ranks = dp_size × ep_size; 1, 1, 1 for a single process.
  int ranks = 1;
  int dp_size = 1;
  int ep_size = 1;
  // Migration 8: the CPU thread count the run last trained with (nullopt: recorded before, read
  // the stored config's train.threads), and the first step trained after a resume that changed
  // the thread count or the layout (nullopt: one layout made the whole trajectory).
  std::optional<int> threads;
  std::optional<int64_t> nondeterministic_from_step;
};

// A metric against step. Missing values (NULL, e.g. a NaN loss) read as NaN.
struct Series {
  std::vector<int64_t> steps;
  std::vector<double> values;
};

// S_max per (layer, head) at one step, row-major [layers * heads].
struct MaxLogitMatrix {
  int64_t step = 0;
  int layers = 0;
  int heads = 0;
  std::vector<float> values;
  std::vector<float> raw;  // before any soft-cap; equals values when soft-capping is off
};

// Max-logit matrices over a step range: values[i * layers * heads + l * heads + h].
struct MaxLogitTimeline {
  int layers = 0;
  int heads = 0;
  std::vector<int64_t> steps;
  std::vector<float> values;
};

// Tokens routed per (MoE layer, expert) over a step range:
// counts[i * moe_layers * experts + l * experts + e].
struct ExpertLoads {
  int moe_layers = 0;
  int experts = 0;
  std::vector<int64_t> steps;
  std::vector<int64_t> counts;
};

}  // namespace moelab::db
