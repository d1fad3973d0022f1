// RunWriter records one training run into a moelab SQLite database. The trainer's calls only
// append to an in-memory buffer; a background thread commits the buffer in one transaction
// about once per flush interval (1 s by default), so a fast CPU run does not pay one fsync per
// step and readers see a steady trickle of rows.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "core/metrics.h"
#include "db/sqlite.h"
#include "db/types.h"

namespace moelab::db {

struct RunInfo {
  std::string name;
  std::string config_json;
  std::string config_hash;
  std::optional<int64_t> sweep_id;
  int64_t pid = 0;   // 0: this process
  std::string host;  // empty: this host
  RunShape shape;
};

struct WriterOptions {
  double flush_interval_s = 1.0;
  double busy_timeout_s = 10.0;
  // Whole-transaction retries when SQLITE_BUSY outlasts busy_timeout (with growing back-off).
  int busy_retries = 5;
};

class RunWriter : public moelab::MetricsSink {
 public:
  // Inserts a new run (status running, this pid and host, a new uuid) and starts recording
  // into it.
  static std::unique_ptr<RunWriter> Create(const std::string& path, const RunInfo& info,
                                           const WriterOptions& options = {});
  // Takes over an existing run (a queued run launched by the sweep engine, or a resume): sets it
  // running with this pid and host, clears end state, and drops every metric row after
  // resume_step so a resumed run does not record its steps twice. A given shape replaces the
  // stored one (queued runs are created before the model is built).
  static std::unique_ptr<RunWriter> Attach(const std::string& path, int64_t run_id,
                                           int64_t resume_step,
                                           const std::optional<RunShape>& shape = std::nullopt,
                                           const WriterOptions& options = {});
  ~RunWriter() override;
  RunWriter(const RunWriter&) = delete;
  RunWriter& operator=(const RunWriter&) = delete;

  // MetricsSink. Buffering calls never touch the database and never throw; OnCheckpoint and
  // OnEnd flush synchronously and throw the writer's first error, if any.
  void OnStep(const StepRecord& record, const StepStats& stats) override;
  void OnEval(int64_t step, int64_t tokens, double flops, double val_loss) override;
  void OnClip(const std::vector<ClipEvent>& events) override;
  void OnHeartbeat() override;
  void OnCheckpoint(int64_t step, const std::string& path) override;
  // Flushes, then records the final status, ended_at and error; for kDiverged also the
  // diverged step (the last step reported through OnStep unless SetDivergedStep was called).
  void OnEnd(RunStatus status, const std::string& error) override;

  void SetDivergedStep(int64_t step);
  // Deletes recorded and buffered metric rows with step > step and recomputes the summary.
  void TruncateAfter(int64_t step);
  // Commits everything buffered now; blocks until done. Throws the first background error.
  void Flush();

  int64_t run_id() const { return run_id_; }
  // Empty while healthy; otherwise the first error of the background thread (sticky).
  std::string error() const;
  // Committed write transactions (flushes), for tests and diagnostics.
  int64_t transactions() const;

  // ---- One-shot helpers on a database file (each opens its own connection). ----

  // Inserts a run without recording into it (the sweep engine's queued runs); returns its id.
  static int64_t CreateRun(const std::string& path, const RunInfo& info,
                           RunStatus status = RunStatus::kQueued);
  // Ids of the runs with this config hash, oldest first.
  static std::vector<int64_t> FindRunsByHash(const std::string& path, const std::string& hash);
  // Terminal statuses (IsTerminal) set ended_at; queued and running clear it.
  static void SetRunStatus(const std::string& path, int64_t run_id, RunStatus status,
                           const std::string& error = "");
  static void SetRunVar(const std::string& path, int64_t run_id, const std::string& key,
                        const std::string& value);
  // Records the layout a run trains with (ranks = dp × ep, CPU threads per rank); rank 0 calls
  // it for the whole run.
  static void SetRunLayout(const std::string& path, int64_t run_id, int ranks, int dp, int ep,
                           int threads);
  // Records that the run's trajectory from `step` on was trained after a resume that changed the
  // thread count or the layout (runs.nondeterministic_from_step; the earliest such step stays).
  static void MarkNondeterministicFrom(const std::string& path, int64_t run_id, int64_t step);
  // Deletes a run and (by cascade) all its rows.
  static void DeleteRun(const std::string& path, int64_t run_id);

 private:
  struct StepRow;
  struct EvalRow;
  struct Batch;
  struct Summary {
    int64_t last_step = 0;
    std::optional<double> last_loss, best_val_loss, last_val_loss, tokens_per_s;
    int64_t eval_step = -1;
    int64_t tokens = 0;
    double flops = 0;
  };

  RunWriter(Connection db, int64_t run_id, const WriterOptions& options);
  void Start();
  void Loop();
  // Writes one batch in one transaction, retrying on SQLITE_BUSY; throws on failure.
  void WriteBatch(const Batch& batch);
  void LoadSummary();

  Connection db_;  // used by the background thread, or under db_mu_ by the caller's thread
  const int64_t run_id_;
  const WriterOptions options_;

  std::mutex db_mu_;
  mutable std::mutex mu_;
  std::condition_variable wake_;  // to the flush thread: work requested or stop
  std::condition_variable done_;  // from the flush thread: a flush finished
  std::unique_ptr<Batch> pending_;
  Summary summary_;
  bool summary_dirty_ = false;
  int64_t last_step_seen_ = 0;
  std::optional<int64_t> diverged_step_;
  int64_t flush_requested_ = 0;
  int64_t flush_done_ = 0;
  bool stop_ = false;
  bool ended_ = false;
  std::string error_;
  int64_t transactions_ = 0;
  std::thread thread_;
};

// A random (version 4) UUID from std::random_device: the identity of a new run row.
std::string NewRunUuid();

// Marks every running run whose heartbeat is older than max_age_s as failed (with an error
// saying so); returns how many. Readers only report such runs as failed; this persists it.
int MarkStaleRunsFailed(const std::string& path, double max_age_s = 30.0);

}  // namespace moelab::db
