// Which run `moelab train` records into, decided by rank 0 before anything trains: a new run, a
// recorded run to continue (--resume [RUN], --run-id, or train-or-continue by --name), or a
// finished one (nothing to do). Also the comparison of a given config with a run's stored one
// and the checkpoint folder a continued run resumes from. docs/database.md, "Run identity".
#pragma once

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/config.h"
#include "db/types.h"

namespace moelab::cli {

// `moelab train` must not start: the exit code (kExitConfig, kExitFailed, ...) and why.
class TrainRefused : public std::runtime_error {
 public:
  TrainRefused(int code, const std::string& why) : std::runtime_error(why), code_(code) {}
  int code() const { return code_; }

 private:
  int code_;
};

struct TrainRequest {
  std::string db;
  bool resume = false;
  std::string resume_run;  // --resume RUN: an id or a name ("" = choose)
  int64_t run_id = -1;     // --run-id (the sweep engine, promotion launchers)
  std::string name;        // --name
  // The given config's hash, when a config file was given.
  std::optional<std::string> config_hash;
};

struct TrainTarget {
  enum Kind { kNew, kContinue, kFinished } kind = kNew;
  std::optional<db::RunRow> run;  // kContinue, kFinished
  std::string stored_config_json;
  std::string note;  // printed before training (which run, why)
};

// Reads the database (never creates it). Throws TrainRefused: RUN unknown or ambiguous, several
// unfinished runs and no way to choose, a run being trained right now by a live process.
TrainTarget ChooseRun(const TrainRequest& request);

// The keys (JSON paths) whose values differ between a run's stored config and a given one and
// change the experiment (hashed fields), each as `key (stored X, given Y)`.
std::vector<std::string> DifferingKeys(const RunConfig& stored, const RunConfig& given);

// Where a continued run's checkpoints are and which it may adopt.
struct ResumeFolder {
  std::string dir;                // write and resume here
  std::string legacy_checkpoint;  // a pre-UUID checkpoint the run recorded (adopted as its own)
  int64_t start_step = 0;         // the step resume will start from (0: from scratch)
  std::string from;               // the checkpoint it starts from ("" = none)
  std::string warning;            // why there is none although the run recorded one
};

// The folder: --checkpoint-dir when given; else the folder of the run's recorded checkpoint when
// that file is still there and is the run's own; else DefaultCheckpointDir(config, uuid). Throws
// TrainRefused (exit 2) when the run recorded a checkpoint but neither that folder exists nor
// the chosen one holds any of its checkpoints (moved to another machine or path): the message
// says to pass --checkpoint-dir. When only the recorded file is gone, `warning` says so.
ResumeFolder FindResumeFolder(const db::RunRow& run, const RunConfig& config,
                              const std::string& explicit_dir);

// The run RUN names, as `--resume RUN` and `moelab db show RUN` read it: a run id, else a name
// (several runs of that name: its unfinished one, else the newest). nullptr when none; throws
// TrainRefused (exit 2) when several unfinished runs share the name (give the id).
const db::RunRow* FindRun(const std::vector<db::RunRow>& rows, const std::string& run,
                          const std::string& db);
// The same for a name only (train-or-continue by --name).
const db::RunRow* RunNamed(const std::vector<db::RunRow>& rows, const std::string& name,
                           const std::string& db);

// One line per run for messages: "  3 'try1' stopped at step 12 (config 1a2b3c4d5e6f)".
std::string DescribeRun(const db::RunRow& run);

}  // namespace moelab::cli
