#include "db/schema.h"

#include <fmt/format.h>
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <iterator>
#include <thread>

namespace moelab::db {

namespace {

// Append-only: a released migration is never edited, a change is a new entry. Index i (0-based)
// takes the file from user_version i to i + 1.
static const char* kMigrations[] = {
    // 1: runs, their summary, and the per-step metric tables.
    R"sql(
CREATE TABLE sweeps (
  id          INTEGER PRIMARY KEY,
  name        TEXT NOT NULL UNIQUE,
  spec_json   TEXT,
  created_at  REAL NOT NULL
);

CREATE TABLE runs (
  id               INTEGER PRIMARY KEY,
  name             TEXT NOT NULL,
  sweep_id         INTEGER REFERENCES sweeps(id) ON DELETE SET NULL,
  config_json      TEXT NOT NULL,
  config_hash      TEXT NOT NULL,
  status           TEXT NOT NULL CHECK (status IN
                     ('queued', 'running', 'done', 'failed', 'diverged', 'stopped')),
  pid              INTEGER,
  host             TEXT,
  created_at       REAL NOT NULL,
  started_at       REAL,
  heartbeat_at     REAL,
  ended_at         REAL,
  error            TEXT,
  diverged_step    INTEGER,
  checkpoint_path  TEXT,
  checkpoint_step  INTEGER,
  params_total     INTEGER,
  params_active    INTEGER,
  flops_per_token  REAL,
  layers           INTEGER NOT NULL DEFAULT 0,
  heads            INTEGER NOT NULL DEFAULT 0,
  moe_layers       INTEGER NOT NULL DEFAULT 0,
  experts          INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX runs_config_hash ON runs(config_hash);
CREATE INDEX runs_sweep ON runs(sweep_id);

CREATE TABLE run_summary (
  run_id         INTEGER PRIMARY KEY REFERENCES runs(id) ON DELETE CASCADE,
  last_step      INTEGER NOT NULL DEFAULT 0,
  total_steps    INTEGER NOT NULL DEFAULT 0,
  last_loss      REAL,
  best_val_loss  REAL,
  last_val_loss  REAL,
  tokens         INTEGER NOT NULL DEFAULT 0,
  flops          REAL NOT NULL DEFAULT 0,
  tokens_per_s   REAL,
  updated_at     REAL NOT NULL
);

CREATE TABLE run_vars (
  run_id  INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
  key     TEXT NOT NULL,
  value   TEXT,
  PRIMARY KEY (run_id, key)
) WITHOUT ROWID;

CREATE TABLE steps (
  run_id        INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
  step          INTEGER NOT NULL,
  loss          REAL,
  aux_loss      REAL,
  lr            REAL,
  grad_norm     REAL,
  tokens        INTEGER,
  flops         REAL,
  step_time_s   REAL,
  tokens_per_s  REAL,
  wall_time     REAL,
  PRIMARY KEY (run_id, step)
) WITHOUT ROWID;

CREATE TABLE evals (
  run_id     INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
  step       INTEGER NOT NULL,
  tokens     INTEGER,
  flops      REAL,
  val_loss   REAL,
  wall_time  REAL,
  PRIMARY KEY (run_id, step)
) WITHOUT ROWID;

CREATE TABLE max_logits (
  run_id      INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
  step        INTEGER NOT NULL,
  max_logit   BLOB NOT NULL,
  max_logit_raw BLOB,
  PRIMARY KEY (run_id, step)
) WITHOUT ROWID;

CREATE TABLE expert_counts (
  run_id  INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
  step        INTEGER NOT NULL,
  elem_bytes  INTEGER NOT NULL CHECK (elem_bytes IN (4, 8)),
  counts      BLOB NOT NULL,
  PRIMARY KEY (run_id, step)
) WITHOUT ROWID;

CREATE TABLE clip_events (
  run_id  INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
  step    INTEGER NOT NULL,
  layer   INTEGER NOT NULL,
  head    INTEGER NOT NULL,
  s_max   REAL,
  gamma   REAL,
  PRIMARY KEY (run_id, step, layer, head)
) WITHOUT ROWID;
)sql",
    // 2: stored scaling-law fits (moelab fit), shown by the GUI without refitting.
    R"sql(
CREATE TABLE fits (
  id           INTEGER PRIMARY KEY,
  sweep_id     INTEGER REFERENCES sweeps(id) ON DELETE CASCADE,
  created_at   REAL NOT NULL,
  family_key   TEXT NOT NULL,
  form         TEXT NOT NULL,
  options_json TEXT NOT NULL,
  inputs_json  TEXT NOT NULL,
  result_json  TEXT NOT NULL,
  bootstrap_seed INTEGER NOT NULL
);
CREATE INDEX fits_sweep ON fits(sweep_id, family_key, form);
)sql",
    // 3: sweep membership and lifecycle bookkeeping (the sweep engine, sweeps/). A run may
    // belong to several sweeps (a done run is reused by every sweep that expands to its config).
    R"sql(
CREATE TABLE sweep_runs (
  sweep_id        INTEGER NOT NULL REFERENCES sweeps(id) ON DELETE CASCADE,
  run_id          INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
  idx             INTEGER NOT NULL,
  checkpoint_dir  TEXT,
  failures        INTEGER NOT NULL DEFAULT 0,
  retryable       INTEGER NOT NULL DEFAULT 1,
  errors_json     TEXT NOT NULL DEFAULT '[]',
  branch_of       INTEGER REFERENCES runs(id) ON DELETE SET NULL,
  branch_step     INTEGER,
  PRIMARY KEY (sweep_id, run_id)
) WITHOUT ROWID;
CREATE INDEX sweep_runs_run ON sweep_runs(run_id);
)sql",
    // 4: the layout a run trained with (issue 9, distributed training): world size, data- and
    // expert-parallel sizes. One row per distributed run, written by rank 0.
    R"sql(
ALTER TABLE runs ADD COLUMN ranks INTEGER NOT NULL DEFAULT 1;
ALTER TABLE runs ADD COLUMN dp_size INTEGER NOT NULL DEFAULT 1;
ALTER TABLE runs ADD COLUMN ep_size INTEGER NOT NULL DEFAULT 1;
)sql",
    // 5: promotions (issue 12, `moelab promote`): a plan made from a sweep's fit, its predicted
    // loss band and curve, and the run it launched (db/promotions.h, docs/promote.md).
    R"sql(
CREATE TABLE promotions (
  id              INTEGER PRIMARY KEY,
  created_at      REAL NOT NULL,
  sweep_id        INTEGER REFERENCES sweeps(id) ON DELETE SET NULL,
  fit_id          INTEGER REFERENCES fits(id) ON DELETE SET NULL,
  law             TEXT NOT NULL,
  family_key      TEXT NOT NULL DEFAULT '',
  family          TEXT NOT NULL DEFAULT '',
  source_run_id   INTEGER REFERENCES runs(id) ON DELETE SET NULL,
  target_json     TEXT NOT NULL,
  plan_json       TEXT NOT NULL,
  config_json     TEXT NOT NULL,
  out_dir         TEXT NOT NULL DEFAULT '',
  predicted_loss  REAL,
  band_lo         REAL,
  band_hi         REAL,
  run_id          INTEGER REFERENCES runs(id) ON DELETE SET NULL
);
CREATE INDEX promotions_run ON promotions(run_id);
)sql",
    // 6: the RMS of the attention-path norm gains per step (issue 13, QK-Clip: the gains scale
    // q and k together). NULL where a trainer does not compute it.
    R"sql(
ALTER TABLE steps ADD COLUMN norm_gain_rms REAL;
)sql",
    // 7: a run's identity (issue 19): a random UUID per run row, written into its checkpoints
    // (core/train/checkpoint.h) and naming its checkpoint folder, so a run never adopts another
    // run's checkpoints (another database's, or a row of this one). Rows recorded before get
    // one here (version 4 format from SQLite's randomblob); their checkpoints carry none and are
    // adopted only by the run whose checkpoint_path names them (docs/database.md).
    R"sql(
ALTER TABLE runs ADD COLUMN uuid TEXT;
UPDATE runs SET uuid = lower(hex(randomblob(4)) || '-' || hex(randomblob(2)) || '-4' ||
  substr(hex(randomblob(2)), 2) || '-' || substr('89ab', 1 + (abs(random()) % 4), 1) ||
  substr(hex(randomblob(2)), 2) || '-' || hex(randomblob(6)));
CREATE UNIQUE INDEX runs_uuid ON runs(uuid);
)sql",
    // 8: determinism across resumes (issue 37): the CPU thread count a run last trained with
    // (NULL before: the stored config's train.threads), and the first step trained after a
    // resume that changed the thread count or the rank layout (--allow-nondeterministic-resume);
    // NULL while one layout produced the whole trajectory (bit-for-bit reproducible).
    R"sql(
ALTER TABLE runs ADD COLUMN threads INTEGER;
ALTER TABLE runs ADD COLUMN nondeterministic_from_step INTEGER;
)sql",
    // 9: adaptive sweeps (issue 38): each batch the chooser picked (the sweep's run indices, why,
    // its FLOPs), written before the batch starts so a killed sweep resumes its own choices; and
    // each look at the estimand after a batch (repeated interval, α spent, the decision).
    R"sql(
CREATE TABLE adaptive_batches (
  sweep_id    INTEGER NOT NULL REFERENCES sweeps(id) ON DELETE CASCADE,
  batch       INTEGER NOT NULL,
  runs_json   TEXT NOT NULL,
  why_json    TEXT NOT NULL,
  cost_flops  REAL NOT NULL,
  created_at  REAL NOT NULL,
  PRIMARY KEY (sweep_id, batch)
) WITHOUT ROWID;
CREATE TABLE adaptive_looks (
  sweep_id     INTEGER NOT NULL REFERENCES sweeps(id) ON DELETE CASCADE,
  batch        INTEGER NOT NULL,
  seeds        INTEGER NOT NULL,
  estimate     REAL,
  lo           REAL,
  hi           REAL,
  critical     REAL,
  alpha_spent  REAL,
  spent_flops  REAL NOT NULL,
  decision     TEXT NOT NULL,
  detail_json  TEXT NOT NULL,
  created_at   REAL NOT NULL,
  PRIMARY KEY (sweep_id, batch)
) WITHOUT ROWID;
)sql",
};

constexpr int kNumMigrations = static_cast<int>(std::size(kMigrations));

void Configure(Connection& db, double busy_timeout_s) {
  sqlite3_busy_timeout(db.get(), static_cast<int>(busy_timeout_s * 1000));
  db.Exec("PRAGMA foreign_keys = ON");
}

}  // namespace

int SchemaVersion() { return kNumMigrations; }

int Migrate(Connection& db) {
  if (db.QueryInt("PRAGMA user_version") >= kNumMigrations) return 0;
  // Every pending migration in one transaction: a reader never sees a half-migrated file (a fresh
  // file goes from version 0 straight to the newest). IMMEDIATE takes the write lock before
  // re-reading the version, so two processes opening a fresh file at once cannot both apply one.
  int applied = 0;
  db.Exec("BEGIN IMMEDIATE");
  try {
    for (int i = static_cast<int>(db.QueryInt("PRAGMA user_version")); i < kNumMigrations; ++i) {
      db.Exec(kMigrations[i]);
      db.Exec(fmt::format("PRAGMA user_version = {}", i + 1));
      ++applied;
    }
    db.Exec("COMMIT");
  } catch (...) {
    sqlite3_exec(db.get(), "ROLLBACK", nullptr, nullptr, nullptr);
    throw;
  }
  return applied;
}

Connection OpenForWrite(const std::string& path, double busy_timeout_s) {
  // Every writer (train, sweep run, fit, promote, merge, migrate) creates the file's folder as
  // it creates the file: `--db runs/my.db` works in a fresh checkout (docs/database.md).
  if (const std::filesystem::path dir = std::filesystem::path(path).parent_path(); !dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec && !std::filesystem::is_directory(dir)) {
      throw std::runtime_error(fmt::format("cannot create the folder '{}' of database '{}': {}",
                                           dir.string(), path, ec.message()));
    }
  }
  Connection db(path, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE);
  Configure(db, busy_timeout_s);
  const int64_t version = db.QueryInt("PRAGMA user_version");
  if (version > kNumMigrations) {
    throw std::runtime_error(fmt::format(
        "database '{}' has schema version {}, newer than this build's {}; use a newer moelab", path,
        version, kNumMigrations));
  }
  // WAL lets readers (GUI, analysis) poll while a trainer writes; the mode is persistent in
  // the file, so this only does work the first time. NORMAL is durable up to the last
  // checkpoint under WAL and never corrupts on a crash, which is the guarantee we need.
  // Switching needs an exclusive lock, and SQLite does not always run the busy handler for it
  // (several processes opening a fresh file at once), so retry here up to the same timeout.
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::duration<double>(std::max(busy_timeout_s, 0.1));
  for (int attempt = 0;; ++attempt) {
    try {
      Statement mode = db.Prepare("PRAGMA journal_mode = WAL");
      if (!mode.Step() || mode.Text(0) != "wal") {
        throw std::runtime_error(fmt::format("could not switch '{}' to WAL journal mode", path));
      }
      break;
    } catch (const SqliteError& e) {
      if (!e.busy() || std::chrono::steady_clock::now() > deadline) throw;
      std::this_thread::sleep_for(std::chrono::milliseconds(5 + 5 * std::min(attempt, 20)));
    }
  }
  db.Exec("PRAGMA synchronous = NORMAL");
  Migrate(db);
  return db;
}

Connection OpenForRead(const std::string& path, double busy_timeout_s) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    throw std::runtime_error(fmt::format("database '{}' does not exist", path));
  }
  // No PRAGMA that writes: foreign keys only matter to writers.
  Connection db = OpenReadOnly(path, busy_timeout_s);
  int64_t version = 0;
  try {
    version = db.QueryInt("PRAGMA user_version");
  } catch (const SqliteError& e) {
    throw std::runtime_error(
        fmt::format("'{}' is not a readable SQLite database: {}", path, e.what()));
  }
  const bool has_runs =
      db.QueryInt("SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name = 'runs'");
  if (version == 0 || !has_runs) {
    throw std::runtime_error(fmt::format("'{}' is not a moelab database (no runs table)", path));
  }
  if (version > kNumMigrations) {
    throw std::runtime_error(fmt::format(
        "database '{}' has schema version {}, newer than this build's {}; use a newer moelab", path,
        version, kNumMigrations));
  }
  if (version < kNumMigrations) {
    throw std::runtime_error(fmt::format(
        "database '{}' has the older schema version {} (this build: {}); upgrade it with "
        "`moelab db migrate --db {}`",
        path, version, kNumMigrations, path));
  }
  return db;
}

std::string IntegrityCheck(const std::string& path) {
  Connection db(path, SQLITE_OPEN_READONLY);
  sqlite3_busy_timeout(db.get(), 10000);
  Statement st = db.Prepare("PRAGMA integrity_check");
  std::string result;
  while (st.Step()) {
    if (!result.empty()) result += "\n";
    result += st.Text(0);
  }
  return result;
}

}  // namespace moelab::db
