// The GUI's view of a moelab database. A background thread owns the only db::Reader (read-only
// connection) and polls incrementally; the UI thread only ever swaps shared_ptrs to immutable
// snapshots under a short mutex, so a frame never waits on SQLite however large the file is.
//
// Data is loaded lazily: the UI asks for what it draws (Series, Logits, Experts) every frame,
// which registers interest; the poller loads wanted items oldest-request first, then keeps them
// current by fetching only rows newer than the ones held, for runs whose summary changed.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "db/types.h"
#include "gui/view_model.h"

namespace moelab::db {
class Reader;
}

namespace moelab::gui {

struct RunEntry {
  db::RunRow row;
  RunKeys keys;            // id, name, status, vars, flattened config
  std::string sweep_name;  // "" for a lone run
  std::optional<double> tau;
};

struct RunsSnapshot {
  std::vector<std::shared_ptr<const RunEntry>> runs;  // by id
  std::vector<std::string> var_keys;                  // union of sweep variable names
  std::vector<std::string> config_keys;               // union of flattened config keys
  std::map<int64_t, std::string> sweeps;              // id -> name
  uint64_t version = 0;
  const RunEntry* Find(int64_t id) const;
};

// One metric of one run; x is the step (double so plotting code needs one type).
struct SeriesData {
  std::vector<double> steps;
  std::vector<double> values;
  uint64_t version = 0;
};

struct LogitData {
  int layers = 0, heads = 0;
  std::vector<double> steps;
  std::vector<float> values;     // [i * layers * heads + l * heads + h]
  std::vector<float> layer_max;  // [i * layers + l], max over heads
  std::vector<ClipPoint> clips;  // ascending step
  uint64_t version = 0;
};

struct ExpertData {
  int moe_layers = 0, experts = 0;
  std::vector<double> steps;
  std::vector<int64_t> counts;  // [i * moe_layers * experts + l * experts + e]
  uint64_t version = 0;
};

class DataStore {
 public:
  // Starts polling `path` at once. A missing or foreign file is reported through error() and
  // retried, so a database created later is picked up.
  explicit DataStore(std::string path, double poll_interval_s = 1.0);
  ~DataStore();
  DataStore(const DataStore&) = delete;
  DataStore& operator=(const DataStore&) = delete;

  const std::string& path() const { return path_; }
  std::shared_ptr<const RunsSnapshot> Runs() const;
  // Empty while the file opens and reads fine.
  std::string error() const;

  // Each returns the latest snapshot, or nullptr before the first load, and marks the item
  // wanted. key: one of db::Reader::SeriesKeys().
  std::shared_ptr<const SeriesData> Series(int64_t run, const std::string& key);
  std::shared_ptr<const LogitData> Logits(int64_t run);
  std::shared_ptr<const ExpertData> Experts(int64_t run);

  // True once the run list was read and every wanted item has been loaded once: headless
  // screenshots wait for this so images show data, not a loading state.
  bool Settled() const;
  // Wanted items not loaded yet (the UI shows "loading N").
  int Pending() const;

 private:
  enum Kind { kSeries, kLogits, kExperts };
  using Key = std::tuple<Kind, int64_t, std::string>;
  struct Item {
    std::shared_ptr<const void> data;
    uint64_t want_order = 0;
    double fetched_updated_at = -1;           // run summary's updated_at when last fetched
    std::optional<RunStatus> fetched_status;  // nullopt before the first fetch
  };

  std::shared_ptr<const void> Want(const Key& key);
  void Loop();
  void PollOnce(db::Reader* reader);
  void Fetch(db::Reader* reader, const Key& key, const RunEntry* run);

  const std::string path_;
  const double poll_interval_s_;

  mutable std::mutex mu_;
  std::condition_variable wake_;
  std::shared_ptr<const RunsSnapshot> runs_;
  std::map<Key, Item> items_;
  uint64_t want_counter_ = 0;
  bool listed_ = false;
  std::string error_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace moelab::gui
