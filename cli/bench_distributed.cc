#include "cli/bench_distributed.h"

#include <fmt/format.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>
#include <vector>

#include "analysis/comm_model.h"
#include "core/config.h"
#include "core/flops.h"
#include "db/reader.h"
#include "sweeps/launch.h"

namespace moelab::cli {

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

struct Case {
  std::string name;
  json config;
};

// The four shapes of `moelab bench` (batch 8 × 256 tokens, vocab 512, AdamW, Markov data).
std::vector<Case> Cases() {
  auto base = [](int layers, int heads, int d, int ffn) {
    return json{{"model",
                 {{"vocab_size", 512},
                  {"layers", layers},
                  {"heads", heads},
                  {"d_model", d},
                  {"ffn_hidden", ffn},
                  {"seq_len", 256}}},
                {"data", {{"source", "markov"}}},
                {"optimizer", {{"name", "adamw"}}},
                {"schedule", {{"type", "constant"}, {"warmup_steps", 1}}},
                {"train", {{"batch_size", 8}}},
                {"eval", {{"every", 0}, {"batches", 1}}},
                {"checkpoint", {{"every", 0}}}};
  };
  std::vector<Case> cases = {{"dense-4L-d256", base(4, 4, 256, 1024)},
                             {"dense-6L-d384", base(6, 6, 384, 1536)}};
  for (int experts : {8, 32}) {
    json c = base(4, 4, 256, 1024);
    c["moe"] = {{"experts_total", experts},
                {"experts_active", 2},
                {"shared_experts", 1},
                {"expert_hidden", 256},
                {"balance", "aux_loss"}};
    cases.push_back({fmt::format("moe-4L-d256-e{}", experts), c});
  }
  return cases;
}

std::string SelfExe() {
  std::error_code ec;
  std::string p = fs::read_symlink("/proc/self/exe", ec).string();
  // A rebuild while the bench runs replaces the file: start the new one.
  const std::string deleted = " (deleted)";
  if (p.size() > deleted.size() &&
      p.compare(p.size() - deleted.size(), deleted.size(), deleted) == 0)
    p.resize(p.size() - deleted.size());
  return ec ? "moelab" : p;
}

// Runs argv with the thread counts set; output to log. Returns the exit code.
int RunLogged(const std::vector<std::string>& argv, int threads, const std::string& log) {
  std::fflush(stdout);  // or the child repeats what the parent has not written yet
  const pid_t pid = fork();
  if (pid < 0) return 127;
  if (pid == 0) {
    const std::string t = std::to_string(threads);
    setenv("OMP_NUM_THREADS", t.c_str(), 1);
    setenv("OPENBLAS_NUM_THREADS", t.c_str(), 1);
    for (const auto& [k, v] : sweeps::MpirunEnvironment(::geteuid() == 0))
      setenv(k.c_str(), v.c_str(), 1);
    FILE* f = std::freopen(log.c_str(), "w", stdout);
    (void)f;
    dup2(fileno(stdout), fileno(stderr));
    std::vector<std::string> copy = argv;
    std::vector<char*> a;
    for (std::string& s : copy) a.push_back(s.data());
    a.push_back(nullptr);
    execvp(a[0], a.data());
    _exit(127);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
}

struct Measured {
  bool ok = false;
  std::string error;
  double tokens_per_s = 0;                    // median over the timed steps
  std::optional<double> comm_bytes_per_step;  // the communicator's counter, when recorded
  std::optional<double> comm_share;           // of step time, when recorded
};

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

std::optional<double> VarNumber(const std::map<std::string, std::string>& vars,
                                const std::string& key) {
  auto it = vars.find(key);
  if (it == vars.end()) return std::nullopt;
  try {
    return std::stod(it->second);
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

Measured Train(const Case& c, const std::string& layout, int ranks, int threads, int ep,
               bool overlap, const DistributedBenchOptions& o, const fs::path& dir) {
  Measured m;
  json config = c.config;
  config["train"]["steps"] = o.warmup + o.steps;
  config["train"]["threads"] = threads;
  config["checkpoint"]["dir"] = (dir / "ckpt").string();
  if (ep > 1) config["dist"]["expert_parallel"] = ep;
  if (!overlap) config["dist"]["overlap"] = false;
  const std::string stem = c.name + "-" + layout;
  const std::string cfg = (dir / (stem + ".json")).string();
  const std::string db = (dir / (stem + ".db")).string();
  const std::string log = (dir / (stem + ".log")).string();
  std::ofstream(cfg) << config.dump(2);
  std::vector<std::string> args = {SelfExe(), "train", cfg, "--db", db, "--no-progress"};
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  args = sweeps::MpirunCommand(ranks, args, cores, ::geteuid() == 0);
  const int code = RunLogged(args, threads, log);
  if (code != 0) {
    std::ifstream in(log);
    // The trainer's own message, not mpirun's banner that follows it.
    std::string line, last, trainer;
    while (std::getline(in, line)) {
      if (!line.empty() && line.find("-----") == std::string::npos) last = line;
      if (line.rfind("moelab train:", 0) == 0) trainer = line;
    }
    if (!trainer.empty()) last = trainer;
    m.error = fmt::format("exit {}: {}", code, last);
    return m;
  }
  db::Reader reader(db);
  const auto runs = reader.ListRuns();
  if (runs.size() != 1) {
    m.error = fmt::format("{} run rows recorded (expected 1)", runs.size());
    return m;
  }
  const db::Series tps = reader.GetSeries(runs[0].id, "tokens_per_s", o.warmup + 1);
  m.tokens_per_s = Median(tps.values);
  // `moelab train` records rank 0's collectives inside the timed steps as run variables.
  const auto vars = reader.RunVars(runs[0].id);
  m.comm_bytes_per_step = VarNumber(vars, "dist.comm_bytes_per_step");
  m.comm_share = VarNumber(vars, "dist.comm_time_share");
  m.ok = true;
  return m;
}

std::string Fmt(const std::optional<double>& v, const char* spec) {
  return v ? fmt::format(fmt::runtime(spec), *v) : std::string("-");
}

}  // namespace

int RunDistributedBench(const DistributedBenchOptions& o) {
  if (o.model_only) {
    fmt::print("{}", analysis::K2ScalingTable());
    return 0;
  }
  const int ranks = std::max(2, o.threads);
  std::string why_not;
  if (!sweeps::BuildHasMpi()) why_not = "this build has no MPI";
  if (why_not.empty() && sweeps::FindOnPath("mpirun").empty()) why_not = "mpirun not on PATH";
  const fs::path dir = fs::temp_directory_path() / fmt::format("moelab-bench-dist-{}", getpid());
  fs::create_directories(dir);
  json out = json::array();
  if (!o.json) {
    fmt::print(
        "tokens/s: 1 rank x {} threads vs {} ranks x 1 thread (mpirun), {} timed steps after {}; "
        "bytes per rank and step: model payload (wire) vs the communicator's counter\n\n",
        o.threads, ranks, o.steps, o.warmup);
    fmt::print("{:<16} {:<8} {:>11} {:>11} {:>7} {:>20} {:>12} {:>7}\n", "config", "layout",
               "1r tok/s", "Nr tok/s", "ratio", "model bytes/step", "measured", "comm %");
  }
  for (const Case& c : Cases()) {
    if (!o.only.empty() && c.name.find(o.only) == std::string::npos) continue;
    const RunConfig rc = ConfigFromJson(c.config);
    const Measured one = Train(c, "1x" + std::to_string(o.threads), 1, o.threads, 1, true, o, dir);
    // Data parallel with the gradient reduction after the backward ("dp-seq") and overlapped
    // with it ("dp", dist.overlap: the default).
    struct Layout {
      std::string name;
      int ep;
      bool overlap;
    };
    std::vector<Layout> layouts = {{"dp-seq", 1, false}, {"dp", 1, true}};
    if (rc.moe.enabled() && sweeps::LayoutOf(rc, ranks).expert_parallel == 1) {
      // Expert parallel needs the config's dist section (the distributed core).
      if (nlohmann::json(ConfigToJson(rc)).contains("dist")) layouts.push_back({"ep", ranks, true});
    }
    for (const auto& [layout, ep, overlap] : layouts) {
      Measured many;
      if (why_not.empty()) {
        many = Train(c, fmt::format("{}x1-{}", ranks, layout), ranks, 1, ep, overlap, o, dir);
      } else {
        many.error = why_not;
      }
      const analysis::CommEstimate model =
          analysis::EstimateComm(analysis::CommShapeOf(rc), {ranks, ep, false});
      const std::optional<double> ratio =
          one.ok && many.ok && one.tokens_per_s > 0
              ? std::optional<double>(many.tokens_per_s / one.tokens_per_s)
              : std::nullopt;
      json row = {{"config", c.name},
                  {"layout", fmt::format("{} ranks, {}", ranks, layout)},
                  {"tokens_per_s_1rank", one.ok ? json(one.tokens_per_s) : json(nullptr)},
                  {"tokens_per_s_nranks", many.ok ? json(many.tokens_per_s) : json(nullptr)},
                  {"model_payload_bytes", model.payload()},
                  {"model_wire_bytes", model.wire()},
                  {"measured_bytes",
                   many.comm_bytes_per_step ? json(*many.comm_bytes_per_step) : json(nullptr)},
                  {"comm_share", many.comm_share ? json(*many.comm_share) : json(nullptr)},
                  {"error", one.error.empty() ? many.error : one.error}};
      out.push_back(row);
      if (!o.json) {
        fmt::print(
            "{:<16} {:<8} {:>11} {:>11} {:>7} {:>20} {:>12} {:>7}{}\n", c.name, layout,
            one.ok ? fmt::format("{:.0f}", one.tokens_per_s) : "-",
            many.ok ? fmt::format("{:.0f}", many.tokens_per_s) : "-", Fmt(ratio, "{:.2f}"),
            fmt::format("{:.2f} ({:.2f}) MB", model.payload() / 1e6, model.wire() / 1e6),
            Fmt(many.comm_bytes_per_step ? std::optional<double>(*many.comm_bytes_per_step / 1e6)
                                         : std::nullopt,
                "{:.2f} MB"),
            Fmt(many.comm_share ? std::optional<double>(100 * *many.comm_share) : std::nullopt,
                "{:.0f}%"),
            row["error"].get<std::string>().empty()
                ? ""
                : "  (" + row["error"].get<std::string>() + ")");
        std::fflush(stdout);
      }
    }
  }
  if (o.json) fmt::print("{}\n", out.dump(2));
  std::error_code ec;
  fs::remove_all(dir, ec);
  return 0;
}

}  // namespace moelab::cli
