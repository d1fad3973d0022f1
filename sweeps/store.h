// The sweep engine's bookkeeping in the moelab database: the sweeps row, membership of runs
// (table sweep_runs, migration 3) with retry counts, kept errors and branch parents, and the
// copy of a long run's recorded rows into a WSD branch.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "db/sqlite.h"

namespace moelab::sweeps {

struct SweepRow {
  int64_t id = 0;
  std::string name;
  std::string spec_json;
  double created_at = 0;
};

struct Member {
  int64_t run_id = 0;
  int idx = 0;
  std::string checkpoint_dir;
  int failures = 0;
  bool retryable = true;
  nlohmann::json errors = nlohmann::json::array();  // one entry per failed attempt
  std::optional<int64_t> branch_of;
  std::optional<int64_t> branch_step;
};

class Store {
 public:
  explicit Store(const std::string& db_path);
  // Only the queries (FindSweep, ListSweeps, Members) work on a read-only Store; it opens the
  // file read-only, so `sweep status` reads a database in a folder it cannot write.
  enum class Mode { kReadWrite, kReadOnly };
  Store(const std::string& db_path, Mode mode);

  // Inserts the sweep or, when the name exists, refreshes its spec; returns its id.
  int64_t UpsertSweep(const std::string& name, const std::string& spec_json);
  std::optional<SweepRow> FindSweep(const std::string& name);
  std::vector<SweepRow> ListSweeps();

  std::vector<Member> Members(int64_t sweep_id);
  void Link(int64_t sweep_id, int64_t run_id, int idx, const std::string& checkpoint_dir);
  void RecordFailure(int64_t sweep_id, int64_t run_id, const std::string& error, bool retryable);
  void SetBranch(int64_t sweep_id, int64_t run_id, int64_t parent_run, int64_t step);

  // Copies the parent's per-step rows (steps, evals, max logits, expert counts, clip events)
  // with step <= step into child, skipping rows the child already has. A WSD branch then shows
  // its whole curve, and `moelab train --resume`'s Attach keeps exactly these rows.
  int CopyRowsUpTo(int64_t parent_run, int64_t child_run, int64_t step);

  db::Connection& connection() { return db_; }

 private:
  void Transaction(const std::function<void()>& body);
  db::Connection db_;
};

}  // namespace moelab::sweeps
