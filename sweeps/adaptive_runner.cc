#include "sweeps/adaptive_runner.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/file.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <set>

#include "analysis/observations.h"
#include "sweeps/adaptive_chooser.h"
#include "sweeps/adaptive_estimand.h"
#include "sweeps/adaptive_store.h"
#include "sweeps/store.h"

namespace moelab::sweeps {

namespace fs = std::filesystem;

namespace {

// The sweep restricted to `chosen`: every other run is marked as a duplicate of itself, so
// Sweep::Unique() and the runner skip it while indices (and the WSD branch plan) stay the same.
Sweep Subset(const Sweep& sweep, const std::set<int>& chosen) {
  Sweep sub = sweep;
  for (SweepRun& r : sub.runs) {
    if (!chosen.count(r.index) && r.duplicate_of < 0) r.duplicate_of = r.index;
  }
  return sub;
}

// The final evaluation of every done run of the sweep, by run index.
Results ReadResults(const std::string& db_path, Store& store, int64_t sweep_id,
                    const AdaptiveSpec& spec) {
  std::map<std::string, int> index_of;  // run id -> index
  for (const Member& m : store.Members(sweep_id)) index_of[std::to_string(m.run_id)] = m.idx;
  Results out;
  const analysis::ObservationSet set = analysis::LoadObservations(db_path, std::nullopt, spec.key);
  for (const analysis::Observation& o : set.points) {
    auto it = index_of.find(o.run);
    if (it == index_of.end()) continue;
    RunResult& r = out[it->second];
    if (o.flops >= r.flops) r = {o.loss, o.flops, o.tokens};
  }
  return out;
}

std::vector<int> LookSchedule(const std::vector<AdaptiveLookRow>& looks, int min_seeds) {
  std::vector<int> schedule;
  for (const AdaptiveLookRow& l : looks) {
    if (l.seeds >= min_seeds && (schedule.empty() || l.seeds > schedule.back())) {
      schedule.push_back(l.seeds);
    }
  }
  return schedule;
}

int LockAdaptive(const std::string& dir, const std::string& name) {
  fs::create_directories(dir);
  const std::string path = dir + "/adaptive.lock";
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) throw std::runtime_error(fmt::format("cannot open {}", path));
  if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    ::close(fd);
    throw SweepBusyError(
        fmt::format("adaptive sweep '{}' is already being run by another process", name));
  }
  return fd;
}

std::string FormatLook(const AdaptiveLookRow& l) {
  const std::string value = std::isnan(l.lo)
                                ? fmt::format("{} seeds, no interval yet", l.seeds)
                                : fmt::format(
                                      "{:.4f} [{:.4f}, {:.4f}] at {} seeds (c = {:.3f}, alpha "
                                      "spent {:.3f})",
                                      l.estimate, l.lo, l.hi, l.seeds, l.critical, l.alpha_spent);
  return fmt::format("look {}: {}; {:.3g} FLOPs spent; {}", l.batch, value, l.spent_flops,
                     l.decision);
}

// The final word's cost beside the fixed grids' (after a stop, when the last look has seeds).
void PrintGridComparison(const AdaptiveSpace& space, const AdaptiveSpec& spec,
                         const AdaptiveLookRow& last, std::FILE* out) {
  const std::string cost = CostAgainstGrids(space, spec, last);
  if (!cost.empty()) fmt::print(out, "cost: {}\n", cost);
}

}  // namespace

AdaptiveSummary RunAdaptiveSweep(const Sweep& sweep, const RunOptions& run_options) {
  // Every run keeps its stable-phase end, so "extend to" a longer rung continues it (the
  // chooser prices an extension so: adaptive_chooser.cc BatchCost).
  RunOptions options = run_options;
  options.extendable = true;
  if (!sweep.adaptive) throw SpecError("sweep '" + sweep.name + "' has no \"adaptive\" block");
  const AdaptiveSpec& spec = *sweep.adaptive;
  const int lock = LockAdaptive(SweepDir(options.db_path, sweep.name), sweep.name);
  struct Unlock {
    int fd;
    ~Unlock() { ::close(fd); }
  } unlock{lock};
  Store store(options.db_path);
  const int64_t sweep_id = store.UpsertSweep(sweep.name, sweep.spec.dump());
  AdaptiveStore astore(store.connection());
  const AdaptiveSpace space = BuildSpace(sweep, spec);
  std::FILE* out = options.out;
  fmt::print(out, "adaptive sweep '{}': {}\n", sweep.name, DescribeQuestion(spec));
  AdaptiveSummary summary;
  for (;;) {
    if (options.stop_flag && options.stop_flag->load()) {
      summary.exit_code = 4;
      return summary;
    }
    std::vector<AdaptiveBatchRow> batches = astore.Batches(sweep_id);
    std::vector<AdaptiveLookRow> looks = astore.Looks(sweep_id);
    std::set<int> chosen;
    double spent = 0;
    for (const AdaptiveBatchRow& b : batches) {
      chosen.insert(b.runs.begin(), b.runs.end());
      spent += b.cost_flops;
    }
    summary.batches = static_cast<int>(batches.size());
    summary.spent_flops = spent;
    if (!looks.empty() && looks.back().batch == static_cast<int>(batches.size()) &&
        looks.back().decision != "continue") {
      summary.decision = looks.back().decision;
      summary.seeds = looks.back().seeds;
      fmt::print(out, "{}\n", FormatLook(looks.back()));
      PrintGridComparison(space, spec, looks.back(), out);
      return summary;
    }
    if (batches.empty() || (!looks.empty() && looks.back().batch == batches.back().batch)) {
      // Every batch looked at: choose the next one from the database.
      const Results results = ReadResults(options.db_path, store, sweep_id, spec);
      const EstimandReading reading =
          ReadEstimand(space, spec, results, LookSchedule(looks, spec.min_seeds));
      const AdaptiveBatch next = ChooseBatch(space, spec, reading, chosen, spent);
      if (next.runs.empty()) {
        AdaptiveLookRow l = looks.empty() ? AdaptiveLookRow{} : looks.back();
        l.decision = "stop: " + next.exhausted;
        l.spent_flops = spent;
        if (looks.empty()) l.estimate = l.lo = l.hi = l.critical = NAN;
        astore.AddLook(sweep_id, l);  // the final word replaces the last look's "continue"
        continue;
      }
      AdaptiveBatchRow row;
      row.batch = static_cast<int>(batches.size()) + 1;
      row.runs = next.runs;
      row.why = next.why;
      row.cost_flops = next.cost_flops;
      astore.AddBatch(sweep_id, row);
      fmt::print(out, "batch {}: {} runs, {:.3g} FLOPs\n", row.batch, row.runs.size(),
                 row.cost_flops);
      for (const std::string& w : row.why) fmt::print(out, "  why: {}\n", w);
      continue;
    }
    // The last recorded batch has no look yet: train it (or finish it after a crash).
    const AdaptiveBatchRow& batch = batches.back();
    const RunSummary rs = RunSweep(Subset(sweep, chosen), options);
    if (rs.exit_code == 4) {
      summary.exit_code = 4;
      return summary;
    }
    const Results results = ReadResults(options.db_path, store, sweep_id, spec);
    const EstimandReading reading =
        ReadEstimand(space, spec, results, LookSchedule(looks, spec.min_seeds));
    AdaptiveLookRow look;
    look.batch = batch.batch;
    look.seeds = static_cast<int>(reading.seeds.size());
    look.estimate = reading.has_interval ? reading.ratio : NAN;
    look.lo = reading.lo;
    look.hi = reading.hi;
    look.critical = reading.has_interval ? reading.interval.critical : NAN;
    look.alpha_spent = reading.has_interval ? reading.interval.alpha_spent : NAN;
    look.spent_flops = spent;
    const std::string stop = StopReason(spec, reading);
    look.decision = stop.empty() ? "continue" : "stop: " + stop;
    nlohmann::json seeds = nlohmann::json::object();
    for (size_t i = 0; i < reading.seeds.size(); ++i) {
      seeds[std::to_string(reading.seeds[i])] = std::exp(reading.log_value[i]);
    }
    // The per-seed ratio, or a slope's factor per doubling: the estimand on its reported scale.
    look.detail = {{spec.IsSlope() ? "per_seed_per_doubling" : "per_seed_ratio", seeds},
                   {"notes", reading.notes}};
    astore.AddLook(sweep_id, look);
    fmt::print(out, "{}\n", FormatLook(look));
    if (rs.exit_code != 0) {
      summary.exit_code = rs.exit_code;
      summary.decision = "a run failed for good: fix it and resume";
      return summary;
    }
  }
}

bool HasAdaptiveBatches(const std::string& db_path, const std::string& sweep_name) {
  if (!fs::exists(db_path)) return false;
  Store store(db_path);
  const auto row = store.FindSweep(sweep_name);
  return row && !AdaptiveStore(store.connection()).Batches(row->id).empty();
}

void PrintAdaptiveStatus(const std::string& db_path, const Sweep& sweep, std::FILE* out) {
  Store store(db_path, Store::Mode::kReadOnly);
  const auto row = store.FindSweep(sweep.name);
  if (!row) return;
  AdaptiveStore astore(store.connection());
  if (sweep.adaptive) fmt::print(out, "question: {}\n", DescribeQuestion(*sweep.adaptive));
  const auto looks = astore.Looks(row->id);
  for (const AdaptiveBatchRow& b : astore.Batches(row->id)) {
    fmt::print(out, "batch {}: {} runs, {:.3g} FLOPs\n", b.batch, b.runs.size(), b.cost_flops);
    for (const std::string& w : b.why) fmt::print(out, "  why: {}\n", w);
    for (const AdaptiveLookRow& l : looks)
      if (l.batch == b.batch) fmt::print(out, "  {}\n", FormatLook(l));
  }
  if (sweep.adaptive && !looks.empty()) {
    PrintGridComparison(BuildSpace(sweep, *sweep.adaptive), *sweep.adaptive, looks.back(), out);
  }
}

}  // namespace moelab::sweeps
