// Read-only access to a moelab database for the GUI, the sweep engine and the fits. The
// connection is opened with SQLITE_OPEN_READONLY, so polling a file that trainers are writing
// never blocks them. Listing runs reads only runs + run_summary, never the metric history.
//
// A Reader is one SQLite connection: use it from one thread at a time (a GUI polls from its
// own background thread with its own Reader).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "core/metrics.h"
#include "db/sqlite.h"
#include "db/types.h"

namespace moelab::db {

class Reader {
 public:
  // Throws std::runtime_error when the file is missing, not a moelab database, or of another
  // schema version.
  explicit Reader(const std::string& path);

  // Every run with its summary, oldest first. A running run whose heartbeat is older than
  // stale_after_s is reported with effective_status kFailed and stale = true.
  std::vector<RunRow> ListRuns(double stale_after_s = 30.0);
  std::optional<RunRow> GetRun(int64_t run_id, double stale_after_s = 30.0);
  std::string RunConfigJson(int64_t run_id);
  std::map<std::string, std::string> RunVars(int64_t run_id);
  // Every run's variables in one query (the run list's sweep-variable columns).
  std::map<int64_t, std::map<std::string, std::string>> AllRunVars();

  // Every sweep: id -> name (empty before migration 3 created the table).
  std::map<int64_t, std::string> SweepNames();
  // The stored (normalised) spec of the sweep named `name`; "" when there is none.
  std::string SweepSpecJson(const std::string& name);

  // The keys Series accepts: per step loss, aux_loss, lr, grad_norm, tokens, flops,
  // step_time_s, tokens_per_s, wall_time; per evaluation val_loss, eval_tokens, eval_flops,
  // eval_wall_time.
  static const std::vector<std::string>& SeriesKeys();
  // Points with step_min <= step <= step_max, ascending. Throws on an unknown key.
  Series GetSeries(int64_t run_id, const std::string& key, int64_t step_min = 0,
                   int64_t step_max = INT64_MAX);
  // Incremental polling: the points after after_step.
  Series SeriesSince(int64_t run_id, const std::string& key, int64_t after_step) {
    return GetSeries(run_id, key, after_step + 1);
  }

  // The matrix at the last recorded step <= step; nullopt when there is none.
  std::optional<MaxLogitMatrix> GetMaxLogitMatrix(int64_t run_id, int64_t step = INT64_MAX);
  MaxLogitTimeline GetMaxLogitTimeline(int64_t run_id, int64_t step_min = 0,
                                       int64_t step_max = INT64_MAX);
  std::vector<moelab::ClipEvent> ClipEvents(int64_t run_id, int64_t step_min = 0,
                                            int64_t step_max = INT64_MAX);
  ExpertLoads GetExpertLoads(int64_t run_id, int64_t step_min = 0, int64_t step_max = INT64_MAX);

  const std::string& path() const { return db_.path(); }

 private:
  std::pair<int, int> Shape(int64_t run_id, bool experts);
  Connection db_;
};

}  // namespace moelab::db
