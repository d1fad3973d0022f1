// The training loop: data → forward/backward → clip → optimizer → QK-Clip → router bias →
// metrics, with evaluation, atomic checkpoints, resume, divergence detection and a progress bar.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/config.h"
#include "core/comm/communicator.h"
#include "core/metrics.h"
#include "core/train/checkpoint.h"

namespace moelab {

struct TrainOptions {
  // The run's identity (runs.uuid): written into every checkpoint; resume adopts only
  // checkpoints with the same one. "" = anonymous (library callers): adopts only checkpoints
  // without one. `moelab train` always passes the run row's.
  std::string run_uuid;
  // Folder for this run's checkpoints; "" = DefaultCheckpointDir(config, run_uuid).
  std::string checkpoint_dir;
  // Continue from the newest checkpoint of this run in checkpoint_dir (fresh start if there is
  // none); another run's checkpoints there are skipped with a warning (ResumeCandidates).
  bool resume = false;
  // With resume: a legacy checkpoint (no UUID) this run recorded, adopted as its own, and the
  // last step the database holds for the run (newer checkpoints skipped; -1: no limit).
  std::string legacy_checkpoint;
  int64_t max_resume_step = -1;
  // Stop (with a checkpoint, status stopped) after this many total steps; -1 = run to the end.
  int64_t stop_at_step = -1;
  // Set asynchronously (e.g. by SIGINT) to stop gracefully with a checkpoint.
  std::atomic<bool>* stop_flag = nullptr;
  // WSD branching: also write checkpoints at these steps into <checkpoint_dir>/branches/, never
  // pruned, so shorter runs of the same family can start their decay from them.
  std::vector<int64_t> branch_steps;
  // Start from this checkpoint of another run of the same family (same BranchHash) instead of
  // from scratch; ignored when resume finds a checkpoint of this run.
  std::string init_from;
  bool progress = true;  // progress bar on stderr
  Communicator* comm = nullptr;  // null: single process
  // Called once with the step the run starts from (0, or the resumed checkpoint's step) and the
  // checkpoint it was read from ("" for none), after that checkpoint passed every check.
  std::function<void(int64_t step, const std::string& from)> on_start;
};

struct TrainResult {
  RunStatus status = RunStatus::kRunning;
  int64_t steps_done = 0;  // total optimizer steps completed (including resumed ones)
  int64_t start_step = 0;  // step the run (re)started from
  double last_loss = 0;    // the last batch's (noisy) loss
  // The mean training loss over the last steps of this session (the last 10 %, 1 to 100
  // steps): the summary a log ends with; recent_loss_steps says how many (0: none trained).
  double recent_loss = 0;
  int64_t recent_loss_steps = 0;
  double train_seconds = 0;  // wall time of the steps trained in this session
  double last_val_loss = 0;  // NaN when no evaluation ran
  std::string error;         // for failed and diverged runs
  std::string checkpoint;    // last checkpoint written
  double tokens_per_s = 0;
  // Distributed runs (issue 9): what this rank's communicator sent per step and the share of
  // step time spent inside collectives; optimizer-state bytes held by this rank.
  double comm_bytes_per_step = 0;
  double comm_time_share = 0;
  size_t optimizer_state_bytes = 0;
  size_t param_bytes = 0;  // parameters + gradients held by this rank (issue 23)
};

// Exit codes of `moelab train`, distinct so a sweep scheduler can tell outcomes apart.
enum ExitCode { kExitDone = 0, kExitFailed = 1, kExitConfig = 2, kExitDiverged = 3,
                kExitStopped = 4 };

// <checkpoint.dir>/<first 16 hex of the config hash>/<run uuid>: one folder per run (without a
// uuid: <checkpoint.dir>/<hash16>, the layout before runs had UUIDs).
std::string DefaultCheckpointDir(const RunConfig& config, const std::string& run_uuid);
// Which checkpoints a run with these options may resume from (both trainers use it).
ResumeIdentity ResumeIdentityOf(const TrainOptions& options, const std::string& config_hash);
// Prints a resume warning (a skipped checkpoint) to stderr.
void WarnResume(const std::string& warning);
// Where Train writes the branch-point checkpoints of a run (see TrainOptions::branch_steps).
std::string BranchCheckpointDir(const std::string& checkpoint_dir);

// Trains the run; every outcome (including exceptions inside the loop) is reported to the sink.
TrainResult Train(const RunConfig& config, MetricsSink* sink, const TrainOptions& options);

}  // namespace moelab
