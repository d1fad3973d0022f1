// A run is never mixed with another (issue 19), end to end through `moelab train`: runs of one
// config in one database, the same config in two databases, the README's resume line after a
// `--set`, a copied database, and a checkpoint folder moved to another path. Each asserts that
// a resumed run records every step exactly once and follows its own trajectory.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "db/reader.h"
#include "db/sqlite.h"
#include "tests/launch/fixture.h"

namespace moelab::sweeps {
namespace {

class ResumeTest : public LaunchRunTest {
 protected:
  // A tiny run of `steps` steps, a checkpoint every 10 steps (the newest 2 kept) under ckpt_root.
  std::string Config(int steps, const fs::path& ckpt_root, const std::string& file = "run.json") {
    ojson c = Base(steps);
    c["checkpoint"] = {{"every", 10}, {"keep", 2}, {"dir", ckpt_root.string()}};
    c["eval"] = {{"every", 10}, {"batches", 1}};
    const std::string p = (dir_ / file).string();
    std::ofstream(p) << c.dump(2);
    return p;
  }
  int Train(std::vector<std::string> args, const std::string& db) {
    std::vector<std::string> a = {"train"};
    a.insert(a.end(), args.begin(), args.end());
    a.insert(a.end(), {"--db", db, "--no-progress"});
    return Moelab(a, Log());
  }
  std::string Log() const { return (dir_ / "log.txt").string(); }

  // The run's losses, checking that steps 1..total are each recorded exactly once.
  std::vector<double> Losses(const std::string& db, int64_t run_id, int64_t total) {
    db::Reader reader(db);
    const db::Series s = reader.GetSeries(run_id, "loss");
    EXPECT_EQ(static_cast<int64_t>(s.steps.size()), total) << "run " << run_id;
    for (size_t i = 0; i < s.steps.size(); ++i) {
      EXPECT_EQ(s.steps[i], static_cast<int64_t>(i + 1)) << "run " << run_id;
    }
    return s.values;
  }
  db::RunRow Run(const std::string& db, int64_t id) { return *db::Reader(db).GetRun(id); }
};

// Path 1: three runs of one config in one database (the first stopped, the second trained
// further without --resume, the third stopped early). `--resume` continues the third from its
// own step 11, not from the second run's newer checkpoints, and pruning kept everybody's files.
TEST_F(ResumeTest, RunsOfOneConfigInOneDatabaseKeepTheirOwnCheckpoints) {
  const std::string cfg = Config(40, dir_ / "ckpt");
  ASSERT_EQ(Train({cfg, "--name", "a", "--stop-at-step", "12"}, db_), 4) << Slurp(Log());
  ASSERT_EQ(Train({cfg, "--stop-at-step", "33"}, db_), 4) << Slurp(Log());
  ASSERT_EQ(Train({cfg, "--stop-at-step", "11"}, db_), 4) << Slurp(Log());
  // The hint it printed is a command that works: it continues run 3.
  EXPECT_HAS(Slurp(Log()), "continue with: moelab train --db " + db_ + " --resume 3");
  for (int id : {1, 2, 3}) {
    EXPECT_FALSE(Run(db_, id).uuid.empty());
    EXPECT_TRUE(fs::exists(Run(db_, id).checkpoint_path)) << id;  // never pruned by another run
  }
  EXPECT_NE(Run(db_, 1).uuid, Run(db_, 2).uuid);
  ASSERT_EQ(Train({"--resume", "3"}, db_), 0) << Slurp(Log());
  EXPECT_HAS(Slurp(Log()), "resuming run 3 'run' from step 11");
  const std::vector<double> third = Losses(db_, 3, 40);
  // Same config and seed: run 2's first 33 steps are run 3's.
  const std::vector<double> second = Losses(db_, 2, 33);
  for (int i = 0; i < 33; ++i) EXPECT_EQ(third[i], second[i]) << "step " << i + 1;
  // The config's newest unfinished run is run 2 now; run 1 is reached by name.
  ASSERT_EQ(Train({cfg, "--resume"}, db_), 0) << Slurp(Log());
  EXPECT_HAS(Slurp(Log()), "resuming run 2 'run' from step 33");
  ASSERT_EQ(Train({"--resume", "a"}, db_), 0) << Slurp(Log());
  EXPECT_HAS(Slurp(Log()), "resuming run 1 'a' from step 12");
  EXPECT_EQ(Losses(db_, 1, 40), third);
  EXPECT_EQ(Losses(db_, 2, 40), third);
  // Nothing left: the recorded final loss, never 0.0000 or nan.
  ASSERT_EQ(Train({"--resume", "a"}, db_), 0) << Slurp(Log());
  const std::string done = Slurp(Log());
  EXPECT_HAS(done, "already done at step 40: loss ");
  EXPECT_EQ(done.find("0.0000"), std::string::npos) << done;
  EXPECT_EQ(done.find("nan"), std::string::npos) << done;
  // Killed between its final checkpoint and marking itself done: the resume trains nothing and
  // reports the recorded losses (it printed "loss 0.0000, val loss nan").
  db::Connection(db_, SQLITE_OPEN_READWRITE)
      .Exec("UPDATE runs SET status = 'stopped' WHERE id = 1");
  ASSERT_EQ(Train({"--resume", "a"}, db_), 0) << Slurp(Log());
  const std::string again = Slurp(Log());
  EXPECT_HAS(again, "resuming run 1 'a' from step 40");
  EXPECT_HAS(again, "done: 40 steps (nothing left to train), loss ");
  EXPECT_EQ(again.find("0.0000"), std::string::npos) << again;
  EXPECT_EQ(again.find("nan"), std::string::npos) << again;
  EXPECT_EQ(Run(db_, 1).status, RunStatus::kDone);
}

// Path 2: the same config trained into two databases from one folder (default layout, and one
// explicit --checkpoint-dir shared by both). The second database's run resumes its own step 12,
// warns about the first's checkpoints it meets, and records all of its steps.
TEST_F(ResumeTest, TwoDatabasesOfOneConfigNeverShareCheckpoints) {
  const std::string cfg = Config(40, dir_ / "ckpt");
  const std::string scratch = (dir_ / "scratch.db").string();
  for (const bool shared : {false, true}) {
    SCOPED_TRACE(shared ? "explicit shared --checkpoint-dir" : "default folders");
    const std::string a = (dir_ / (shared ? "a2.db" : "a.db")).string();
    const std::string b = (dir_ / (shared ? "b2.db" : "b.db")).string();
    std::vector<std::string> dir;
    if (shared) dir = {"--checkpoint-dir", (dir_ / "shared").string()};
    const auto with = [&](std::vector<std::string> v) {
      v.insert(v.end(), dir.begin(), dir.end());
      return v;
    };
    ASSERT_EQ(Train(with({cfg}), a), 0) << Slurp(Log());
    ASSERT_EQ(Train(with({cfg, "--stop-at-step", "12"}), b), 4) << Slurp(Log());
    ASSERT_EQ(Train(with({cfg, "--resume"}), b), 0) << Slurp(Log());
    const std::string log = Slurp(Log());
    EXPECT_HAS(log, "resuming run 1 'run' from step 12");
    if (shared) EXPECT_HAS(log, "skipping foreign checkpoint");
    EXPECT_EQ(log.find("loss 0.0000"), std::string::npos) << log;
    EXPECT_EQ(Losses(b, 1, 40), Losses(a, 1, 40));
    EXPECT_EQ(Run(b, 1).status, RunStatus::kDone);
  }
}

// Path 4: the README's resume line after a run trained with --set. The config file disagrees
// with the stored config: exit 2 naming the keys, no new run. `--resume` alone continues the
// run from its stored config, under its recorded name.
TEST_F(ResumeTest, ResumeContinuesTheStoredConfigAndRefusesADifferentOne) {
  const std::string cfg = Config(30, dir_ / "ckpt");
  ASSERT_EQ(Train({cfg, "--name", "try1", "--set", "optimizer.name=muonclip", "--set",
                   "optimizer.qk_clip_tau=30", "--stop-at-step", "8"},
                  db_),
            4)
      << Slurp(Log());
  ASSERT_EQ(Train({cfg, "--resume"}, db_), 2) << Slurp(Log());
  std::string log = Slurp(Log());
  EXPECT_HAS(log, "optimizer.name (stored \"muonclip\", given \"adamw\")");
  EXPECT_HAS(log, "optimizer.qk_clip_tau");
  EXPECT_HAS(log, "moelab train --db " + db_ + " --resume 1");
  EXPECT_EQ(db::Reader(db_).ListRuns().size(), 1u);
  // A --set that disagrees is refused the same way.
  ASSERT_EQ(Train({"--resume", "--set", "optimizer.lr=0.5"}, db_), 2) << Slurp(Log());
  EXPECT_HAS(Slurp(Log()), "optimizer.lr");
  // An unknown run is named.
  ASSERT_EQ(Train({"--resume", "nope"}, db_), 2) << Slurp(Log());
  EXPECT_HAS(Slurp(Log()), "no run 'nope'");
  // Another thread count (unhashed, but the losses would leave the recorded trajectory) is
  // refused unless asked for, and then recorded on the run (issue 37).
  ASSERT_EQ(Train({"--resume", "--set", "train.threads=2"}, db_), 2) << Slurp(Log());
  log = Slurp(Log());
  EXPECT_HAS(log, "trained with 1 thread, 1 rank; this resume has 2 threads, 1 rank");
  EXPECT_HAS(log, "--allow-nondeterministic-resume");
  EXPECT_EQ(db::Reader(db_).ListRuns().at(0).status, RunStatus::kStopped);
  EXPECT_FALSE(db::Reader(db_).ListRuns().at(0).nondeterministic_from_step.has_value());
  ASSERT_EQ(Train({"--resume", "--set", "train.threads=2", "--allow-nondeterministic-resume"}, db_),
            0)
      << Slurp(Log());
  log = Slurp(Log());
  EXPECT_HAS(log, "resuming run 1 'try1' from step 8");
  EXPECT_HAS(log, "run 1 'try1'");
  const auto runs = db::Reader(db_).ListRuns();
  ASSERT_EQ(runs.size(), 1u);
  EXPECT_EQ(runs[0].status, RunStatus::kDone);
  EXPECT_EQ(runs[0].threads, 2);
  EXPECT_EQ(runs[0].nondeterministic_from_step, 8);
  EXPECT_HAS(db::Reader(db_).RunConfigJson(1), "muonclip");
  Losses(db_, 1, 30);
}

// A copied database: the copy continues the run (the UUID travels with it) to the end; the
// original, which recorded only 12 steps, does not adopt the copy's newer checkpoints (that
// would leave steps 13..35 unrecorded): it says why and trains the run again, step by step.
TEST_F(ResumeTest, ACopiedDatabaseContinuesTheRunAndTheOriginalStaysWhole) {
  const std::string cfg = Config(40, dir_ / "ckpt");
  ASSERT_EQ(Train({cfg, "--stop-at-step", "12"}, db_), 4) << Slurp(Log());
  const std::string copy = (dir_ / "copy.db").string();
  fs::copy_file(db_, copy);
  if (fs::exists(db_ + "-wal")) fs::copy_file(db_ + "-wal", copy + "-wal");
  ASSERT_EQ(Train({"--resume"}, copy), 0) << Slurp(Log());
  EXPECT_HAS(Slurp(Log()), "resuming run 1 'run' from step 12");
  const std::vector<double> copied = Losses(copy, 1, 40);
  ASSERT_EQ(Train({"--resume", "1"}, db_), 0) << Slurp(Log());
  EXPECT_HAS(Slurp(Log()), "the database recorded this run only up to step 12");
  EXPECT_EQ(Losses(db_, 1, 40), copied);
}

// A checkpoint folder moved to another path (another machine): resume refuses with a message
// that names --checkpoint-dir, and continues the exact trajectory from the new place.
TEST_F(ResumeTest, AMovedCheckpointFolderIsFoundWithCheckpointDir) {
  const std::string cfg = Config(30, dir_ / "machine-a");
  ASSERT_EQ(Train({cfg, "--stop-at-step", "12"}, db_), 4) << Slurp(Log());
  const db::RunRow row = Run(db_, 1);
  const fs::path old_dir = fs::path(row.checkpoint_path).parent_path();
  EXPECT_EQ(old_dir.filename().string(), row.uuid);
  fs::create_directories(dir_ / "machine-b");
  fs::rename(dir_ / "machine-a", dir_ / "machine-b" / "ckpt");
  const fs::path moved = dir_ / "machine-b" / "ckpt" / old_dir.parent_path().filename() / row.uuid;
  ASSERT_EQ(Train({"--resume"}, db_), 2) << Slurp(Log());
  EXPECT_HAS(Slurp(Log()), "--checkpoint-dir");
  EXPECT_EQ(Run(db_, 1).last_step, 12);  // nothing was deleted
  ASSERT_EQ(Train({"--resume", "1", "--checkpoint-dir", moved.string()}, db_), 0) << Slurp(Log());
  EXPECT_HAS(Slurp(Log()), "resuming run 1 'run' from step 12");
  const std::vector<double> resumed = Losses(db_, 1, 30);
  const std::string ref = (dir_ / "ref.db").string();
  ASSERT_EQ(Train({cfg}, ref), 0) << Slurp(Log());
  EXPECT_EQ(Losses(ref, 1, 30), resumed);
}

// Rewrites a checkpoint (format 2 or 3) in format 1, as moelab wrote it before runs had UUIDs.
void ToFormat1(const fs::path& from, const fs::path& to) {
  std::ifstream in(from, std::ios::binary);
  std::string b((std::istreambuf_iterator<char>(in)), {});
  size_t pos = 8;
  uint64_t n = 0;
  for (int i = 0; i < 2; ++i) {  // config hash, branch hash
    std::memcpy(&n, b.data() + pos, 8);
    pos += 8 + n;
  }
  std::memcpy(&n, b.data() + pos, 8);
  b.erase(pos, 8 + n);  // the run's UUID
  if (b[7] == '3') b.erase(pos + 24, 8);  // format 3's header checksum, after step, tokens, flops
  b[7] = '1';
  b.resize(b.size() - 8);
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : b) h = (h ^ c) * 1099511628211ull;
  b.append(reinterpret_cast<const char*>(&h), 8);
  std::ofstream(to, std::ios::binary) << b;
}

// Checkpoints from before run UUIDs (format 1, one folder per config shared by its runs): a run
// adopts the legacy checkpoint its row recorded and continues its exact trajectory in its own
// new folder; another run of the config, which did not record it, passes it over and says so.
TEST_F(ResumeTest, ALegacyCheckpointIsAdoptedOnlyByTheRunThatRecordedIt) {
  const std::string cfg = Config(30, dir_ / "ckpt");
  ASSERT_EQ(Train({cfg, "--name", "old", "--stop-at-step", "12"}, db_), 4) << Slurp(Log());
  ASSERT_EQ(Train({cfg, "--name", "other", "--stop-at-step", "6"}, db_), 4) << Slurp(Log());
  // Both rows as an upgraded database has them: the old layout, the files without UUIDs.
  const auto legacy = [&](int id, const std::string& file) {
    const db::RunRow r = Run(db_, id);
    const fs::path own = fs::path(r.checkpoint_path).parent_path();
    const fs::path old = own.parent_path() / file;
    ToFormat1(r.checkpoint_path, old);
    fs::remove_all(own);
    db::Connection(db_, SQLITE_OPEN_READWRITE)
        .Prepare("UPDATE runs SET checkpoint_path = ?2 WHERE id = ?1")
        .Bind(1, int64_t{id})
        .Bind(2, old.string())
        .Run();
    return old;
  };
  const fs::path old12 = legacy(1, "step_000000012.ckpt");
  fs::remove(legacy(2, "step_000000006.ckpt"));  // pruned by run 1, as the old code did
  // In the shared folder (the sweep engine and the GUI pass a run's recorded folder).
  ASSERT_EQ(Train({"--resume", "other", "--checkpoint-dir", old12.parent_path().string()}, db_), 0)
      << Slurp(Log());
  EXPECT_HAS(Slurp(Log()), "step_000000006.ckpt (step 6) is gone");
  EXPECT_HAS(Slurp(Log()), "skipping legacy checkpoint " + old12.string());
  EXPECT_HAS(Slurp(Log()), "resuming run 2 'other' from step 0");
  ASSERT_EQ(Train({"--resume", "old"}, db_), 0) << Slurp(Log());
  EXPECT_HAS(Slurp(Log()), "resuming run 1 'old' from step 12 (" + old12.string() + ")");
  EXPECT_EQ(Losses(db_, 1, 30), Losses(db_, 2, 30));
  EXPECT_TRUE(fs::exists(old12));  // never pruned by the new format
}

}  // namespace
}  // namespace moelab::sweeps
