#include "sweeps/plan.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <ctime>
#include <filesystem>
#include <map>
#include <set>
#include <thread>

#include "core/device.h"
#include "core/flops.h"
#include "core/metrics.h"
#include "core/train/trainer.h"
#include "db/reader.h"
#include "sweeps/fit_plan.h"

namespace moelab::sweeps {

namespace fs = std::filesystem;

namespace {

// CPU seconds of this process, every thread (the engine's OpenMP and BLAS threads included).
double ProcessCpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// Collects step times and the process CPU time they took, and ends the measurement once it has
// enough of them.
class TimingSink : public MetricsSink {
 public:
  TimingSink(int min_steps, double min_seconds) : min_steps_(min_steps), min_s_(min_seconds) {}
  void OnStep(const StepRecord& r, const StepStats&) override {
    times.push_back(r.step_time_s);
    // The first step warms caches and pools: CPU time counts from its end.
    const double cpu_now = ProcessCpuSeconds();
    if (times.size() == 1) cpu_start_ = cpu_now;
    cpu = cpu_now - cpu_start_;
    if (times.size() > 1) measured += r.step_time_s;
    // Enough CPU seconds, not wall seconds: on a loaded machine a few wall seconds hold a
    // fraction of a CPU second, too few steps to time.
    if (static_cast<int>(times.size()) > min_steps_ && cpu >= min_s_) stop.store(true);
  }
  void OnEval(int64_t, int64_t, double, double) override {}
  void OnClip(const std::vector<ClipEvent>&) override {}
  void OnHeartbeat() override {}
  void OnCheckpoint(int64_t, const std::string&) override {}
  void OnEnd(RunStatus, const std::string&) override {}
  std::vector<double> times;
  double measured = 0;  // wall seconds of the timed steps
  double cpu = 0;       // process CPU seconds from the end of the first step to the last
  std::atomic<bool> stop{false};

 private:
  int min_steps_;
  double min_s_;
  double cpu_start_ = 0;
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
  const double flops = ForwardFlopsPerToken(c).training() * tokens;
  t.flops_per_s = sink.measured > 0 ? flops / sink.measured : 0;
  t.flops_per_cpu_s = sink.cpu > 0 ? flops / sink.cpu : 0;
  t.wall_s = sink.measured;
  t.cpu_s = sink.cpu;
  t.how = fmt::format(
      "measured: {} training steps, {:.1f} s CPU time ({:.1f} s wall) at {} thread(s) = {} per "
      "CPU second",
      n, sink.cpu, sink.measured, threads, Si(t.flops_per_cpu_s, "FLOP/s"));
  return t;
}

double Throughput::CpuRate() const {
  if (flops_per_cpu_s > 0) return flops_per_cpu_s;
  return threads > 0 ? flops_per_s / threads : flops_per_s;
}

double WallSeconds(double cpu_seconds, int parallel, int threads, int cores) {
  const int busy = std::min(std::max(1, parallel) * std::max(1, threads), std::max(1, cores));
  return cpu_seconds / busy;
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

namespace {

// Why this machine cannot run some of the sweep's runs ("" when it can run them all).
std::string DeviceProblem(const Sweep& sweep) {
  std::map<std::string, int> refused;
  std::string reason;
  for (const SweepRun* r : sweep.Unique()) {
    try {
      RequireDevice(r->config.train);
    } catch (const DeviceError& e) {
      refused[r->config.train.device]++;
      reason = e.what();
    }
  }
  if (refused.empty()) return "";
  int n = 0;
  for (const auto& [device, count] : refused) n += count;
  return fmt::format(
      "this machine cannot run {} of the {} unique runs ({}); the plan above is arithmetic for "
      "the machine that will: `moelab sweep run` refuses here before anything starts",
      n, sweep.Unique().size(), reason);
}

void PrintFitPlan(const Sweep& sweep, std::FILE* out) {
  const FitPlan plan = PlanFits(sweep);
  if (plan.families.empty()) return;
  fmt::print(out,
             "fit and promote per family (a family: the runs sharing every swept key but budget, "
             "seed and model size{}), by the checks `moelab fit` and `moelab promote` run, "
             "assuming loss falls with compute:\n",
             plan.axes.empty() ? "" : fmt::format("; here {}", fmt::join(plan.axes, ", ")));
  for (const auto& f : plan.families) {
    fmt::print(out, "  {}: {} trunk(s), {} frontier point(s); fit: {}; promote: {}\n", f.family,
               f.units, f.frontier_points, f.FitText(), f.PromoteText());
  }
  for (const std::string& n : plan.notes) fmt::print(out, "  note: {}\n", n);
  for (const std::string& w : plan.warnings) fmt::print(out, "warning: {}\n", w);
}

}  // namespace

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
  } else if (options.calibrate && !unique.empty() && !DeviceProblem(sweep).empty()) {
    tp.how =
        "not calibrated: this machine cannot run the sweep's device (warning below); "
        "--gpu-peak-tflops and --gpu-mfu give GPU-hours";
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
                        "tokens", "train FLOPs", "CPU time", "note");
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
    const double time = tp.CpuRate() > 0 ? flops / tp.CpuRate() : NAN;  // CPU seconds
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
  fmt::print(out, "total: {} unique runs, {} training FLOPs", unique.size(), Si(total_flops));
  if (tp.CpuRate() > 0) {
    const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    fmt::print(out,
               ", CPU time {} ({:.2f} CPU-hours) at {} thread(s) per run; about {} wall with "
               "--parallel {} on {} core(s){} (idle machine, threads kept busy: a lower bound)",
               Duration(total_time), total_time / 3600, threads,
               Duration(WallSeconds(todo_time, parallel, threads, cores)), parallel, cores,
               done.empty() ? "" : ", runs already done excluded");
  } else {
    fmt::print(out, ", CPU time -- at {} thread(s) per run", threads);
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
  PrintFitPlan(sweep, out);
  if (const std::string device = DeviceProblem(sweep); !device.empty())
    fmt::print(out, "warning: {}\n", device);
  if (tp.CpuRate() > 0) {
    fmt::print(out,
               "  (one rate, the largest run's, for all runs: smaller models run at a lower rate, "
               "so small runs take longer than shown; parallel runs share memory bandwidth; "
               "CPU time, not wall: other load on this machine does not stretch it)\n");
  }
}

}  // namespace moelab::sweeps
