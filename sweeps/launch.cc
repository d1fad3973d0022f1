#include "sweeps/launch.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <thread>

#include "core/comm/communicator.h"

namespace moelab::sweeps {

namespace fs = std::filesystem;

namespace {

int Cores() { return static_cast<int>(std::max(1u, std::thread::hardware_concurrency())); }

// The config path a launch shorthand stands for.
std::string ConfigPathOf(const std::string& key) {
  if (key == "expert_parallel") return "dist.expert_parallel";
  if (key == "zero1") return "dist.zero1";
  return key;
}

bool HasKey(const ojson& obj, const std::string& key) {
  return obj.is_object() && obj.contains(key);
}

std::string ExpertParallelError(const RunConfig& config, const Layout& l,
                                const LayoutOrigin& origin) {
  const int ranks = l.ranks, ep = l.expert_parallel;
  if (!config.moe.enabled()) {
    return fmt::format(
        "{}: expert parallelism ({} ranks) needs an MoE model, but this config is dense "
        "(moe.experts_total = {})",
        origin.expert_parallel, ep, config.moe.experts_total);
  }
  if (ep > config.moe.experts_total) {
    return fmt::format(
        "{}: {} expert-parallel ranks but only {} experts (moe.experts_total): every "
        "expert-parallel rank must own at least one expert",
        origin.expert_parallel, ep, config.moe.experts_total);
  }
  if (config.moe.experts_total % ep != 0) {
    return fmt::format(
        "{}: {} experts (moe.experts_total) do not split evenly over {} expert-parallel ranks",
        origin.expert_parallel, config.moe.experts_total, ep);
  }
  if (ranks % ep != 0) {
    return fmt::format(
        "{}: world size {} is not divisible by the expert-parallel size {} ({}); use a multiple "
        "of {}",
        origin.ranks, ranks, ep, origin.expert_parallel, ep);
  }
  return "";
}

}  // namespace

int LocalRankCap() { return std::max(16, 8 * Cores()); }

Layout LayoutOf(const RunConfig& config, int ranks) {
  Layout l;
  l.ranks = ranks;
  l.expert_parallel = config.dist.expert_parallel;
  l.zero1 = config.dist.zero1;
  return l;
}

std::string LayoutError(const RunConfig& config, const Layout& l, const LayoutOrigin& origin) {
  const int ranks = l.ranks;
  if (ranks < 1) return fmt::format("{}: {} ranks; a run needs at least 1", origin.ranks, ranks);
  if (ranks > kMaxRanks) {
    return fmt::format("{}: {} ranks per run is more than the cap of {} (a typo?)", origin.ranks,
                       ranks, kMaxRanks);
  }
  const int ep = l.expert_parallel;
  if (ep < 1) {
    return fmt::format("{}: expert-parallel size {}; expected at least 1", origin.expert_parallel,
                       ep);
  }
  if (ep > 1) {
    if (const std::string e = ExpertParallelError(config, l, origin); !e.empty()) return e;
  }
  // Every rank takes an equal slice of the global batch (expert-parallel ranks too: they are
  // data-parallel for everything but the experts).
  if (config.train.batch_size % ranks != 0) {
    return fmt::format(
        "{}: the global batch of {} sequences (train.batch_size) does not split evenly over {} "
        "ranks",
        origin.ranks, config.train.batch_size, ranks);
  }
  return "";
}

std::string KeyOrigin(const ojson& spec, const std::string& key, int runs_index) {
  // The keys a spec may use for this field: the shorthand and the config path.
  const std::string path = ConfigPathOf(key);
  std::vector<std::string> names = {key};
  if (path != key) names.push_back(path);
  if (key == "dist.expert_parallel") names.push_back("expert_parallel");
  if (key == "dist.zero1") names.push_back("zero1");
  if (runs_index >= 0 && HasKey(spec, "runs") && spec["runs"].is_array() &&
      runs_index < static_cast<int>(spec["runs"].size())) {
    for (const std::string& n : names)
      if (HasKey(spec["runs"][runs_index], n)) return fmt::format("runs[{}].{}", runs_index, n);
  }
  if (HasKey(spec, "zip")) {
    ojson groups = spec["zip"];
    if (groups.is_object()) groups = ojson::array({groups});
    for (size_t g = 0; groups.is_array() && g < groups.size(); ++g)
      for (const std::string& n : names)
        if (HasKey(groups[g], n)) return fmt::format("zip[{}].{}", g, n);
  }
  for (const std::string& n : names)
    if (HasKey(spec, "grid") && HasKey(spec["grid"], n)) return "grid." + n;
  if (HasKey(spec, "random") && HasKey(spec["random"], "params")) {
    for (const std::string& n : names)
      if (HasKey(spec["random"]["params"], n)) return "random.params." + n;
  }
  if (HasKey(spec, "derived")) {
    const ojson& d = spec["derived"];
    for (size_t i = 0; d.is_array() && i < d.size(); ++i) {
      const std::string s = d[i].is_string()                    ? d[i].get<std::string>()
                            : d[i].is_object() && !d[i].empty() ? d[i].begin().key()
                                                                : "";
      for (const std::string& n : names) {
        const size_t at = s.find(n);
        if (at != std::string::npos && s.find('=') != std::string::npos && at < s.find('=')) {
          return fmt::format("derived[{}]", i);
        }
      }
    }
    for (const std::string& n : names)
      if (HasKey(d, n)) return "derived." + n;
  }
  for (const std::string& n : names)
    if (HasKey(spec, "set") && HasKey(spec["set"], n)) return "set." + n;
  for (const std::string& n : names)
    if (n.find('.') == std::string::npos && HasKey(spec, n)) return n;
  if (HasKey(spec, "base") && path.find('.') != std::string::npos) {
    const size_t dot = path.find('.');
    const std::string section = path.substr(0, dot), field = path.substr(dot + 1);
    if (HasKey(spec["base"], section) && HasKey(spec["base"][section], field)) {
      return "base." + path;
    }
  }
  return path;
}

void OverrideRanks(Sweep* sweep, int ranks) {
  std::vector<std::string> errors;
  for (SweepRun& run : sweep->runs) {
    run.ranks = ranks;
    LayoutOrigin origin;
    origin.ranks = "--ranks";
    origin.expert_parallel = KeyOrigin(sweep->spec, "dist.expert_parallel", run.runs_index);
    const std::string e = LayoutError(run.config, ranks, origin);
    if (!e.empty()) errors.push_back(fmt::format("run #{} ({}): {}", run.index, run.name, e));
  }
  sweep->ranks = ranks;
  if (!errors.empty()) {
    std::string msg = fmt::format(
        "sweep '{}': --ranks {} does not fit {} of {} runs; nothing was "
        "started:",
        sweep->name, ranks, errors.size(), sweep->runs.size());
    for (size_t i = 0; i < errors.size() && i < 12; ++i) msg += "\n  " + errors[i];
    if (errors.size() > 12) msg += fmt::format("\n  ... and {} more", errors.size() - 12);
    throw SpecError(msg);
  }
}

bool BuildHasMpi() {
#ifdef MOELAB_HAVE_MPI
  return true;
#else
  return false;
#endif
}

std::string LaunchEnvironmentError() {
  const int world = LauncherWorldSize();
  if (world <= 1 || BuildHasMpi()) return "";
  return fmt::format(
      "this moelab was built without MPI (CMake did not find it, or MOELAB_WITH_MPI=OFF), but "
      "it was started as one of {} ranks (by mpirun or srun): every rank would train its own "
      "copy of the run. Install libopenmpi-dev and rebuild, or start one process",
      world);
}

std::string FindOnPath(const std::string& name) {
  if (name.find('/') != std::string::npos) return ::access(name.c_str(), X_OK) == 0 ? name : "";
  const char* path = std::getenv("PATH");
  std::string p = path ? path : "/usr/bin:/bin";
  size_t start = 0;
  while (start <= p.size()) {
    const size_t colon = p.find(':', start);
    const std::string dir = p.substr(start, colon == std::string::npos ? colon : colon - start);
    const fs::path candidate = fs::path(dir.empty() ? "." : dir) / name;
    if (::access(candidate.c_str(), X_OK) == 0 && !fs::is_directory(candidate)) {
      return candidate.string();
    }
    if (colon == std::string::npos) break;
    start = colon + 1;
  }
  return "";
}

void CheckLocalLaunch(const Sweep& sweep) {
  int most = 1;
  const SweepRun* widest = nullptr;
  for (const SweepRun* r : sweep.Unique()) {
    if (r->ranks > most) {
      most = r->ranks;
      widest = r;
    }
  }
  if (!widest) return;
  if (!BuildHasMpi()) {
    throw SpecError(fmt::format(
        "run #{} ({}) asks for {} ranks, but this moelab was built without MPI; install "
        "libopenmpi-dev openmpi-bin and rebuild (docs/distributed.md)",
        widest->index, widest->name, most));
  }
  if (FindOnPath("mpirun").empty()) {
    throw SpecError(fmt::format(
        "run #{} ({}) asks for {} ranks, but mpirun is not on PATH (package openmpi-bin)",
        widest->index, widest->name, most));
  }
  if (most > LocalRankCap()) {
    throw SpecError(
        fmt::format("run #{} ({}) asks for {} ranks; this machine starts at most {} ranks per run "
                    "(8 per core). Train it on a cluster: moelab sweep slurm (docs/distributed.md)",
                    widest->index, widest->name, most, LocalRankCap()));
  }
}

std::vector<std::string> MpirunCommand(int ranks, const std::vector<std::string>& train_args,
                                       int cores, bool as_root) {
  if (ranks <= 1) return train_args;
  std::vector<std::string> a = {"mpirun", "-np", std::to_string(ranks), "--bind-to", "none"};
  if (ranks > cores) a.push_back("--oversubscribe");
  // Forwarded to ranks on other hosts too (a hostfile); local ranks inherit them anyway.
  a.insert(a.end(), {"-x", "OMP_NUM_THREADS", "-x", "OPENBLAS_NUM_THREADS"});
  if (as_root) a.push_back("--allow-run-as-root");
  a.insert(a.end(), train_args.begin(), train_args.end());
  return a;
}

std::vector<std::pair<std::string, std::string>> MpirunEnvironment(bool as_root) {
  if (!as_root) return {};
  return {{"OMPI_ALLOW_RUN_AS_ROOT", "1"}, {"OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1"}};
}

}  // namespace moelab::sweeps
