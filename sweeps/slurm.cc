#include "sweeps/slurm.h"

#include <fmt/format.h>

#include <filesystem>
#include <fstream>

namespace moelab::sweeps {

namespace fs = std::filesystem;

namespace {

// Single-quoted for bash.
std::string Quote(const std::string& s) {
  std::string out = "'";
  for (char ch : s) out += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
  return out + "'";
}

}  // namespace

std::string WriteSlurmScript(const Sweep& sweep, const SlurmOptions& o) {
  if (o.db_path.empty()) throw SpecError("slurm: a database path (--db) is required");
  const fs::path dir = fs::absolute(o.out_dir.empty() ? "." : o.out_dir);
  fs::create_directories(dir / "configs");
  fs::create_directories(dir / "logs");
  const auto runs = sweep.Unique();
  if (runs.empty()) throw SpecError("slurm: the sweep has no runs");
  std::string configs, names;
  for (const SweepRun* r : runs) {
    nlohmann::json c = ConfigToJson(r->config);
    c["train"]["threads"] = o.threads_per_run;
    const fs::path path = dir / "configs" / (r->hash.substr(0, 16) + ".json");
    std::ofstream(path) << c.dump(2) << "\n";
    configs += "  " + Quote(path.string()) + "\n";
    names += "  " + Quote(r->name) + "\n";
  }
  std::string safe = sweep.name;
  for (char& ch : safe)
    if (!std::isalnum(static_cast<unsigned char>(ch)) && ch != '-' && ch != '_') ch = '_';
  const fs::path script = dir / (safe + ".sbatch");
  std::string s = "#!/bin/bash\n";
  s += fmt::format("# moelab sweep '{}': {} runs, one Slurm array task each.\n", sweep.name,
                   runs.size());
  s += "# Submit: sbatch " + script.filename().string() + "\n";
  s += "# Merge back: moelab db merge <cluster db> --db <your db>   (see docs/sweeps.md)\n";
  s += fmt::format("#SBATCH --job-name={}\n", safe);
  s += fmt::format("#SBATCH --array=0-{}{}\n", runs.size() - 1,
                   o.max_parallel > 0 ? fmt::format("%{}", o.max_parallel) : "");
  s += "#SBATCH --ntasks=1\n";
  s += fmt::format("#SBATCH --cpus-per-task={}\n", o.threads_per_run);
  s += fmt::format("#SBATCH --output={}/logs/%A_%a.log\n", dir.string());
  if (!o.partition.empty()) s += fmt::format("#SBATCH --partition={}\n", o.partition);
  if (!o.time_limit.empty()) s += fmt::format("#SBATCH --time={}\n", o.time_limit);
  // A requeued or preempted task resumes from its checkpoint instead of starting over.
  s += "#SBATCH --requeue\n";
  s += "#SBATCH --signal=B:TERM@120\n";
  if (!o.extra.empty()) s += o.extra + (o.extra.back() == '\n' ? "" : "\n");
  s += "set -euo pipefail\n";
  s += fmt::format("MOELAB=${{MOELAB:-{}}}\n", Quote(o.moelab_bin));
  s += fmt::format("DB_TEMPLATE=${{MOELAB_DB:-{}}}\n", Quote(o.db_path));
  s += "TASK=${SLURM_ARRAY_TASK_ID:?run me with sbatch (or set SLURM_ARRAY_TASK_ID)}\n";
  s += "DB=${DB_TEMPLATE//\\{task\\}/$TASK}\n";
  s += "CONFIGS=(\n" + configs + ")\n";
  s += "NAMES=(\n" + names + ")\n";
  s += "export OMP_NUM_THREADS=${SLURM_CPUS_PER_TASK:-" + std::to_string(o.threads_per_run) +
       "}\nexport OPENBLAS_NUM_THREADS=$OMP_NUM_THREADS\n";
  // exec: Slurm's TERM reaches the trainer itself, which checkpoints and exits 4 (stopped).
  s += "exec \"$MOELAB\" train \"${CONFIGS[$TASK]}\" --db \"$DB\" --name \"${NAMES[$TASK]}\" "
       "--resume --no-progress\n";
  std::ofstream(script) << s;
  fs::permissions(script, fs::perms::owner_exec | fs::perms::group_exec | fs::perms::others_exec,
                  fs::perm_options::add);
  return script.string();
}

}  // namespace moelab::sweeps
