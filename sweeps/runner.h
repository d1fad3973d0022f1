// The local sweep scheduler: records the sweep and its runs in the database, deduplicates by
// config hash, and trains every run as its own `moelab train` process in parallel slots, with
// retries, WSD branching, a live terminal view and crash-safe resume (a second invocation of
// the same sweep picks up exactly what the first left unfinished).
#pragma once

#include <atomic>
#include <cstdio>
#include <stdexcept>
#include <string>

#include "sweeps/spec.h"

namespace moelab::sweeps {

// Exit code of `sweep run` / `sweep resume` when another process already runs the same sweep
// (against the same database): nothing was started, and nothing failed (1 means a run failed).
constexpr int kExitSweepBusy = 5;

// Thrown by RunSweep when the sweep's lock is held by another process.
class SweepBusyError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct RunOptions {
  std::string db_path;
  int parallel = 1;
  int threads_per_run = 0;  // 0: cores / parallel (at least 1)
  bool rerun = false;       // train again even when a done run with the same config exists
  int max_retries = 1;  // failed attempts retried per run (crashes and errors, not config errors)
  std::string moelab_bin;  // "": this executable
  int live = -1;           // live redrawing view: 1 on, 0 off (event lines), -1 when a terminal
  double poll_s = 0.25;
  // WSD extension: every WSD run keeps a checkpoint at its own decay start (one more, never
  // pruned), so a longer run of its family added later (a grown spec, an adaptive sweep's
  // "extend to") continues its stable phase instead of starting over. Adaptive sweeps set it.
  bool extendable = false;
  std::atomic<bool>* stop_flag = nullptr;  // set by SIGINT/SIGTERM: stop gracefully
  std::FILE* out = stdout;
};

struct RunSummary {
  int total = 0;
  int done = 0;
  int reused = 0;  // done before this invocation (this or another sweep, or a lone run)
  int failed = 0;
  int diverged = 0;
  int stopped = 0;
  // 0: every run done or diverged; 1: some run failed for good; 4: stopped (Ctrl-C).
  int exit_code = 0;
};

// Runs (or resumes) the sweep. Throws SweepBusyError when another process holds the sweep's
// lock, std::runtime_error when the database cannot be opened; run failures are reported in
// the summary, never thrown.
RunSummary RunSweep(const Sweep& sweep, const RunOptions& options);

// Where the engine keeps a sweep's generated files: <db>.sweeps/<sanitised sweep name>.
std::string SweepDir(const std::string& db_path, const std::string& sweep_name);

// A running run whose heartbeat is older than this is stale: its trainer is gone.
inline constexpr double kStaleAfterS = 30.0;

// `moelab sweep status` (sweeps/status.cc): a table of the sweep's runs (or of every sweep when
// name is empty).
void PrintStatus(const std::string& db_path, const std::string& name, std::FILE* out);

// Loads a sweep from a spec file, or (when arg is not a file) from the spec stored in the
// database under that name.
Sweep LoadSweepFromArg(const std::string& arg, const std::string& db_path,
                       const ExpandOptions& options = {});

}  // namespace moelab::sweeps
