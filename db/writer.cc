#include "db/writer.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <limits>
#include <random>
#include <utility>

#include "core/host.h"
#include "db/schema.h"

namespace moelab::db {

// Blobs are written in native byte order; the docs promise little-endian.
static_assert(std::endian::native == std::endian::little, "moelab db blobs are little-endian");

namespace {

void RecomputeSummary(Connection& db, int64_t run_id) {
  db.Prepare(
        "INSERT INTO run_summary (run_id, updated_at) VALUES (?1, ?2) "
        "ON CONFLICT (run_id) DO NOTHING")
      .Bind(1, run_id)
      .Bind(2, UnixNow())
      .Run();
  db.Prepare(R"sql(
UPDATE run_summary SET
  last_step = COALESCE((SELECT MAX(step) FROM steps WHERE run_id = ?1), 0),
  last_loss = (SELECT loss FROM steps WHERE run_id = ?1 ORDER BY step DESC LIMIT 1),
  tokens = COALESCE((SELECT tokens FROM steps WHERE run_id = ?1 ORDER BY step DESC LIMIT 1), 0),
  flops = COALESCE((SELECT flops FROM steps WHERE run_id = ?1 ORDER BY step DESC LIMIT 1), 0),
  tokens_per_s = (SELECT tokens_per_s FROM steps WHERE run_id = ?1 ORDER BY step DESC LIMIT 1),
  best_val_loss = (SELECT MIN(val_loss) FROM evals WHERE run_id = ?1),
  last_val_loss = (SELECT val_loss FROM evals WHERE run_id = ?1 ORDER BY step DESC LIMIT 1),
  updated_at = ?2
WHERE run_id = ?1)sql")
      .Bind(1, run_id)
      .Bind(2, UnixNow())
      .Run();
}

void DeleteAfter(Connection& db, int64_t run_id, int64_t step) {
  for (const char* table : {"steps", "evals", "max_logits", "expert_counts", "clip_events"}) {
    db.Prepare(fmt::format("DELETE FROM {} WHERE run_id = ?1 AND step > ?2", table))
        .Bind(1, run_id)
        .Bind(2, step)
        .Run();
  }
}

void CheckRunExists(Connection& db, int64_t run_id) {
  Statement st = db.Prepare("SELECT 1 FROM runs WHERE id = ?1");
  st.Bind(1, run_id);
  if (!st.Step()) {
    throw std::runtime_error(fmt::format("run {} not found in '{}'", run_id, db.path()));
  }
}

}  // namespace

struct RunWriter::StepRow {
  StepRecord record;
  double wall_time = 0;
  std::vector<float> max_logit;
  std::vector<float> max_logit_raw;  // empty when equal to max_logit
  std::vector<int64_t> expert_counts;
};

struct RunWriter::EvalRow {
  int64_t step = 0;
  int64_t tokens = 0;
  double flops = 0;
  double val_loss = 0;
  double wall_time = 0;
};

struct RunWriter::Batch {
  struct End {
    RunStatus status = RunStatus::kFailed;
    std::string error;
    std::optional<int64_t> diverged_step;
  };
  std::vector<StepRow> steps;
  std::vector<EvalRow> evals;
  std::vector<ClipEvent> clips;
  bool heartbeat = false;
  std::optional<std::pair<int64_t, std::string>> checkpoint;
  std::optional<Summary> summary;
  std::optional<End> end;

  bool empty() const {
    return steps.empty() && evals.empty() && clips.empty() && !heartbeat && !checkpoint &&
           !summary && !end;
  }
  // Puts an unwritten (failed) batch back in front of what arrived since, newest state winning.
  void PrependFailed(Batch&& failed) {
    failed.steps.insert(failed.steps.end(), std::make_move_iterator(steps.begin()),
                        std::make_move_iterator(steps.end()));
    steps = std::move(failed.steps);
    failed.evals.insert(failed.evals.end(), evals.begin(), evals.end());
    evals = std::move(failed.evals);
    failed.clips.insert(failed.clips.end(), clips.begin(), clips.end());
    clips = std::move(failed.clips);
    heartbeat = heartbeat || failed.heartbeat;
    if (!checkpoint) checkpoint = std::move(failed.checkpoint);
    if (!end) end = std::move(failed.end);
  }
};

// ---- Construction -------------------------------------------------------------------------

RunWriter::RunWriter(Connection db, int64_t run_id, const WriterOptions& options)
    : db_(std::move(db)), run_id_(run_id), options_(options), pending_(std::make_unique<Batch>()) {}

void RunWriter::Start() {
  thread_ = std::thread([this] { Loop(); });
}

int64_t RunWriter::CreateRun(const std::string& path, const RunInfo& info, RunStatus status) {
  Connection db = OpenForWrite(path);
  int64_t id = 0;
  WriteTransaction(db, WriterOptions{}.busy_retries, [&] {
    const double now = UnixNow();
    const bool running = status == RunStatus::kRunning;
    const RunShape& s = info.shape;
    db.Prepare(R"sql(
INSERT INTO runs (name, sweep_id, config_json, config_hash, status, pid, host, created_at,
                  started_at, heartbeat_at, params_total, params_active, flops_per_token,
                  layers, heads, moe_layers, experts, uuid)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17))sql")
        .BindAll(info.name, info.sweep_id, info.config_json, info.config_hash, ToString(status),
                 running ? std::optional<int64_t>(info.pid ? info.pid : getpid()) : std::nullopt,
                 running ? std::optional<std::string>(info.host.empty() ? HostName() : info.host)
                         : std::nullopt,
                 now, running ? std::optional<double>(now) : std::nullopt, s.params_total,
                 s.params_active, s.flops_per_token, s.layers, s.heads, s.moe_layers, s.experts,
                 NewRunUuid())
        .Run();
    id = db.last_insert_rowid();
    db.Prepare("INSERT INTO run_summary (run_id, total_steps, updated_at) VALUES (?1, ?2, ?3)")
        .Bind(1, id)
        .Bind(2, s.total_steps)
        .Bind(3, now)
        .Run();
  });
  return id;
}

std::unique_ptr<RunWriter> RunWriter::Create(const std::string& path, const RunInfo& info,
                                             const WriterOptions& options) {
  const int64_t id = CreateRun(path, info, RunStatus::kRunning);
  std::unique_ptr<RunWriter> w(
      new RunWriter(OpenForWrite(path, options.busy_timeout_s), id, options));
  w->Start();
  return w;
}

std::unique_ptr<RunWriter> RunWriter::Attach(const std::string& path, int64_t run_id,
                                             int64_t resume_step,
                                             const std::optional<RunShape>& shape,
                                             const WriterOptions& options) {
  std::unique_ptr<RunWriter> w(
      new RunWriter(OpenForWrite(path, options.busy_timeout_s), run_id, options));
  Connection& db = w->db_;
  WriteTransaction(db, options.busy_retries, [&] {
    CheckRunExists(db, run_id);
    const double now = UnixNow();
    db.Prepare(R"sql(
UPDATE runs SET status = ?5, pid = ?2, host = ?3, started_at = COALESCE(started_at, ?4),
  heartbeat_at = ?4, ended_at = NULL, error = NULL, diverged_step = NULL
WHERE id = ?1)sql")
        .BindAll(run_id, static_cast<int64_t>(getpid()), HostName(), now,
                 ToString(RunStatus::kRunning))
        .Run();
    if (shape) {
      db.Prepare(R"sql(
UPDATE runs SET params_total = ?2, params_active = ?3, flops_per_token = ?4, layers = ?5,
  heads = ?6, moe_layers = ?7, experts = ?8
WHERE id = ?1)sql")
          .BindAll(run_id, shape->params_total, shape->params_active, shape->flops_per_token,
                   shape->layers, shape->heads, shape->moe_layers, shape->experts)
          .Run();
    }
    DeleteAfter(db, run_id, resume_step);
    RecomputeSummary(db, run_id);
    if (shape) {
      db.Prepare("UPDATE run_summary SET total_steps = ?2 WHERE run_id = ?1")
          .Bind(1, run_id)
          .Bind(2, shape->total_steps)
          .Run();
    }
  });
  w->LoadSummary();
  w->Start();
  return w;
}

void RunWriter::LoadSummary() {
  Statement st = db_.Prepare(
      "SELECT last_step, last_loss, best_val_loss, last_val_loss, tokens, flops, tokens_per_s, "
      "(SELECT MAX(step) FROM evals WHERE run_id = ?1) FROM run_summary WHERE run_id = ?1");
  st.Bind(1, run_id_);
  Summary s;
  if (st.Step()) {
    s.last_step = st.Int(0);
    s.last_loss = st.OptReal(1);
    s.best_val_loss = st.OptReal(2);
    s.last_val_loss = st.OptReal(3);
    s.tokens = st.Int(4);
    s.flops = st.Real(5);
    s.tokens_per_s = st.OptReal(6);
    s.eval_step = st.OptInt(7).value_or(-1);
  }
  std::lock_guard lk(mu_);
  summary_ = s;
  last_step_seen_ = s.last_step;
  summary_dirty_ = false;
}

RunWriter::~RunWriter() {
  {
    std::lock_guard lk(mu_);
    // A writer dropped without OnEnd means the trainer unwound on an error it did not report;
    // say so now rather than leave the run "running" until its heartbeat goes stale.
    if (!ended_) {
      pending_->end =
          Batch::End{RunStatus::kFailed, "the trainer closed its recorder without ending the run",
                     std::nullopt};
      ended_ = true;
    }
    stop_ = true;
    ++flush_requested_;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
  std::lock_guard lk(mu_);
  if (!error_.empty()) {
    std::fprintf(stderr, "moelab db: run %lld: %s\n", static_cast<long long>(run_id_),
                 error_.c_str());
  }
}

// ---- MetricsSink --------------------------------------------------------------------------

void RunWriter::OnStep(const StepRecord& record, const StepStats& stats) {
  StepRow row;
  row.record = record;
  row.wall_time = UnixNow();
  row.max_logit = stats.max_logit;
  if (stats.max_logit_raw != stats.max_logit) row.max_logit_raw = stats.max_logit_raw;
  row.expert_counts = stats.expert_counts;
  std::lock_guard lk(mu_);
  pending_->steps.push_back(std::move(row));
  last_step_seen_ = record.step;
  // A re-reported earlier step (after a truncation) must not move the summary backwards.
  if (record.step >= summary_.last_step) {
    summary_.last_step = record.step;
    summary_.last_loss = record.loss;
    summary_.tokens = record.tokens;
    summary_.flops = record.flops;
    summary_.tokens_per_s = record.tokens_per_s;
    summary_dirty_ = true;
  }
}

void RunWriter::OnEval(int64_t step, int64_t tokens, double flops, double val_loss) {
  std::lock_guard lk(mu_);
  pending_->evals.push_back(EvalRow{step, tokens, flops, val_loss, UnixNow()});
  if (step >= summary_.eval_step) {
    summary_.eval_step = step;
    summary_.last_val_loss = val_loss;
  }
  if (!std::isnan(val_loss) && (!summary_.best_val_loss || std::isnan(*summary_.best_val_loss) ||
                                val_loss < *summary_.best_val_loss)) {
    summary_.best_val_loss = val_loss;
  }
  summary_dirty_ = true;
}

void RunWriter::OnClip(const std::vector<ClipEvent>& events) {
  std::lock_guard lk(mu_);
  pending_->clips.insert(pending_->clips.end(), events.begin(), events.end());
}

void RunWriter::OnHeartbeat() {
  std::lock_guard lk(mu_);
  pending_->heartbeat = true;
}

void RunWriter::OnCheckpoint(int64_t step, const std::string& path) {
  {
    std::lock_guard lk(mu_);
    pending_->checkpoint.emplace(step, path);
  }
  Flush();
}

void RunWriter::SetDivergedStep(int64_t step) {
  std::lock_guard lk(mu_);
  diverged_step_ = step;
}

void RunWriter::OnEnd(RunStatus status, const std::string& error) {
  {
    std::lock_guard lk(mu_);
    Batch::End end{status, error, std::nullopt};
    if (status == RunStatus::kDiverged)
      end.diverged_step = diverged_step_.value_or(last_step_seen_);
    pending_->end = std::move(end);
    ended_ = true;
  }
  Flush();
}

void RunWriter::Flush() {
  std::unique_lock lk(mu_);
  const int64_t target = ++flush_requested_;
  wake_.notify_all();
  done_.wait(lk, [&] { return flush_done_ >= target; });
  if (!error_.empty()) {
    throw std::runtime_error(
        fmt::format("recording run {} into '{}' failed: {}", run_id_, db_.path(), error_));
  }
}

std::string RunWriter::error() const {
  std::lock_guard lk(mu_);
  return error_;
}

int64_t RunWriter::transactions() const {
  std::lock_guard lk(mu_);
  return transactions_;
}

void RunWriter::TruncateAfter(int64_t step) {
  // Commit what is buffered first: a batch the flush thread already holds could otherwise land
  // after the delete and bring the dropped steps back.
  Flush();
  {
    std::lock_guard db_lk(db_mu_);
    WriteTransaction(db_, options_.busy_retries, [&] {
      DeleteAfter(db_, run_id_, step);
      RecomputeSummary(db_, run_id_);
    });
  }
  LoadSummary();
}

// ---- Background flushing ------------------------------------------------------------------

void RunWriter::Loop() {
  const auto interval = std::chrono::duration<double>(options_.flush_interval_s);
  std::unique_lock lk(mu_);
  for (;;) {
    wake_.wait_for(lk, interval, [&] { return stop_ || flush_requested_ > flush_done_; });
    const bool stopping = stop_;
    const int64_t target = flush_requested_;
    std::unique_ptr<Batch> batch = std::exchange(pending_, std::make_unique<Batch>());
    if (summary_dirty_) batch->summary = summary_;
    summary_dirty_ = false;
    lk.unlock();

    bool ok = true;
    std::string failure;
    if (!batch->empty()) {
      try {
        std::lock_guard db_lk(db_mu_);
        WriteBatch(*batch);
      } catch (const std::exception& e) {
        ok = false;
        failure = e.what();
      }
    }

    lk.lock();
    if (!batch->empty()) {
      if (ok) {
        ++transactions_;
      } else {
        if (error_.empty()) error_ = failure;
        // Keep the rows: the next flush retries them, and INSERT OR REPLACE makes that safe.
        if (batch->summary) summary_dirty_ = true;
        pending_->PrependFailed(std::move(*batch));
      }
    }
    flush_done_ = std::max(flush_done_, target);
    done_.notify_all();
    if (stopping) break;
  }
}

void RunWriter::WriteBatch(const Batch& b) {
  WriteTransaction(db_, options_.busy_retries, [&] {
    const double now = UnixNow();
    if (!b.steps.empty()) {
      Statement st = db_.Prepare(R"sql(
INSERT OR REPLACE INTO steps (run_id, step, loss, aux_loss, lr, grad_norm, tokens, flops,
                              step_time_s, tokens_per_s, wall_time, norm_gain_rms)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12))sql");
      Statement ml = db_.Prepare(
          "INSERT OR REPLACE INTO max_logits (run_id, step, max_logit, max_logit_raw) "
          "VALUES (?1, ?2, ?3, ?4)");
      Statement ec = db_.Prepare(
          "INSERT OR REPLACE INTO expert_counts (run_id, step, elem_bytes, counts) "
          "VALUES (?1, ?2, ?3, ?4)");
      std::vector<int32_t> narrow;
      for (const StepRow& row : b.steps) {
        const StepRecord& r = row.record;
        st.BindAll(run_id_, r.step, r.loss, r.aux_loss, r.lr, r.grad_norm, r.tokens, r.flops,
                   r.step_time_s, r.tokens_per_s, row.wall_time);
        if (std::isfinite(r.norm_gain_rms)) {
          st.Bind(12, r.norm_gain_rms);
        } else {
          st.BindNull(12);
        }
        st.Run();
        if (!row.max_logit.empty()) {
          ml.Bind(1, run_id_).Bind(2, r.step);
          ml.BindBlob(3, row.max_logit.data(), row.max_logit.size() * sizeof(float));
          if (row.max_logit_raw.empty()) {
            ml.BindNull(4);
          } else {
            ml.BindBlob(4, row.max_logit_raw.data(), row.max_logit_raw.size() * sizeof(float));
          }
          ml.Run();
        }
        if (!row.expert_counts.empty()) {
          // int32 halves the largest per-step blob; int64 only when a count needs it.
          const bool fits =
              std::all_of(row.expert_counts.begin(), row.expert_counts.end(), [](int64_t c) {
                return c >= std::numeric_limits<int32_t>::min() &&
                       c <= std::numeric_limits<int32_t>::max();
              });
          ec.Bind(1, run_id_).Bind(2, r.step);
          if (fits) {
            narrow.assign(row.expert_counts.begin(), row.expert_counts.end());
            ec.Bind(3, 4).BindBlob(4, narrow.data(), narrow.size() * sizeof(int32_t));
          } else {
            ec.Bind(3, 8).BindBlob(4, row.expert_counts.data(),
                                   row.expert_counts.size() * sizeof(int64_t));
          }
          ec.Run();
        }
      }
    }
    if (!b.evals.empty()) {
      Statement st = db_.Prepare(
          "INSERT OR REPLACE INTO evals (run_id, step, tokens, flops, val_loss, wall_time) "
          "VALUES (?1, ?2, ?3, ?4, ?5, ?6)");
      for (const EvalRow& e : b.evals) {
        st.BindAll(run_id_, e.step, e.tokens, e.flops, e.val_loss, e.wall_time).Run();
      }
    }
    if (!b.clips.empty()) {
      Statement st = db_.Prepare(
          "INSERT OR REPLACE INTO clip_events (run_id, step, layer, head, s_max, gamma) "
          "VALUES (?1, ?2, ?3, ?4, ?5, ?6)");
      for (const ClipEvent& c : b.clips) {
        st.BindAll(run_id_, c.step, c.layer, c.head, c.s_max, c.gamma).Run();
      }
    }
    if (b.summary) {
      const Summary& s = *b.summary;
      db_.Prepare(R"sql(
UPDATE run_summary SET last_step = ?2, last_loss = ?3, best_val_loss = ?4, last_val_loss = ?5,
  tokens = ?6, flops = ?7, tokens_per_s = ?8, updated_at = ?9
WHERE run_id = ?1)sql")
          .BindAll(run_id_, s.last_step, s.last_loss, s.best_val_loss, s.last_val_loss, s.tokens,
                   s.flops, s.tokens_per_s, now)
          .Run();
    }
    if (b.checkpoint) {
      db_.Prepare("UPDATE runs SET checkpoint_step = ?2, checkpoint_path = ?3 WHERE id = ?1")
          .Bind(1, run_id_)
          .Bind(2, b.checkpoint->first)
          .Bind(3, b.checkpoint->second)
          .Run();
    }
    // Any flush proves the trainer alive, not only an explicit OnHeartbeat.
    db_.Prepare("UPDATE runs SET heartbeat_at = ?2 WHERE id = ?1")
        .Bind(1, run_id_)
        .Bind(2, now)
        .Run();
    if (b.end) {
      db_.Prepare(R"sql(
UPDATE runs SET status = ?2, ended_at = ?3, error = NULLIF(?4, ''), diverged_step = ?5
WHERE id = ?1)sql")
          .BindAll(run_id_, ToString(b.end->status), now, b.end->error, b.end->diverged_step)
          .Run();
    }
  });
}

// ---- One-shot helpers ---------------------------------------------------------------------

std::vector<int64_t> RunWriter::FindRunsByHash(const std::string& path, const std::string& hash) {
  Connection db = OpenForWrite(path);
  Statement st = db.Prepare("SELECT id FROM runs WHERE config_hash = ?1 ORDER BY id");
  st.Bind(1, hash);
  std::vector<int64_t> ids;
  while (st.Step()) ids.push_back(st.Int(0));
  return ids;
}

void RunWriter::SetRunStatus(const std::string& path, int64_t run_id, RunStatus status,
                             const std::string& error) {
  Connection db = OpenForWrite(path);
  WriteTransaction(db, WriterOptions{}.busy_retries, [&] {
    CheckRunExists(db, run_id);
    const bool terminal = IsTerminal(status);
    db.Prepare(R"sql(
UPDATE runs SET status = ?2, error = NULLIF(?3, ''),
  ended_at = CASE WHEN ?4 THEN ?5 ELSE NULL END
WHERE id = ?1)sql")
        .BindAll(run_id, ToString(status), error, terminal ? 1 : 0, UnixNow())
        .Run();
  });
}

void RunWriter::SetRunVar(const std::string& path, int64_t run_id, const std::string& key,
                          const std::string& value) {
  Connection db = OpenForWrite(path);
  WriteTransaction(db, WriterOptions{}.busy_retries, [&] {
    CheckRunExists(db, run_id);
    db.Prepare("INSERT OR REPLACE INTO run_vars (run_id, key, value) VALUES (?1, ?2, ?3)")
        .Bind(1, run_id)
        .Bind(2, key)
        .Bind(3, value)
        .Run();
  });
}

void RunWriter::SetRunLayout(const std::string& path, int64_t run_id, int ranks, int dp, int ep,
                             int threads) {
  Connection db = OpenForWrite(path);
  WriteTransaction(db, WriterOptions{}.busy_retries, [&] {
    CheckRunExists(db, run_id);
    db.Prepare("UPDATE runs SET ranks = ?2, dp_size = ?3, ep_size = ?4, threads = ?5 WHERE id = ?1")
        .BindAll(run_id, int64_t{ranks}, int64_t{dp}, int64_t{ep}, int64_t{threads})
        .Run();
  });
}

void RunWriter::MarkNondeterministicFrom(const std::string& path, int64_t run_id, int64_t step) {
  Connection db = OpenForWrite(path);
  WriteTransaction(db, WriterOptions{}.busy_retries, [&] {
    CheckRunExists(db, run_id);
    db.Prepare(
          "UPDATE runs SET nondeterministic_from_step = min(coalesce(nondeterministic_from_step, "
          "?2), ?2) WHERE id = ?1")
        .Bind(1, run_id)
        .Bind(2, step)
        .Run();
  });
}

void RunWriter::DeleteRun(const std::string& path, int64_t run_id) {
  Connection db = OpenForWrite(path);
  WriteTransaction(db, WriterOptions{}.busy_retries, [&] {
    CheckRunExists(db, run_id);
    db.Prepare("DELETE FROM runs WHERE id = ?1").Bind(1, run_id).Run();
  });
}

std::string NewRunUuid() {
  std::random_device rd;  // /dev/urandom on Linux: two processes never draw the same sequence
  std::array<uint8_t, 16> b;
  for (size_t i = 0; i < b.size(); i += 4) {
    const uint32_t r = rd();
    std::memcpy(&b[i], &r, 4);
  }
  b[6] = static_cast<uint8_t>((b[6] & 0x0f) | 0x40);  // version 4
  b[8] = static_cast<uint8_t>((b[8] & 0x3f) | 0x80);  // RFC 4122 variant
  std::string s;
  for (size_t i = 0; i < b.size(); ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) s += '-';
    s += fmt::format("{:02x}", b[i]);
  }
  return s;
}

int MarkStaleRunsFailed(const std::string& path, double max_age_s) {
  Connection db = OpenForWrite(path);
  int changed = 0;
  WriteTransaction(db, WriterOptions{}.busy_retries, [&] {
    db.Prepare(R"sql(
UPDATE runs SET status = ?3,
  ended_at = COALESCE(heartbeat_at, started_at, created_at),
  error = printf('no heartbeat for %.0f s (the trainer was killed or hung)',
                 ?1 - COALESCE(heartbeat_at, started_at, created_at))
WHERE status = ?4 AND COALESCE(heartbeat_at, started_at, created_at) < ?1 - ?2)sql")
        .BindAll(UnixNow(), max_age_s, ToString(RunStatus::kFailed), ToString(RunStatus::kRunning))
        .Run();
    changed = db.changes();
  });
  return changed;
}

}  // namespace moelab::db
