// db/: schema migrations, the batched writer, the read-only reader, and the crash and
// concurrency guarantees the trainer, sweep engine and GUI rely on. Multi-process tests fork:
// each child opens its own connections after the fork and leaves with _exit.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "db/merge.h"
#include "db/promotions.h"
#include "db/reader.h"
#include "db/schema.h"
#include "db/writer.h"
#include "tests/common/test_util.h"
#include "tests/db/schema_rollback.h"

namespace moelab::db {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

constexpr int kLayers = 2, kHeads = 3, kMoeLayers = 2, kExperts = 4;

RunInfo TestRun(const std::string& name, const std::string& hash = "hash-a") {
  RunInfo info;
  info.name = name;
  info.config_json = R"({"model":{"layers":2}})";
  info.config_hash = hash;
  info.shape = RunShape{kLayers, kHeads, kMoeLayers, kExperts, 1000, 400, 6.0e3, 100};
  return info;
}

StepRecord Record(int64_t step, double loss) {
  StepRecord r;
  r.step = step;
  r.loss = loss;
  r.aux_loss = 0.01 * step;
  r.lr = 1e-3;
  r.grad_norm = 0.5;
  r.tokens = step * 64;
  r.flops = step * 64 * 6.0e3;
  r.step_time_s = 0.01;
  r.tokens_per_s = 6400;
  if (step % 2 == 0) r.norm_gain_rms = 1.0 + 0.01 * step;  // odd steps: not computed (NULL)
  return r;
}

StepStats Stats(int64_t step) {
  StepStats s;
  for (int i = 0; i < kLayers * kHeads; ++i) s.max_logit.push_back(float(step + 0.1 * i));
  s.max_logit_raw = s.max_logit;
  for (int i = 0; i < kMoeLayers * kExperts; ++i) s.expert_counts.push_back(step * 10 + i);
  return s;
}

// Runs f in a forked child; its return value (or 99 on an exception) is the exit code.
pid_t Spawn(const std::function<int()>& f) { return test::SpawnFunction(f); }
using test::Wait;

int64_t CountRows(const std::string& path, const std::string& table, int64_t run_id) {
  Connection db = OpenForRead(path);
  return db.QueryInt("SELECT COUNT(*) FROM " + table + " WHERE run_id = " + std::to_string(run_id));
}

class DbTest : public ::testing::Test {
 protected:
  void SetUp() override {
    tmp_ = std::make_unique<test::TempDir>("db");
    dir_ = tmp_->path().string();
    path_ = dir_ + "/runs.db";
  }
  void TearDown() override { tmp_.reset(); }  // kept when the test failed
  std::unique_ptr<test::TempDir> tmp_;
  std::string dir_, path_;
};

// ---- Schema -------------------------------------------------------------------------------

TEST_F(DbTest, MigrationsCreateSchemaAndAreIdempotent) {
  {
    Connection db = OpenForWrite(path_);
    EXPECT_EQ(db.QueryInt("PRAGMA user_version"), SchemaVersion());
    EXPECT_GE(SchemaVersion(), 1);
    for (const char* table : {"runs", "run_summary", "steps", "evals", "max_logits",
                              "expert_counts", "clip_events", "run_vars", "sweeps"}) {
      EXPECT_EQ(db.QueryInt(std::string("SELECT COUNT(*) FROM sqlite_master WHERE name = '") +
                            table + "'"),
                1)
          << table;
    }
    Statement mode = db.Prepare("PRAGMA journal_mode");
    ASSERT_TRUE(mode.Step());
    EXPECT_EQ(mode.Text(0), "wal");
    EXPECT_EQ(db.QueryInt("PRAGMA foreign_keys"), 1);
    EXPECT_EQ(Migrate(db), 0);
  }
  Connection again = OpenForWrite(path_);
  EXPECT_EQ(again.QueryInt("PRAGMA user_version"), SchemaVersion());
  EXPECT_EQ(Migrate(again), 0);
  EXPECT_EQ(IntegrityCheck(path_), "ok");
}

// Migration 7 (issue 19): every run has a UUID. Rows recorded before it get distinct random
// ones; new rows get one from the writer; no two runs share one.
TEST_F(DbTest, EveryRunHasItsOwnUuidAfterMigrationSeven) {
  const int64_t old1 = RunWriter::CreateRun(path_, TestRun("old1"));
  const int64_t old2 = RunWriter::CreateRun(path_, TestRun("old2"));
  {  // Roll the file back to schema 6: the runs of an older database have no uuid column.
    Connection c(path_, SQLITE_OPEN_READWRITE);
    test_schema::RollBackToSchema6(c);
  }
  const int64_t fresh = RunWriter::CreateRun(path_, TestRun("new"));  // migrates first
  Reader reader(path_);
  const std::string u1 = reader.GetRun(old1)->uuid, u2 = reader.GetRun(old2)->uuid,
                    u3 = reader.GetRun(fresh)->uuid;
  for (const std::string& u : {u1, u2, u3}) {
    ASSERT_EQ(u.size(), 36u) << u;
    EXPECT_EQ(u[8], '-');
    EXPECT_EQ(u[14], '4') << u;  // version 4
    EXPECT_NE(std::string("89ab").find(u[19]), std::string::npos) << u;
    EXPECT_EQ(u.find_first_not_of("0123456789abcdef-"), std::string::npos) << u;
  }
  EXPECT_NE(u1, u2);
  EXPECT_NE(u1, u3);
  EXPECT_NE(NewRunUuid(), NewRunUuid());
  Connection c(path_, SQLITE_OPEN_READWRITE);
  EXPECT_THROW(c.Exec("UPDATE runs SET uuid = '" + u1 + "' WHERE id = " + std::to_string(old2)),
               SqliteError);
}

TEST_F(DbTest, ReaderRejectsMissingForeignAndNewerFiles) {
  EXPECT_THROW(
      {
        try {
          Reader r(dir_ + "/missing.db");
        } catch (const std::runtime_error& e) {
          EXPECT_NE(std::string(e.what()).find("does not exist"), std::string::npos);
          throw;
        }
      },
      std::runtime_error);
  {
    Connection foreign(dir_ + "/foreign.db", SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE);
    foreign.Exec("CREATE TABLE t (x)");
  }
  EXPECT_THROW(Reader(dir_ + "/foreign.db"), std::runtime_error);
  {
    Connection db = OpenForWrite(path_);
    db.Exec("PRAGMA user_version = 999");
  }
  EXPECT_THROW(Reader{path_}, std::runtime_error);
  EXPECT_THROW(OpenForWrite(path_), std::runtime_error);
}

// ---- Writer -> reader ---------------------------------------------------------------------

TEST_F(DbTest, RoundTripOfEveryRecordKind) {
  int64_t id = 0;
  {
    auto w = RunWriter::Create(path_, TestRun("round-trip"));
    id = w->run_id();
    for (int64_t s = 1; s <= 10; ++s) {
      if (s == 7) continue;  // a step without stats must not break the nearest-step lookup
      StepStats stats = Stats(s);
      if (s == 8) stats.max_logit_raw[0] = 100.0f;            // soft-capped: raw differs
      if (s == 9) stats.expert_counts[3] = int64_t{1} << 40;  // needs the int64 encoding
      w->OnStep(Record(s, 5.0 - 0.1 * s), stats);
    }
    w->OnStep(Record(7, 4.3), StepStats{});
    w->OnEval(5, 320, 1.9e6, 4.7);
    w->OnEval(10, 640, 3.8e6, 4.9);
    w->OnClip({{4, 0, 1, 120.0, 0.83}, {4, 1, 2, 130.0, 0.77}});
    w->OnCheckpoint(10, "/ckpt/step10.bin");
    w->OnEnd(RunStatus::kDone, "");
    EXPECT_EQ(w->error(), "");
  }
  Reader r(path_);
  const auto run = r.GetRun(id);
  ASSERT_TRUE(run);
  EXPECT_EQ(run->name, "round-trip");
  EXPECT_EQ(run->status, RunStatus::kDone);
  EXPECT_EQ(run->effective_status, RunStatus::kDone);
  EXPECT_EQ(run->pid, getpid());
  EXPECT_TRUE(run->ended_at);
  EXPECT_EQ(run->checkpoint_step, 10);
  EXPECT_EQ(run->checkpoint_path, "/ckpt/step10.bin");
  EXPECT_EQ(run->shape.layers, kLayers);
  EXPECT_EQ(run->shape.experts, kExperts);
  EXPECT_EQ(run->shape.params_active, 400);
  EXPECT_EQ(run->shape.total_steps, 100);
  EXPECT_EQ(run->last_step, 10);
  EXPECT_DOUBLE_EQ(*run->last_loss, 4.0);
  EXPECT_DOUBLE_EQ(*run->best_val_loss, 4.7);
  EXPECT_DOUBLE_EQ(*run->last_val_loss, 4.9);
  EXPECT_EQ(run->tokens, 640);
  EXPECT_EQ(r.RunConfigJson(id), R"({"model":{"layers":2}})");

  const Series loss = r.GetSeries(id, "loss");
  ASSERT_EQ(loss.steps.size(), 10u);
  EXPECT_EQ(loss.steps.front(), 1);
  EXPECT_DOUBLE_EQ(loss.values[6], 4.3);
  const Series lr = r.GetSeries(id, "lr", 3, 5);
  EXPECT_EQ(lr.steps, (std::vector<int64_t>{3, 4, 5}));
  EXPECT_EQ(r.SeriesSince(id, "tokens", 8).steps, (std::vector<int64_t>{9, 10}));
  const Series val = r.GetSeries(id, "val_loss");
  EXPECT_EQ(val.steps, (std::vector<int64_t>{5, 10}));
  EXPECT_EQ(r.GetSeries(id, "eval_tokens").values, (std::vector<double>{320, 640}));
  // An optional per-step metric: steps that did not compute it are left out, not read as 0.
  const Series gains = r.GetSeries(id, "norm_gain_rms");
  EXPECT_EQ(gains.steps, (std::vector<int64_t>{2, 4, 6, 8, 10}));
  EXPECT_DOUBLE_EQ(gains.values[2], 1.06);
  for (const std::string& key : Reader::SeriesKeys()) EXPECT_NO_THROW(r.GetSeries(id, key));
  EXPECT_THROW(r.GetSeries(id, "loss; DROP TABLE runs"), std::invalid_argument);

  auto m = r.GetMaxLogitMatrix(id, 7);  // step 7 has no matrix: nearest earlier is 6
  ASSERT_TRUE(m);
  EXPECT_EQ(m->step, 6);
  EXPECT_EQ(m->layers, kLayers);
  EXPECT_EQ(m->heads, kHeads);
  EXPECT_EQ(m->values, Stats(6).max_logit);
  EXPECT_EQ(m->raw, m->values);
  m = r.GetMaxLogitMatrix(id, 8);
  EXPECT_FLOAT_EQ(m->raw[0], 100.0f);
  EXPECT_FLOAT_EQ(m->values[0], 8.0f);
  EXPECT_FALSE(r.GetMaxLogitMatrix(id, 0));
  const MaxLogitTimeline tl = r.GetMaxLogitTimeline(id);
  EXPECT_EQ(tl.steps.size(), 9u);
  EXPECT_EQ(tl.values.size(), 9u * kLayers * kHeads);
  EXPECT_FLOAT_EQ(tl.values[1 * kLayers * kHeads + 5], 2.5f);

  const ExpertLoads loads = r.GetExpertLoads(id, 8, 10);
  EXPECT_EQ(loads.steps, (std::vector<int64_t>{8, 9, 10}));
  ASSERT_EQ(loads.counts.size(), 3u * kMoeLayers * kExperts);
  EXPECT_EQ(loads.counts[0], 80);
  EXPECT_EQ(loads.counts[kMoeLayers * kExperts + 3], int64_t{1} << 40);
  EXPECT_EQ(loads.counts[2 * kMoeLayers * kExperts + 7], 107);

  const auto clips = r.ClipEvents(id);
  ASSERT_EQ(clips.size(), 2u);
  EXPECT_EQ(clips[1].layer, 1);
  EXPECT_EQ(clips[1].head, 2);
  EXPECT_DOUBLE_EQ(clips[1].gamma, 0.77);
}

TEST_F(DbTest, FlushesAreBatched) {
  WriterOptions opt;
  opt.flush_interval_s = 1.0;
  auto w = RunWriter::Create(path_, TestRun("batched"), opt);
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t s = 1; s <= 1000; ++s) {
    w->OnStep(Record(s, 3.0), Stats(s));
    if (s % 100 == 0) w->OnHeartbeat();
  }
  w->Flush();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  // One transaction per started second plus the explicit flush.
  EXPECT_LE(w->transactions(), 2 + static_cast<int64_t>(seconds));
  EXPECT_EQ(CountRows(path_, "steps", w->run_id()), 1000);
  EXPECT_EQ(CountRows(path_, "max_logits", w->run_id()), 1000);
  // Nothing buffered: an explicit flush writes nothing.
  const int64_t before = w->transactions();
  w->Flush();
  EXPECT_EQ(w->transactions(), before);
}

TEST_F(DbTest, BackgroundThreadFlushesWithoutBeingAsked) {
  WriterOptions opt;
  opt.flush_interval_s = 0.05;
  auto w = RunWriter::Create(path_, TestRun("background"), opt);
  for (int64_t s = 1; s <= 5; ++s) w->OnStep(Record(s, 3.0), Stats(s));
  Reader r(path_);
  const auto deadline = std::chrono::steady_clock::now() + 5s;
  while (r.GetSeries(w->run_id(), "loss").steps.size() < 5 &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(10ms);
  }
  EXPECT_EQ(r.GetSeries(w->run_id(), "loss").steps.size(), 5u);
  EXPECT_EQ(r.GetRun(w->run_id())->last_step, 5);
  EXPECT_EQ(r.GetRun(w->run_id())->status, RunStatus::kRunning);
}

TEST_F(DbTest, DivergedRunRecordsTheStep) {
  auto w = RunWriter::Create(path_, TestRun("diverged"));
  w->OnStep(Record(1, 3.0), Stats(1));
  w->OnStep(Record(2, std::nan("")), Stats(2));
  w->OnEnd(RunStatus::kDiverged, "loss is NaN at step 2");
  Reader r(path_);
  const auto run = r.GetRun(w->run_id());
  EXPECT_EQ(run->status, RunStatus::kDiverged);
  EXPECT_EQ(run->diverged_step, 2);
  EXPECT_EQ(run->error, "loss is NaN at step 2");
  const Series loss = r.GetSeries(w->run_id(), "loss");
  ASSERT_EQ(loss.values.size(), 2u);
  EXPECT_TRUE(std::isnan(loss.values[1]));  // NaN is stored as NULL and read back as NaN
}

TEST_F(DbTest, ResumeTruncatesLaterRowsAndReplacesThem) {
  int64_t id = 0;
  {
    auto w = RunWriter::Create(path_, TestRun("resumed"));
    id = w->run_id();
    for (int64_t s = 1; s <= 20; ++s) w->OnStep(Record(s, 1.0), Stats(s));
    w->OnEval(10, 640, 1, 2.0);
    w->OnEval(20, 1280, 2, 1.5);
    w->OnClip({{15, 0, 0, 200, 0.5}});
    // Killed here in effect: the checkpoint is at step 10, steps 11..20 are recorded.
    w->OnEnd(RunStatus::kStopped, "");
  }
  {
    auto w = RunWriter::Attach(path_, id, 10);
    {
      Reader r(path_);
      const auto run = r.GetRun(id);
      EXPECT_EQ(run->status, RunStatus::kRunning);
      EXPECT_FALSE(run->ended_at);
      EXPECT_EQ(run->last_step, 10);
      EXPECT_DOUBLE_EQ(*run->best_val_loss, 2.0);
      EXPECT_EQ(r.ClipEvents(id).size(), 0u);
    }
    for (int64_t s = 11; s <= 25; ++s) w->OnStep(Record(s, 2.0), Stats(s));
    w->OnEval(20, 1280, 2, 1.8);
    // Steps after 22 are dropped from the buffer too, then 23..25 come again.
    w->TruncateAfter(22);
    for (int64_t s = 23; s <= 25; ++s) w->OnStep(Record(s, 3.0), Stats(s));
    w->OnEnd(RunStatus::kDone, "");
  }
  Reader r(path_);
  const Series loss = r.GetSeries(id, "loss");
  ASSERT_EQ(loss.steps.size(), 25u);
  for (size_t i = 0; i < loss.steps.size(); ++i) {
    EXPECT_EQ(loss.steps[i], static_cast<int64_t>(i) + 1);
    EXPECT_DOUBLE_EQ(loss.values[i], i < 10 ? 1.0 : (i < 22 ? 2.0 : 3.0)) << i;
  }
  EXPECT_EQ(CountRows(path_, "max_logits", id), 25);
  EXPECT_EQ(CountRows(path_, "expert_counts", id), 25);
  const auto run = r.GetRun(id);
  EXPECT_EQ(run->status, RunStatus::kDone);
  EXPECT_EQ(run->last_step, 25);
  EXPECT_DOUBLE_EQ(*run->last_loss, 3.0);
  EXPECT_DOUBLE_EQ(*run->last_val_loss, 1.8);
  EXPECT_DOUBLE_EQ(*run->best_val_loss, 1.8);
}

TEST_F(DbTest, BackgroundErrorsSurface) {
  auto w = RunWriter::Create(path_, TestRun("doomed"));
  w->OnStep(Record(1, 1.0), Stats(1));
  w->Flush();
  // Deleting the run under the writer makes its next inserts violate the foreign key.
  RunWriter::DeleteRun(path_, w->run_id());
  w->OnStep(Record(2, 1.0), Stats(2));
  try {
    w->Flush();
    FAIL() << "Flush did not report the failed write";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("FOREIGN KEY"), std::string::npos) << e.what();
  }
  EXPECT_NE(w->error(), "");
  EXPECT_THROW(w->OnEnd(RunStatus::kDone, ""), std::runtime_error);
}

TEST_F(DbTest, LifecycleHelpers) {
  const int64_t queued = RunWriter::CreateRun(path_, TestRun("q", "hash-q"));
  const int64_t other = RunWriter::CreateRun(path_, TestRun("o", "hash-o"));
  RunWriter::SetRunVar(path_, queued, "sparsity", "16");
  EXPECT_EQ(RunWriter::FindRunsByHash(path_, "hash-q"), (std::vector<int64_t>{queued}));
  EXPECT_TRUE(RunWriter::FindRunsByHash(path_, "nope").empty());
  {
    Reader r(path_);
    EXPECT_EQ(r.GetRun(queued)->status, RunStatus::kQueued);
    EXPECT_EQ(r.RunVars(queued).at("sparsity"), "16");
    EXPECT_EQ(r.AllRunVars().at(queued).at("sparsity"), "16");
    EXPECT_EQ(r.AllRunVars().count(other), 0u);
    EXPECT_EQ(r.ListRuns().size(), 2u);
  }
  RunShape shape = TestRun("x").shape;
  shape.total_steps = 7;
  auto w = RunWriter::Attach(path_, queued, 0, shape);
  w->OnStep(Record(1, 1.0), Stats(1));
  w->OnEnd(RunStatus::kDone, "");
  RunWriter::SetRunStatus(path_, other, RunStatus::kFailed, "out of memory");
  EXPECT_THROW(RunWriter::Attach(path_, 12345, 0), std::runtime_error);
  Reader r(path_);
  EXPECT_EQ(r.GetRun(queued)->status, RunStatus::kDone);
  EXPECT_EQ(r.GetRun(queued)->shape.total_steps, 7);
  EXPECT_EQ(r.GetRun(other)->status, RunStatus::kFailed);
  EXPECT_EQ(r.GetRun(other)->error, "out of memory");
  EXPECT_FALSE(r.GetRun(999));
}

// Every status the writer stores reads back as the same enum; the column keeps its strings.
TEST_F(DbTest, EveryRunStatusRoundTripsThroughTheRunsTable) {
  const int64_t id = RunWriter::CreateRun(path_, TestRun("s"));
  for (RunStatus s : kAllRunStatuses) {
    RunWriter::SetRunStatus(path_, id, s);
    Reader r(path_);
    EXPECT_EQ(r.GetRun(id)->status, s);
    EXPECT_EQ(r.GetRun(id)->ended_at.has_value(), IsTerminal(s)) << s;
    Connection db = OpenForRead(path_);
    Statement st = db.Prepare("SELECT status FROM runs WHERE id = ?1");
    st.Bind(1, id);
    ASSERT_TRUE(st.Step());
    EXPECT_EQ(st.Text(0), ToString(s));
  }
}

TEST_F(DbTest, StaleRunningRunsAreReportedAndMarkedFailed) {
  const int64_t id = RunWriter::CreateRun(path_, TestRun("stale"), RunStatus::kRunning);
  {
    Reader r(path_);
    EXPECT_EQ(r.ListRuns(30.0)[0].effective_status, RunStatus::kRunning);
  }
  std::this_thread::sleep_for(300ms);
  {
    Reader r(path_);
    const RunRow row = r.ListRuns(0.2)[0];
    EXPECT_EQ(row.status, RunStatus::kRunning);
    EXPECT_EQ(row.effective_status, RunStatus::kFailed);
    EXPECT_TRUE(row.stale);
  }
  EXPECT_EQ(MarkStaleRunsFailed(path_, 30.0), 0);
  EXPECT_EQ(MarkStaleRunsFailed(path_, 0.2), 1);
  Reader r(path_);
  EXPECT_EQ(r.GetRun(id)->status, RunStatus::kFailed);
  EXPECT_NE(r.GetRun(id)->error.find("heartbeat"), std::string::npos);
}

TEST_F(DbTest, MergeImportsNewRunsByConfigHashOnce) {
  const std::string other = dir_ + "/other.db";
  {
    auto w = RunWriter::Create(path_, TestRun("here", "shared-hash"));
    w->OnEnd(RunStatus::kDone, "");
  }
  int64_t src_id = 0;
  {
    auto dup = RunWriter::Create(other, TestRun("dup", "shared-hash"));
    dup->OnEnd(RunStatus::kDone, "");
    Connection db = OpenForWrite(other);
    db.Exec("INSERT INTO sweeps (name, created_at) VALUES ('sparsity', 0)");
    RunInfo info = TestRun("new", "new-hash");
    info.sweep_id = db.last_insert_rowid();
    auto w = RunWriter::Create(other, info);
    src_id = w->run_id();
    for (int64_t s = 1; s <= 30; ++s) w->OnStep(Record(s, 1.0), Stats(s));
    w->OnEval(30, 1, 2, 3.0);
    w->OnClip({{3, 1, 1, 150, 0.6}});
    w->OnEnd(RunStatus::kDone, "");
    RunWriter::SetRunVar(other, src_id, "sparsity", "8");
  }
  const MergeResult first = MergeDatabase(path_, other);
  EXPECT_EQ(first.imported, 1);
  EXPECT_EQ(first.skipped, 1);
  ASSERT_EQ(first.id_map.size(), 1u);
  EXPECT_EQ(first.id_map[0].first, src_id);
  const int64_t id = first.id_map[0].second;
  const MergeResult again = MergeDatabase(path_, other);
  EXPECT_EQ(again.imported, 0);
  EXPECT_EQ(again.skipped, 2);

  Reader r(path_);
  EXPECT_EQ(r.ListRuns().size(), 2u);
  const auto run = r.GetRun(id);
  ASSERT_TRUE(run);
  EXPECT_EQ(run->name, "new");
  EXPECT_EQ(run->status, RunStatus::kDone);
  EXPECT_EQ(run->last_step, 30);
  EXPECT_TRUE(run->sweep_id);
  EXPECT_EQ(r.GetSeries(id, "loss").steps.size(), 30u);
  EXPECT_EQ(r.GetSeries(id, "val_loss").values, (std::vector<double>{3.0}));
  EXPECT_EQ(r.GetMaxLogitMatrix(id)->values, Stats(30).max_logit);
  EXPECT_EQ(r.GetExpertLoads(id).steps.size(), 30u);
  EXPECT_EQ(r.ClipEvents(id).size(), 1u);
  EXPECT_EQ(r.RunVars(id).at("sparsity"), "8");
  EXPECT_THROW(MergeDatabase(path_, dir_ + "/missing.db"), std::runtime_error);
  EXPECT_EQ(IntegrityCheck(path_), "ok");
}

// Promotions travel with their runs: the launched run and the source run are re-linked to the
// destination's runs of the same config hash (imported now, or already there), the sweep by
// name, the fit (not merged) dropped; a second merge copies nothing twice.
TEST_F(DbTest, MergeCopiesPromotionsWithTheirRuns) {
  const std::string other = dir_ + "/promoted.db";
  {
    auto w = RunWriter::Create(path_, TestRun("source here too", "source-hash"));
    w->OnEnd(RunStatus::kDone, "");
  }
  int64_t src_source = 0, src_launched = 0;
  {
    Connection db = OpenForWrite(other);
    db.Exec("INSERT INTO sweeps (name, created_at) VALUES ('family', 0)");
    const int64_t sweep = db.last_insert_rowid();
    RunInfo source = TestRun("source", "source-hash");
    source.sweep_id = sweep;
    auto s = RunWriter::Create(other, source);
    src_source = s->run_id();
    s->OnEnd(RunStatus::kDone, "");
    auto l = RunWriter::Create(other, TestRun("promoted", "promoted-hash"));
    src_launched = l->run_id();
    l->OnEnd(RunStatus::kDone, "");
    db.Exec(
        "INSERT INTO fits (created_at, family_key, form, options_json, inputs_json, result_json, "
        "bootstrap_seed) VALUES (0, '', 'power', '{}', '{}', '{}', 1)");
    PromotionRecord p;
    p.sweep_id = sweep;
    p.fit_id = db.last_insert_rowid();
    p.law = "power";
    p.source_run_id = src_source;
    p.target_json = R"({"target_loss": 3})";
    p.plan_json = R"({"steps": 100})";
    p.config_json = R"({"train": {"steps": 100}})";
    p.predicted_loss = 3.0;
    const int64_t pid = SavePromotion(other, p);
    LinkPromotionRun(other, pid, src_launched);
    PromotionRecord unlaunched = p;
    unlaunched.plan_json = R"({"steps": 50})";
    unlaunched.source_run_id.reset();
    SavePromotion(other, unlaunched);
  }
  const MergeResult first = MergeDatabase(path_, other);
  EXPECT_EQ(first.imported, 1);  // the source run was here already
  EXPECT_EQ(first.promotions_imported, 2);
  EXPECT_EQ(first.promotions_skipped, 0);
  ASSERT_EQ(first.id_map.size(), 1u);
  EXPECT_EQ(first.id_map[0].first, src_launched);
  const int64_t launched = first.id_map[0].second;
  const std::vector<PromotionRecord> got = ListPromotions(path_);
  ASSERT_EQ(got.size(), 2u);
  const bool first_linked = got[0].plan_json == R"({"steps": 100})";
  const PromotionRecord& linked = first_linked ? got[0] : got[1];
  const PromotionRecord& plain = first_linked ? got[1] : got[0];
  EXPECT_EQ(linked.run_id, launched);
  EXPECT_EQ(linked.source_run_id, std::optional<int64_t>(1));  // this file's run of that hash
  EXPECT_FALSE(linked.fit_id);
  ASSERT_TRUE(linked.sweep_id);
  EXPECT_EQ(linked.plan_json, R"({"steps": 100})");
  EXPECT_EQ(linked.predicted_loss, 3.0);
  EXPECT_FALSE(plain.run_id);
  EXPECT_FALSE(plain.source_run_id);
  ASSERT_TRUE(PromotionOfRun(path_, launched));
  EXPECT_EQ(PromotionOfRun(path_, launched)->id, linked.id);
  {
    Connection db = OpenForRead(path_);
    Statement st = db.Prepare("SELECT name FROM sweeps WHERE id = ?1");
    st.Bind(1, *linked.sweep_id);
    ASSERT_TRUE(st.Step());
    EXPECT_EQ(st.Text(0), "family");
  }
  const MergeResult again = MergeDatabase(path_, other);
  EXPECT_EQ(again.promotions_imported, 0);
  EXPECT_EQ(again.promotions_skipped, 2);
  EXPECT_EQ(ListPromotions(path_).size(), 2u);
  EXPECT_EQ(IntegrityCheck(path_), "ok");
}

// An adaptive sweep's history travels with its sweep: the batches and looks dst lacks are copied
// (a second merge copies nothing), a longer history extends a prefix, and one that chose other
// runs in a batch both hold is reported and not imported.
TEST_F(DbTest, MergeCopiesAdaptiveHistories) {
  auto add_batch = [](const std::string& file, const std::string& sweep, int batch,
                      const std::string& runs, bool look) {
    Connection db = OpenForWrite(file);
    db.Prepare("INSERT INTO sweeps (name, created_at) VALUES (?1, 0) ON CONFLICT (name) DO NOTHING")
        .Bind(1, sweep)
        .Run();
    Statement id = db.Prepare("SELECT id FROM sweeps WHERE name = ?1");
    id.Bind(1, sweep);
    EXPECT_TRUE(id.Step());
    const int64_t sweep_id = id.Int(0);
    db.Prepare(
          "INSERT INTO adaptive_batches (sweep_id, batch, runs_json, why_json, cost_flops, "
          "created_at) VALUES (?1, ?2, ?3, '[]', 1e12, 0)")
        .Bind(1, sweep_id)
        .Bind(2, int64_t{batch})
        .Bind(3, runs)
        .Run();
    if (look) {
      db.Prepare(
            "INSERT INTO adaptive_looks (sweep_id, batch, seeds, estimate, lo, hi, critical, "
            "alpha_spent, spent_flops, decision, detail_json, created_at) VALUES (?1, ?2, 4, 1.2, "
            "1.0, 1.4, 2.5, 0.05, 1e12, 'continue', '{}', 0)")
          .Bind(1, sweep_id)
          .Bind(2, int64_t{batch})
          .Run();
    }
  };
  auto count = [&](const std::string& table, const std::string& sweep) {
    Connection db = OpenForRead(path_);
    Statement st = db.Prepare("SELECT COUNT(*) FROM " + table +
                              " t JOIN sweeps s ON s.id = t.sweep_id WHERE s.name = ?1");
    st.Bind(1, sweep);
    EXPECT_TRUE(st.Step());
    return st.Int(0);
  };
  const std::string other = dir_ + "/adaptive.db";
  add_batch(other, "question", 1, "[0,1,2]", true);
  add_batch(other, "question", 2, "[3,4]", false);  // killed before its look
  add_batch(other, "diverged", 1, "[0,1]", true);
  add_batch(path_, "diverged", 1, "[0,5]", true);  // the same question, other choices here

  const MergeResult first = MergeDatabase(path_, other);
  EXPECT_EQ(first.adaptive_batches_imported, 2);
  EXPECT_EQ(first.adaptive_batches_skipped, 0);
  EXPECT_EQ(first.adaptive_conflicts, std::vector<std::string>{"diverged"});
  EXPECT_EQ(count("adaptive_batches", "question"), 2);
  EXPECT_EQ(count("adaptive_looks", "question"), 1);
  EXPECT_EQ(count("adaptive_batches", "diverged"), 1);
  {
    Connection db = OpenForRead(path_);
    Statement st = db.Prepare(
        "SELECT runs_json FROM adaptive_batches b JOIN sweeps s ON s.id = b.sweep_id WHERE s.name "
        "= 'diverged'");
    ASSERT_TRUE(st.Step());
    EXPECT_EQ(st.Text(0), "[0,5]") << "dst's history was replaced";
  }

  const MergeResult again = MergeDatabase(path_, other);
  EXPECT_EQ(again.adaptive_batches_imported, 0);
  EXPECT_EQ(again.adaptive_batches_skipped, 2);

  add_batch(other, "question", 3, "[5]", true);  // the source went on: its third batch joins
  const MergeResult longer = MergeDatabase(path_, other);
  EXPECT_EQ(longer.adaptive_batches_imported, 1);
  EXPECT_EQ(count("adaptive_batches", "question"), 3);
  EXPECT_EQ(count("adaptive_looks", "question"), 2);
  EXPECT_EQ(IntegrityCheck(path_), "ok");
}

// ---- Processes ----------------------------------------------------------------------------

TEST_F(DbTest, ReaderPollsWhileAnotherProcessWrites) {
  constexpr int64_t kSteps = 6000;
  { OpenForWrite(path_); }  // no connection may cross the fork
  const pid_t child = Spawn([&] {
    WriterOptions opt;
    opt.flush_interval_s = 0.02;
    auto w = RunWriter::Create(path_, TestRun("child"), opt);
    for (int64_t s = 1; s <= kSteps; ++s) {
      w->OnStep(Record(s, 2.0), Stats(s));
      if (s % 200 == 0) {
        w->OnEval(s, s * 64, 0, 1.0);
        w->OnHeartbeat();
        std::this_thread::sleep_for(20ms);  // spread the run over ~0.6 s of polling
      }
    }
    w->OnEnd(RunStatus::kDone, "");
    return 0;
  });

  Reader r(path_);
  int polls = 0, distinct = 0;
  int64_t seen = 0, last_step = 0, run_id = 0;
  std::string error;
  for (;;) {
    const bool exited = waitpid(child, nullptr, WNOHANG) != 0;
    try {
      const auto runs = r.ListRuns();
      if (!runs.empty()) {
        run_id = runs[0].id;
        const Series s = r.SeriesSince(run_id, "loss", seen);
        if (!s.steps.empty()) {
          EXPECT_EQ(s.steps.front(), seen + 1);  // committed rows arrive as a contiguous prefix
          seen = s.steps.back();
          ++distinct;
        }
        r.GetMaxLogitMatrix(run_id);
        r.GetExpertLoads(run_id, seen - 10, seen);
        last_step = runs[0].last_step;
      }
    } catch (const std::exception& e) {
      error = e.what();
      break;
    }
    ++polls;
    if (exited) break;
    std::this_thread::sleep_for(2ms);
  }
  EXPECT_EQ(error, "");
  EXPECT_GT(distinct, 2) << "the reader never saw the run grow (polls: " << polls << ")";
  // The loop may end on a poll that raced the child's exit; re-read after it.
  EXPECT_EQ(r.GetSeries(run_id, "loss").steps.size(), static_cast<size_t>(kSteps));
  EXPECT_EQ(r.GetRun(run_id)->status, RunStatus::kDone);
  EXPECT_EQ(r.GetRun(run_id)->last_step, kSteps);
  EXPECT_LE(last_step, kSteps);
  EXPECT_EQ(IntegrityCheck(path_), "ok");
}

TEST_F(DbTest, ManyWriterProcessesShareOneFile) {
  constexpr int kProcs = 6;
  constexpr int64_t kSteps = 1500;
  // No one creates the file first: the children race through the migrations too.
  std::vector<pid_t> children;
  for (int p = 0; p < kProcs; ++p) {
    children.push_back(Spawn([&, p] {
      WriterOptions opt;
      opt.flush_interval_s = 0.01;
      auto w =
          RunWriter::Create(path_, TestRun("w" + std::to_string(p), "h" + std::to_string(p)), opt);
      for (int64_t s = 1; s <= kSteps; ++s) {
        w->OnStep(Record(s, p), Stats(s));
        if (s % 100 == 0) {
          w->OnHeartbeat();
          w->OnClip({{s, p % kLayers, 0, 1.0, 0.5}});
          std::this_thread::sleep_for(1ms);
        }
      }
      w->OnEnd(RunStatus::kDone, "");
      return w->error().empty() ? 0 : 1;
    }));
  }
  for (pid_t c : children) EXPECT_EQ(Wait(c), 0);
  Reader r(path_);
  const auto runs = r.ListRuns();
  ASSERT_EQ(runs.size(), static_cast<size_t>(kProcs));
  for (const RunRow& run : runs) {
    EXPECT_EQ(run.status, RunStatus::kDone) << run.name;
    EXPECT_EQ(run.last_step, kSteps);
    EXPECT_EQ(CountRows(path_, "steps", run.id), kSteps);
    EXPECT_EQ(CountRows(path_, "expert_counts", run.id), kSteps);
    EXPECT_EQ(r.ClipEvents(run.id).size(), static_cast<size_t>(kSteps / 100));
  }
  EXPECT_EQ(IntegrityCheck(path_), "ok");
}

TEST_F(DbTest, KillDashNineLeavesAnIntactDatabaseAndAFailedRun) {
  { OpenForWrite(path_); }
  const pid_t child = Spawn([&] {
    WriterOptions opt;
    opt.flush_interval_s = 0.01;
    auto w = RunWriter::Create(path_, TestRun("killed"), opt);
    for (int64_t s = 1;; ++s) {
      w->OnStep(Record(s, 1.0), Stats(s));
      if (s % 50 == 0) {
        w->OnHeartbeat();
        w->OnEval(s, s, 0, 1.0);
        std::this_thread::sleep_for(1ms);
      }
    }
    return 0;
  });
  // Kill only once a good number of transactions have been committed, mid-stream.
  int64_t run_id = 0, committed = 0;
  {
    Reader r(path_);
    const auto deadline = std::chrono::steady_clock::now() + 10s;
    while (committed < 3000 && std::chrono::steady_clock::now() < deadline) {
      const auto runs = r.ListRuns();
      if (!runs.empty()) {
        run_id = runs[0].id;
        committed = runs[0].last_step;
      }
      std::this_thread::sleep_for(5ms);
    }
  }
  ASSERT_EQ(kill(child, SIGKILL), 0);
  EXPECT_EQ(Wait(child), 128 + SIGKILL);
  ASSERT_GT(committed, 0);

  EXPECT_EQ(IntegrityCheck(path_), "ok");
  Reader r(path_);
  const Series loss = r.GetSeries(run_id, "loss");
  ASSERT_GE(static_cast<int64_t>(loss.steps.size()), committed);
  for (size_t i = 0; i < loss.steps.size(); ++i) {
    ASSERT_EQ(loss.steps[i], static_cast<int64_t>(i) + 1);  // a prefix, no holes
  }
  const auto run = r.GetRun(run_id);
  EXPECT_EQ(run->status, RunStatus::kRunning);                         // nobody said otherwise...
  EXPECT_EQ(run->last_step, static_cast<int64_t>(loss.steps.size()));  // summary is transactional
  std::this_thread::sleep_for(1100ms);
  // ...but its heartbeat is stale.
  EXPECT_EQ(r.GetRun(run_id, 1.0)->effective_status, RunStatus::kFailed);
  EXPECT_EQ(MarkStaleRunsFailed(path_, 1.0), 1);
  EXPECT_EQ(Reader(path_).GetRun(run_id)->status, RunStatus::kFailed);
  EXPECT_EQ(IntegrityCheck(path_), "ok");
}

}  // namespace
}  // namespace moelab::db
