#include "gui/data_store.h"

#include <algorithm>
#include <chrono>
#include <exception>
#include <filesystem>
#include <set>

#include "db/reader.h"
#include "db/schema.h"

namespace moelab::gui {

const RunEntry* RunsSnapshot::Find(int64_t id) const {
  auto it = std::lower_bound(runs.begin(), runs.end(), id,
                             [](const auto& r, int64_t v) { return r->row.id < v; });
  return it != runs.end() && (*it)->row.id == id ? it->get() : nullptr;
}

DataStore::DataStore(std::string path, double poll_interval_s)
    : path_(std::move(path)),
      poll_interval_s_(poll_interval_s),
      runs_(std::make_shared<RunsSnapshot>()) {
  thread_ = std::thread([this] { Loop(); });
}

DataStore::~DataStore() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

std::shared_ptr<const RunsSnapshot> DataStore::Runs() const {
  std::lock_guard<std::mutex> lock(mu_);
  return runs_;
}

std::string DataStore::error() const {
  std::lock_guard<std::mutex> lock(mu_);
  return error_;
}

std::shared_ptr<const void> DataStore::Want(const Key& key) {
  std::lock_guard<std::mutex> lock(mu_);
  auto [it, inserted] = items_.try_emplace(key);
  if (inserted) {
    it->second.want_order = ++want_counter_;
    wake_.notify_all();
  }
  return it->second.data;
}

std::shared_ptr<const SeriesData> DataStore::Series(int64_t run, const std::string& key) {
  return std::static_pointer_cast<const SeriesData>(Want({kSeries, run, key}));
}
std::shared_ptr<const LogitData> DataStore::Logits(int64_t run) {
  return std::static_pointer_cast<const LogitData>(Want({kLogits, run, ""}));
}
std::shared_ptr<const ExpertData> DataStore::Experts(int64_t run) {
  return std::static_pointer_cast<const ExpertData>(Want({kExperts, run, ""}));
}

bool DataStore::Settled() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (!listed_ && error_.empty()) return false;
  for (const auto& [k, item] : items_) {
    if (!item.data && error_.empty()) return false;
  }
  return true;
}

int DataStore::Pending() const {
  std::lock_guard<std::mutex> lock(mu_);
  int n = 0;
  for (const auto& [k, item] : items_) n += item.data ? 0 : 1;
  return n;
}

void DataStore::Loop() {
  std::unique_ptr<db::Reader> reader;
  while (true) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stop_) return;
    }
    try {
      if (!reader) {
        if (!std::filesystem::exists(path_)) {
          throw std::runtime_error("no such file: " + path_);
        }
        reader = std::make_unique<db::Reader>(path_);
      }
      PollOnce(reader.get());
      std::lock_guard<std::mutex> lock(mu_);
      error_.clear();
    } catch (const std::exception& e) {
      // Keep the message for the window and start over with a fresh connection: the file may
      // be replaced, migrated or created later.
      reader.reset();
      std::lock_guard<std::mutex> lock(mu_);
      error_ = e.what();
    }
    std::unique_lock<std::mutex> lock(mu_);
    const bool pending =
        std::any_of(items_.begin(), items_.end(), [](const auto& kv) { return !kv.second.data; });
    if (pending && error_.empty()) continue;  // new wants arrived while polling
    wake_.wait_for(lock, std::chrono::duration<double>(error_.empty() ? poll_interval_s_ : 2.0),
                   [this] {
                     if (stop_) return true;
                     return std::any_of(items_.begin(), items_.end(),
                                        [](const auto& kv) { return !kv.second.data; });
                   });
  }
}

void DataStore::PollOnce(db::Reader* reader) {
  // ---- Run list: cheap (runs + run_summary only), re-read every poll. ----
  std::vector<db::RunRow> rows = reader->ListRuns();
  auto vars = reader->AllRunVars();
  std::map<int64_t, std::string> sweeps = reader->SweepNames();
  std::shared_ptr<const RunsSnapshot> old = Runs();
  auto snap = std::make_shared<RunsSnapshot>();
  snap->sweeps = sweeps;
  std::set<std::string> var_keys, config_keys;
  for (auto& row : rows) {
    const RunEntry* prev = old->Find(row.id);
    auto entry = std::make_shared<RunEntry>();
    if (prev) {
      entry->keys.config = prev->keys.config;
      entry->tau = prev->tau;
    } else {
      try {
        entry->keys.config = FlattenConfig(nlohmann::json::parse(reader->RunConfigJson(row.id)));
      } catch (const nlohmann::json::exception&) {
        // A config that is not JSON leaves the config columns empty; the run still lists.
      }
      entry->tau = ClipTau(entry->keys.config);
    }
    entry->keys.id = row.id;
    entry->keys.name = row.name;
    entry->keys.status = ToString(row.effective_status);
    if (auto it = vars.find(row.id); it != vars.end()) entry->keys.vars = it->second;
    if (row.sweep_id) {
      auto it = sweeps.find(*row.sweep_id);
      entry->sweep_name = it != sweeps.end() ? it->second : "#" + std::to_string(*row.sweep_id);
    }
    for (const auto& [k, v] : entry->keys.vars) var_keys.insert(k);
    for (const auto& [k, v] : entry->keys.config) config_keys.insert(k);
    entry->row = std::move(row);
    snap->runs.push_back(std::move(entry));
  }
  snap->var_keys.assign(var_keys.begin(), var_keys.end());
  snap->config_keys.assign(config_keys.begin(), config_keys.end());
  {
    std::lock_guard<std::mutex> lock(mu_);
    snap->version = runs_->version + 1;
    runs_ = snap;
    listed_ = true;
  }

  // ---- Wanted items: unloaded ones first (in request order), then stale ones. ----
  while (true) {
    Key next;
    const RunEntry* run = nullptr;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stop_) return;
      const Item* best = nullptr;
      for (const auto& [key, item] : items_) {
        if (item.data) continue;
        if (!best || item.want_order < best->want_order) {
          best = &item;
          next = key;
        }
      }
      if (!best) break;
    }
    run = snap->Find(std::get<1>(next));
    Fetch(reader, next, run);
  }
  std::vector<Key> stale;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [key, item] : items_) {
      const RunEntry* run = snap->Find(std::get<1>(key));
      if (!run) continue;
      const double updated = run->row.updated_at.value_or(0);
      if (updated != item.fetched_updated_at || run->row.effective_status != item.fetched_status) {
        stale.push_back(key);
      }
    }
  }
  for (const auto& key : stale) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stop_) return;
    }
    Fetch(reader, key, snap->Find(std::get<1>(key)));
  }
}

void DataStore::Fetch(db::Reader* reader, const Key& key, const RunEntry* run) {
  const auto [kind, run_id, name] = key;
  std::shared_ptr<const void> held;
  {
    std::lock_guard<std::mutex> lock(mu_);
    held = items_[key].data;
  }
  std::shared_ptr<const void> result;
  if (!run) {
    // Unknown run (deleted, or an id given on the command line that does not exist): an empty
    // item, so the UI stops waiting.
    if (kind == kSeries) result = std::make_shared<SeriesData>();
    if (kind == kLogits) result = std::make_shared<LogitData>();
    if (kind == kExperts) result = std::make_shared<ExpertData>();
  } else if (kind == kSeries) {
    auto prev = std::static_pointer_cast<const SeriesData>(held);
    const int64_t after =
        prev && !prev->steps.empty() ? static_cast<int64_t>(prev->steps.back()) : 0;
    db::Series fresh = reader->SeriesSince(run_id, name, after);
    if (!prev || !fresh.steps.empty()) {
      // Copy-on-append: the UI may be drawing the previous snapshot right now.
      auto next = prev ? std::make_shared<SeriesData>(*prev) : std::make_shared<SeriesData>();
      next->steps.reserve(next->steps.size() + fresh.steps.size());
      for (int64_t s : fresh.steps) next->steps.push_back(static_cast<double>(s));
      next->values.insert(next->values.end(), fresh.values.begin(), fresh.values.end());
      next->version = (prev ? prev->version : 0) + 1;
      result = next;
    }
  } else if (kind == kLogits) {
    auto prev = std::static_pointer_cast<const LogitData>(held);
    const int64_t after =
        prev && !prev->steps.empty() ? static_cast<int64_t>(prev->steps.back()) : 0;
    db::MaxLogitTimeline tl = reader->GetMaxLogitTimeline(run_id, after + 1);
    const int64_t clip_after = prev && !prev->clips.empty() ? prev->clips.back().step : 0;
    std::vector<ClipEvent> clips = reader->ClipEvents(run_id, clip_after + 1);
    if (!prev || !tl.steps.empty() || !clips.empty()) {
      auto next = prev ? std::make_shared<LogitData>(*prev) : std::make_shared<LogitData>();
      if (tl.layers > 0) {
        next->layers = tl.layers;
        next->heads = tl.heads;
      } else if (!prev) {
        next->layers = run->row.shape.layers;
        next->heads = run->row.shape.heads;
      }
      for (int64_t s : tl.steps) next->steps.push_back(static_cast<double>(s));
      next->values.insert(next->values.end(), tl.values.begin(), tl.values.end());
      std::vector<float> lm = MaxOverHeads(tl.values, tl.layers, tl.heads);
      next->layer_max.insert(next->layer_max.end(), lm.begin(), lm.end());
      for (const auto& c : clips) next->clips.push_back({c.step, c.layer, c.head});
      next->version = (prev ? prev->version : 0) + 1;
      result = next;
    }
  } else {
    auto prev = std::static_pointer_cast<const ExpertData>(held);
    const int64_t after =
        prev && !prev->steps.empty() ? static_cast<int64_t>(prev->steps.back()) : 0;
    db::ExpertLoads loads = reader->GetExpertLoads(run_id, after + 1);
    if (!prev || !loads.steps.empty()) {
      auto next = prev ? std::make_shared<ExpertData>(*prev) : std::make_shared<ExpertData>();
      if (loads.moe_layers > 0) {
        next->moe_layers = loads.moe_layers;
        next->experts = loads.experts;
      } else if (!prev) {
        next->moe_layers = run->row.shape.moe_layers;
        next->experts = run->row.shape.experts;
      }
      for (int64_t s : loads.steps) next->steps.push_back(static_cast<double>(s));
      next->counts.insert(next->counts.end(), loads.counts.begin(), loads.counts.end());
      next->version = (prev ? prev->version : 0) + 1;
      result = next;
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  Item& item = items_[key];
  if (result) item.data = std::move(result);
  if (run) {
    item.fetched_updated_at = run->row.updated_at.value_or(0);
    item.fetched_status = run->row.effective_status;
  } else {
    item.fetched_updated_at = -1;
  }
}

}  // namespace moelab::gui
