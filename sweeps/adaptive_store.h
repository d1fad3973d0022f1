// The adaptive sweep's own bookkeeping in the moelab database (migration 9): the batches the
// chooser picked, written before a batch starts, and the look taken after it. A killed adaptive
// sweep resumes from these rows: the last batch without a look is finished (the ordinary sweep
// runner resumes its runs), then looked at, and only then is a new batch chosen.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "db/sqlite.h"

namespace moelab::sweeps {

struct AdaptiveBatchRow {
  int batch = 0;                 // 1-based
  std::vector<int> runs;         // indices into the sweep's expanded runs
  std::vector<std::string> why;  // one line per choice
  double cost_flops = 0;         // the chooser's price of the batch
  double created_at = 0;
};

struct AdaptiveLookRow {
  int batch = 0;
  int seeds = 0;                        // seeds that reach the target in both arms
  double estimate = 0, lo = 0, hi = 0;  // ratio scale; NaN before min_seeds
  double critical = 0, alpha_spent = 0;
  double spent_flops = 0;                            // FLOPs of every batch so far
  std::string decision;                              // "continue", "stop: ...", "budget spent: ..."
  nlohmann::json detail = nlohmann::json::object();  // per-seed values, notes
  double created_at = 0;
};

class AdaptiveStore {
 public:
  explicit AdaptiveStore(db::Connection& db) : db_(db) {}

  std::vector<AdaptiveBatchRow> Batches(int64_t sweep_id);
  std::vector<AdaptiveLookRow> Looks(int64_t sweep_id);
  // Inserts batch row.batch; a batch already recorded under that number is kept (a resumed
  // sweep never rewrites a choice it made).
  void AddBatch(int64_t sweep_id, const AdaptiveBatchRow& row);
  void AddLook(int64_t sweep_id, const AdaptiveLookRow& row);

 private:
  db::Connection& db_;
};

}  // namespace moelab::sweeps
