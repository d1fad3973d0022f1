#include "sweeps/plan.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <map>
#include <set>
#include <thread>

#include "analysis/scaling.h"
#include "core/flops.h"
#include "core/metrics.h"
#include "core/train/trainer.h"
#include "db/reader.h"

namespace moelab::sweeps {

namespace fs = std::filesystem;

namespace {

// Collects step times and ends the measurement once it has enough of them.
class TimingSink : public MetricsSink {
 public:
  TimingSink(int min_steps, double min_seconds) : min_steps_(min_steps), min_s_(min_seconds) {}
  void OnStep(const StepRecord& r, const StepStats&) override {
    times.push_back(r.step_time_s);
    if (times.size() > 1) measured += r.step_time_s;  // the first step warms caches and pools
    if (static_cast<int>(times.size()) > min_steps_ && measured >= min_s_) stop.store(true);
  }
  void OnEval(int64_t, int64_t, double, double) override {}
  void OnClip(const std::vector<ClipEvent>&) override {}
  void OnHeartbeat() override {}
  void OnCheckpoint(int64_t, const std::string&) override {}
  void OnEnd(RunStatus, const std::string&) override {}
  std::vector<double> times;
  double measured = 0;
  std::atomic<bool> stop{false};

 private:
  int min_steps_;
  double min_s_;
};

std::string Si(double x, const char* unit = "") {
  const char* prefixes[] = {"", "k", "M", "G", "T", "P", "E"};
  int i = 0;
  while (std::abs(x) >= 1000 && i < 6) {
    x /= 1000;
    ++i;
  }
  return fmt::format("{:.3g}{}{}", x, prefixes[i], unit);
}

std::string Duration(double s) {
  if (!std::isfinite(s)) return "--";
  const int64_t t = static_cast<int64_t>(std::llround(s));
  if (t >= 3600) return fmt::format("{}h{:02}m", t / 3600, (t % 3600) / 60);
  if (t >= 60) return fmt::format("{}m{:02}s", t / 60, t % 60);
  return fmt::format("{}s", t);
}

}  // namespace

Throughput MeasureThroughput(const RunConfig& config, int threads, int min_steps,
                             double min_seconds) {
  RunConfig c = config;
  // Synthetic data has the same shapes and cost per step and needs no corpus.
  c.data.source = "markov";
  c.train.tokens = 0;
  c.train.steps = 100000;
  c.train.threads = threads;
  c.schedule.warmup_steps = 0;
  c.eval.every = 0;
  c.checkpoint.every = 0;
  const fs::path dir =
      fs::temp_directory_path() / fmt::format("moelab_calibrate_{}", static_cast<int>(getpid()));
  TimingSink sink(min_steps, min_seconds);
  TrainOptions options;
  options.checkpoint_dir = dir.string();
  options.progress = false;
  options.stop_flag = &sink.stop;
  Train(c, &sink, options);
  std::error_code ec;
  fs::remove_all(dir, ec);
  Throughput t;
  t.threads = threads;
  const size_t n = sink.times.size() > 1 ? sink.times.size() - 1 : 0;
  const double tokens = static_cast<double>(TokensPerStep(c)) * n;
  t.flops_per_s =
      sink.measured > 0 ? ForwardFlopsPerToken(c).training() * tokens / sink.measured : 0;
  t.how = fmt::format("measured: {} training steps ({:.1f} s) at {} thread(s) = {}", n,
                      sink.measured, threads, Si(t.flops_per_s, "FLOP/s"));
  return t;
}

const SweepRun* CalibrationRun(const Sweep& sweep) {
  const auto unique = sweep.Unique();
  if (unique.empty()) return nullptr;
  return *std::max_element(unique.begin(), unique.end(), [](const SweepRun* a, const SweepRun* b) {
    return ForwardFlopsPerToken(a->config).training() < ForwardFlopsPerToken(b->config).training();
  });
}

int ThreadsPerRun(int parallel) {
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return std::max(1, cores / std::max(1, parallel));
}

std::vector<std::string> FitabilityWarnings(const Sweep& sweep) {
  const auto budget_or_seed = [](const std::string& key) {
    const std::string leaf = key.substr(key.rfind('.') + 1);
    return leaf == "seed" || leaf.ends_with("steps") || leaf.ends_with("tokens");
  };
  struct Family {
    std::set<uint64_t> seeds;     // replicates: a seed's trunk and its branches are one
    std::set<double> eval_flops;  // every evaluation's training FLOPs: frontier candidates
  };
  std::map<std::string, Family> families;
  for (const SweepRun* r : sweep.Unique()) {
    std::string label;
    for (auto it = r->vars.begin(); it != r->vars.end(); ++it) {
      if (budget_or_seed(it.key())) continue;
      label += fmt::format("{}{}={}", label.empty() ? "" : ",", it.key(), ShortValue(it.value()));
    }
    Family& f = families[label];
    f.seeds.insert(r->config.train.seed);
    const double per_step =
        ForwardFlopsPerToken(r->config).training() * static_cast<double>(TokensPerStep(r->config));
    const int64_t total = r->config.total_steps(), every = r->config.eval.every;
    for (int64_t s = every > 0 ? every : total; s < total; s += every)
      f.eval_flops.insert(per_step * s);
    f.eval_flops.insert(per_step * total);
  }
  const int min_seeds = analysis::FitOptions{}.min_units;
  std::vector<std::string> few_runs, few_points;
  for (const auto& [label, f] : families) {
    const std::string name = label.empty() ? "the sweep" : label;
    const int seeds = static_cast<int>(f.seeds.size());
    if (seeds < min_seeds) few_runs.push_back(fmt::format("{} has {}", name, seeds));
    if (static_cast<int>(f.eval_flops.size()) < analysis::kMinFrontierPoints) {
      few_points.push_back(fmt::format("{} has {}", name, f.eval_flops.size()));
    }
  }
  std::vector<std::string> out;
  const auto list = [](const std::vector<std::string>& v) {
    std::string s;
    for (size_t i = 0; i < v.size() && i < 6; ++i) s += (i ? "; " : "") + v[i];
    if (v.size() > 6) s += fmt::format("; ... {} more", v.size() - 6);
    return s;
  };
  if (!few_runs.empty()) {
    out.push_back(fmt::format(
        "`moelab fit` gives no interval for this design: the replicate is the seed (a trunk and "
        "its branches), it needs at least {} seeds per family, and {} of {} families have "
        "fewer ({}). Add seeds (train.seed values); fewer seeds give point estimates only",
        min_seeds, few_runs.size(), families.size(), list(few_runs)));
  }
  if (!few_points.empty()) {
    out.push_back(fmt::format(
        "`moelab fit` needs at least {} points on each family's loss-over-compute frontier, and "
        "{} of {} families have fewer distinct evaluation budgets than that ({}): add budgets or "
        "evaluate more often (eval.every)",
        analysis::kMinFrontierPoints, few_points.size(), families.size(), list(few_points)));
  }
  return out;
}

void PrintPlan(const Sweep& sweep, const PlanOptions& options, std::FILE* out) {
  const auto unique = sweep.Unique();
  // The fields that differ between runs are the table's columns.
  std::vector<std::string> keys;
  for (const SweepRun& r : sweep.runs) {
    for (auto it = r.vars.begin(); it != r.vars.end(); ++it) {
      if (std::find(keys.begin(), keys.end(), it.key()) == keys.end()) keys.push_back(it.key());
    }
  }
  std::vector<std::string> varying;
  for (const std::string& k : keys) {
    std::set<std::string> values;
    for (const SweepRun& r : sweep.runs) values.insert(r.vars.contains(k) ? r.vars[k].dump() : "-");
    if (values.size() > 1) varying.push_back(k);
  }
  const int parallel = std::max(1, options.parallel);
  const int threads =
      options.threads_per_run > 0 ? options.threads_per_run : ThreadsPerRun(parallel);
  Throughput tp;
  if (options.throughput) {
    tp = *options.throughput;
  } else if (options.calibrate && !unique.empty()) {
    try {
      tp = MeasureThroughput(CalibrationRun(sweep)->config, threads);
    } catch (const std::exception& e) {
      tp.how = fmt::format("calibration failed: {}", e.what());
    }
  }
  std::map<std::string, std::string> done;
  if (!options.db_path.empty() && fs::exists(options.db_path)) {
    db::Reader reader(options.db_path);
    for (const db::RunRow& r : reader.ListRuns())
      if (r.status == RunStatus::kDone) done[r.config_hash] = fmt::format("done (run {})", r.id);
  }

  fmt::print(out, "sweep {}: {} runs ({} unique)\n", sweep.name, sweep.runs.size(), unique.size());
  for (const std::string& w : sweep.warnings) fmt::print(out, "warning: {}\n", w);
  std::vector<size_t> widths;
  for (const std::string& k : varying) {
    size_t w = k.size();
    for (const SweepRun& r : sweep.runs)
      w = std::max(w, r.vars.contains(k) ? ShortValue(r.vars[k]).size() : 1);
    widths.push_back(std::min<size_t>(w, 24));
  }
  std::string header = fmt::format("{:>4} ", "#");
  for (size_t i = 0; i < varying.size(); ++i)
    header += fmt::format("{:>{}} ", varying[i], widths[i]);
  header += fmt::format("{:>9} {:>9} {:>7} {:>9} {:>10} {:>9}  {}", "active", "total", "steps",
                        "tokens", "train FLOPs", "est. time", "note");
  fmt::print(out, "{}\n", header);
  double total_flops = 0, total_time = 0, todo_time = 0, saved_flops = 0;
  const std::vector<BranchPlan> branches = PlanWsdBranches(sweep);
  for (const SweepRun& r : sweep.runs) {
    const ParamCounts pc = CountParams(r.config);
    const double tokens_per_step = static_cast<double>(TokensPerStep(r.config));
    const double tokens = r.config.total_steps() * tokens_per_step;
    const BranchPlan& branch = branches[r.index];
    // A WSD branch trains only its decay; its stable phase is the parent's.
    const double own_steps = r.config.total_steps() - std::max<int64_t>(0, branch.step);
    const double fpt = ForwardFlopsPerToken(r.config).training();
    const double flops = fpt * tokens_per_step * own_steps;
    if (branch.parent >= 0) saved_flops += fpt * tokens_per_step * branch.step;
    const double time = tp.flops_per_s > 0 ? flops / tp.flops_per_s : NAN;
    std::string note;
    if (r.duplicate_of >= 0) {
      note = fmt::format("same config as #{}", r.duplicate_of);
    } else {
      if (branch.parent >= 0) {
        note = fmt::format("WSD branch of #{} at step {} ", branch.parent, branch.step);
      }
      total_flops += flops;
      total_time += time;
      if (done.count(r.hash)) {
        note += done[r.hash];
      } else {
        todo_time += time;
      }
    }
    std::string line = fmt::format("{:>4} ", r.index);
    for (size_t i = 0; i < varying.size(); ++i) {
      const std::string v = r.vars.contains(varying[i]) ? ShortValue(r.vars[varying[i]]) : "-";
      line += fmt::format("{:>{}} ", v.substr(0, widths[i]), widths[i]);
    }
    line += fmt::format("{:>9} {:>9} {:>7} {:>9} {:>10} {:>9}  {}", Si(pc.active), Si(pc.total),
                        r.config.total_steps(), Si(tokens), Si(flops), Duration(time), note);
    fmt::print(out, "{}\n", line);
  }
  fmt::print(out, "total: {} unique runs, {} training FLOPs, CPU time {} at {} thread(s) per run",
             unique.size(), Si(total_flops), Duration(total_time), threads);
  if (tp.flops_per_s > 0) {
    fmt::print(out, "; about {} wall with --parallel {}{}", Duration(todo_time / parallel),
               parallel, done.empty() ? "" : " (runs already done excluded)");
  }
  fmt::print(out, "\n");
  if (saved_flops > 0) {
    fmt::print(out,
               "WSD branching: shorter runs start from the longest run's stable phase, saving {} "
               "training FLOPs (already left out of the FLOPs and times above)\n",
               Si(saved_flops));
  }
  if (options.gpu_peak_tflops > 0 && options.gpu_mfu > 0) {
    const double rate = options.gpu_peak_tflops * 1e12 * options.gpu_mfu;
    fmt::print(out,
               "GPU time: {} training FLOPs at {:.0f} % of {}'s {:g} TFLOP/s peak ({} FLOP/s): "
               "{:.1f} GPU-hours (stated utilisation, not measured; the model FLOPs counted as "
               "above, optimizer and evaluation excluded)\n",
               Si(total_flops), 100 * options.gpu_mfu, options.gpu_name, options.gpu_peak_tflops,
               Si(rate), total_flops / rate / 3600);
  }
  fmt::print(out, "time estimate: {}\n", tp.how.empty() ? options.uncalibrated : tp.how);
  for (const std::string& w : FitabilityWarnings(sweep)) fmt::print(out, "warning: {}\n", w);
  if (tp.flops_per_s > 0) {
    fmt::print(out,
               "  (one rate, the largest run's, for all runs: smaller models run at a lower rate, "
               "so small runs take longer than shown; parallel runs share memory bandwidth)\n");
  }
}

}  // namespace moelab::sweeps
