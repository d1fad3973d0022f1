#include "cli/train_resume.h"

#include <fmt/format.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>

#include "core/host.h"
#include "core/train/checkpoint.h"
#include "core/train/trainer.h"
#include "db/reader.h"
#include "db/schema.h"

namespace moelab::cli {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

bool Unfinished(const db::RunRow& r) {
  return r.status != RunStatus::kDone && r.status != RunStatus::kDiverged;
}

// A trainer is recording into the run right now: a fresh heartbeat, and (on this host) its
// process exists. Continuing it would put two trainers on one run.
// The sweep that launched this trainer claimed the run for it first (sweeps/runner.cc, Claim):
// a row held by that pid is this trainer's to take over.
bool ClaimedForUs(int64_t pid) {
  const char* by = std::getenv("MOELAB_CLAIMED_BY");
  return by != nullptr && std::to_string(pid) == by;
}

bool LiveElsewhere(const db::RunRow& r) {
  if (r.status != RunStatus::kRunning || r.stale) return false;
  if (r.host != HostName()) return true;
  if (!r.pid || *r.pid == getpid() || ClaimedForUs(*r.pid)) return false;
  return ::kill(static_cast<pid_t>(*r.pid), 0) == 0 || errno == EPERM;
}

std::string List(const std::vector<const db::RunRow*>& rows) {
  std::string out;
  for (const db::RunRow* r : rows) out += "\n" + DescribeRun(*r);
  return out;
}

bool AllDigits(const std::string& s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// Flattens a config JSON into "section.key" -> value.
std::map<std::string, json> Leaves(const json& j) {
  std::map<std::string, json> out;
  for (auto s = j.begin(); s != j.end(); ++s) {
    if (!s.value().is_object()) {
      out[s.key()] = s.value();
      continue;
    }
    for (auto k = s.value().begin(); k != s.value().end(); ++k) out[s.key() + "." + k.key()] = *k;
  }
  return out;
}

}  // namespace

const db::RunRow* RunNamed(const std::vector<db::RunRow>& rows, const std::string& name,
                           const std::string& db) {
  std::vector<const db::RunRow*> all, open;
  for (const db::RunRow& r : rows) {
    if (r.name != name) continue;
    all.push_back(&r);
    if (Unfinished(r)) open.push_back(&r);
  }
  if (open.size() > 1) {
    throw TrainRefused(kExitConfig,
                       fmt::format("several unfinished runs are named '{}' in {}: name one by its "
                                   "id:{}",
                                   name, db, List(open)));
  }
  return open.empty() ? (all.empty() ? nullptr : all.back()) : open.front();
}

const db::RunRow* FindRun(const std::vector<db::RunRow>& rows, const std::string& run,
                          const std::string& db) {
  if (AllDigits(run)) {
    for (const db::RunRow& r : rows)
      if (std::to_string(r.id) == run) return &r;
  }
  return RunNamed(rows, run, db);
}

std::string DescribeRun(const db::RunRow& r) {
  return fmt::format("  {} '{}' {} at step {} of {} (config {})", r.id, r.name,
                     ToString(r.effective_status), r.last_step, r.shape.total_steps,
                     r.config_hash.substr(0, 12));
}

TrainTarget ChooseRun(const TrainRequest& q) {
  TrainTarget t;
  const bool continuing = q.run_id >= 0 || q.resume;
  std::error_code ec;
  if (!continuing) return t;
  std::vector<db::RunRow> rows;
  if (fs::exists(q.db, ec)) {
    db::OpenForWrite(q.db);  // brings an older file to this schema (adds runs.uuid)
    rows = db::Reader(q.db).ListRuns();
  }
  const auto pick = [&](const db::RunRow& r, const std::string& why) {
    if (LiveElsewhere(r)) {
      throw TrainRefused(kExitFailed,
                         fmt::format("run {} '{}' is being trained right now (pid {} on {}, "
                                     "heartbeat fresh): not starting a second trainer on it",
                                     r.id, r.name, r.pid.value_or(0), r.host));
    }
    t.kind = Unfinished(r) ? TrainTarget::kContinue : TrainTarget::kFinished;
    t.run = r;
    t.stored_config_json = db::Reader(q.db).RunConfigJson(r.id);
    t.note = why;
    return t;
  };
  const auto by_name = [&](const std::string& name) { return RunNamed(rows, name, q.db); };

  if (q.run_id >= 0) {
    for (const db::RunRow& r : rows)
      if (r.id == q.run_id) return pick(r, "");
    throw TrainRefused(kExitFailed, fmt::format("run {} not found in '{}'", q.run_id, q.db));
  }
  if (!q.resume_run.empty()) {
    if (const db::RunRow* r = FindRun(rows, q.resume_run, q.db)) return pick(*r, "");
    std::vector<const db::RunRow*> all;
    for (const db::RunRow& r : rows) all.push_back(&r);
    throw TrainRefused(kExitConfig,
                       fmt::format("no run '{}' in {}{}", q.resume_run, q.db,
                                   all.empty() ? " (it has no runs)" : "; its runs:" + List(all)));
  }
  if (!q.name.empty()) {
    // Train-or-continue by name (the Slurm scripts): the run of this name, else a new one.
    if (const db::RunRow* r = by_name(q.name)) return pick(*r, "");
    t.note = fmt::format("no run named '{}' in {} yet: starting it", q.name, q.db);
    return t;
  }
  std::vector<const db::RunRow*> open, same_open;
  const db::RunRow* same_done = nullptr;
  for (const db::RunRow& r : rows) {
    if (Unfinished(r)) open.push_back(&r);
    if (q.config_hash && r.config_hash == *q.config_hash) {
      if (Unfinished(r)) same_open.push_back(&r);
      if (r.status == RunStatus::kDone) same_done = &r;
    }
  }
  if (!same_open.empty()) {
    std::string note;
    if (same_open.size() > 1) {
      std::vector<const db::RunRow*> others(same_open.begin(), same_open.end() - 1);
      note = "other unfinished runs of this config (resume one with --resume ID):" + List(others);
    }
    return pick(*same_open.back(), note);
  }
  if (same_done) return pick(*same_done, "");
  if (open.size() == 1) return pick(*open.front(), "");  // the config check names the keys
  if (open.size() > 1) {
    throw TrainRefused(
        kExitConfig,
        fmt::format("{} unfinished runs in {}{}; continue one with `moelab train "
                    "--db {} --resume ID`{}:{}",
                    open.size(), q.db, q.config_hash ? ", none of them of this config" : "", q.db,
                    q.config_hash ? ", or drop --resume to start a new run" : "", List(open)));
  }
  if (!q.config_hash) {
    if (rows.empty())
      throw TrainRefused(kExitConfig, fmt::format("{} has no runs to resume", q.db));
    return pick(rows.back(), "");  // finished: says so with its final loss
  }
  t.note = fmt::format("no run of this config to resume in {}: starting a new one", q.db);
  return t;
}

std::vector<std::string> DifferingKeys(const RunConfig& stored, const RunConfig& given) {
  const std::string stored_hash = ConfigHash(stored);
  const json s = ConfigToJson(stored), g = ConfigToJson(given);
  const std::map<std::string, json> sl = Leaves(s), gl = Leaves(g);
  std::vector<std::string> out;
  for (const auto& [key, value] : gl) {
    const auto it = sl.find(key);
    if (it != sl.end() && it->second == value) continue;
    // Only keys that change the experiment count (train.threads, checkpoint.* may differ).
    bool hashed = true;
    try {
      json j = s;
      const size_t dot = key.find('.');
      if (dot == std::string::npos) {
        j[key] = value;
      } else {
        j[key.substr(0, dot)][key.substr(dot + 1)] = value;
      }
      hashed = ConfigHash(ConfigFromJson(j)) != stored_hash;
    } catch (const std::exception&) {
      // Invalid on its own (it changes a shape): certainly a different experiment.
    }
    if (hashed) {
      out.push_back(fmt::format("{} (stored {}, given {})", key,
                                it == sl.end() ? "none" : it->second.dump(), value.dump()));
    }
  }
  return out;
}

ResumeFolder FindResumeFolder(const db::RunRow& run, const RunConfig& config,
                              const std::string& explicit_dir) {
  ResumeFolder f;
  std::error_code ec;
  std::string recorded_owner = "-";
  if (!run.checkpoint_path.empty() && fs::exists(run.checkpoint_path, ec)) {
    try {
      recorded_owner = ReadCheckpointHeader(run.checkpoint_path).run_uuid;
    } catch (const std::exception&) {
    }
  }
  if (recorded_owner.empty()) f.legacy_checkpoint = run.checkpoint_path;  // written before UUIDs
  if (!explicit_dir.empty()) {
    f.dir = explicit_dir;
  } else if (recorded_owner == run.uuid) {
    f.dir = fs::path(run.checkpoint_path).parent_path().string();
  } else {
    f.dir = DefaultCheckpointDir(config, run.uuid);
  }
  const ResumeIdentity own{run.uuid, run.config_hash, f.legacy_checkpoint, -1};
  ResumeIdentity recorded = own;
  recorded.max_step = run.last_step;
  const std::vector<std::string> candidates = ResumeCandidates(f.dir, recorded, nullptr);
  if (!candidates.empty()) {
    f.from = candidates.front();
    f.start_step = ReadCheckpointHeader(f.from).step;
  } else if (run.checkpoint_step.value_or(0) > 0 && ResumeCandidates(f.dir, own, nullptr).empty()) {
    const fs::path recorded_dir = fs::path(run.checkpoint_path).parent_path();
    if (run.checkpoint_path.empty() || !fs::is_directory(recorded_dir, ec)) {
      throw TrainRefused(
          kExitConfig,
          fmt::format("run {} '{}' recorded a checkpoint at step {} ({}), but {} holds none of its "
                      "checkpoints (run {}): if the folder moved (another machine or path), pass "
                      "it with --checkpoint-dir FOLDER; to train the config from scratch, start "
                      "a new run (without --resume)",
                      run.id, run.name, *run.checkpoint_step, run.checkpoint_path, f.dir,
                      run.uuid.substr(0, 8)));
    }
    // The folder is there, the file is not: deleted (or, before run UUIDs, pruned by another
    // run of the config). Nothing to continue from: the run trains again from step 0.
    f.warning = fmt::format("its last checkpoint {} (step {}) is gone", run.checkpoint_path,
                            *run.checkpoint_step);
  }
  return f;
}

}  // namespace moelab::cli
