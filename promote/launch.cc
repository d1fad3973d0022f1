// The files of one promotion's folder (config, plan, the three launchers) and starting one.
#include "promote/launch.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>

namespace moelab::promote {

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

void WriteFile(const fs::path& p, const std::string& text, bool executable = false) {
  std::ofstream f(p);
  if (!f) throw std::runtime_error("cannot write " + p.string());
  f << text;
  f.close();
  if (executable)
    fs::permissions(p, fs::perms::owner_exec | fs::perms::group_exec | fs::perms::others_exec,
                    fs::perm_options::add);
}

}  // namespace

std::vector<std::string> WritePromotionFiles(const std::string& out_dir, const PromotionPlan& plan,
                                             const LaunchFiles& f) {
  const fs::path out = out_dir;
  WriteFile(out / "config.json", ConfigToJson(plan.config).dump(2) + "\n");
  WriteFile(out / "plan.json", json(plan).dump(2) + "\n");
  WriteFile(out / "plan.txt", FormatPlan(plan));

  const int ranks = f.layout.ranks, ep = f.layout.ep, threads = f.layout.threads;
  // Paths relative to the folder promote runs in (ROOT): the checkout moves, the scripts work.
  const fs::path root = fs::current_path();
  const auto rel = [&](const fs::path& p) {
    const fs::path r = fs::absolute(p).lexically_normal().lexically_relative(root);
    return r.empty() || *r.begin() == ".." ? fs::absolute(p).lexically_normal().string()
                                           : r.string();
  };
  const std::string bin_path = f.moelab_bin.find('/') == std::string::npos
                                   ? f.moelab_bin
                                   : rel(fs::path(f.moelab_bin));  // "moelab": from PATH
  const std::string root_from_out = root.lexically_relative(out).string();
  const std::string prologue = fmt::format(
      "# Train-or-continue: running this again continues run {} from its newest checkpoint (a\n"
      "# finished run is left alone). Paths are relative to the folder `moelab promote` ran in;\n"
      "# MOELAB, MOELAB_DB and MOELAB_ROOT override the binary, the database and that folder.\n"
      "set -euo pipefail\n",
      f.run_id);
  const std::string vars =
      fmt::format("MOELAB=${{MOELAB:-{}}}\nDB=${{MOELAB_DB:-{}}}\n", bin_path, rel(f.db_path));
  const std::string train = fmt::format(
      "\"$MOELAB\" train {}/config.json --db \"$DB\" --run-id {} --resume --no-progress", rel(out),
      f.run_id);
  const std::string cd_local =
      fmt::format("cd \"${{MOELAB_ROOT:-$(dirname \"${{BASH_SOURCE[0]}}\")/{}}}\"\n",
                  root_from_out.empty() ? "." : root_from_out);
  WriteFile(out / "launch_local.sh",
            fmt::format("#!/usr/bin/env bash\n# Promotion {}: one process, {} threads.\n{}{}{}"
                        "export OMP_NUM_THREADS={}\nexec {}\n",
                        f.promotion_id, threads, prologue, cd_local, vars, threads, train),
            true);
  WriteFile(out / "launch_mpirun.sh",
            fmt::format("#!/usr/bin/env bash\n# Promotion {}: {} ranks ({} data parallel × {} "
                        "expert parallel) under mpirun.\n{}{}{}"
                        "exec mpirun -np {} --bind-to none -x OMP_NUM_THREADS={} {}\n",
                        f.promotion_id, ranks, ranks / ep, ep, prologue, cd_local, vars, ranks,
                        threads, train),
            true);
  WriteFile(out / "launch_slurm.sbatch",
            fmt::format(
                "#!/usr/bin/env bash\n#SBATCH --job-name=moelab-promote-{}\n"
                "#SBATCH --ntasks={}\n#SBATCH --cpus-per-task={}\n{}"
                "#SBATCH --output={}/slurm-%j.out\n{}"
                "# Promotion {}: estimated {:.0f} s ({}).\n"
                "# Submit from the folder `moelab promote` ran in: sbatch {}/launch_slurm.sbatch\n"
                "{}cd \"${{MOELAB_ROOT:-${{SLURM_SUBMIT_DIR:-.}}}}\"\n{}"
                "export OMP_NUM_THREADS={}\n{}",
                f.promotion_id, ranks, threads,
                f.layout.device == "cuda" ? "#SBATCH --gpus-per-task=1\n" : "", rel(out),
                sweeps::SlurmDirectives(f.slurm), f.promotion_id, plan.time_s, plan.time_basis,
                rel(out), prologue, vars, threads, sweeps::SlurmTrainStep("srun " + train)),
            true);
  std::vector<std::string> written;
  for (const char* name : {"config.json", "plan.json", "plan.txt", "launch_local.sh",
                           "launch_mpirun.sh", "launch_slurm.sbatch"})
    written.push_back((out / name).string());
  return written;
}

int LaunchPromotion(const std::string& out_dir, int ranks) {
  const std::string script =
      (fs::path(out_dir) / (ranks > 1 ? "launch_mpirun.sh" : "launch_local.sh")).string();
  const std::string log = (fs::path(out_dir) / "train.log").string();
  const pid_t child = fork();
  if (child < 0) throw std::runtime_error("fork failed");
  if (child == 0) {
    setsid();
    const int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
      dup2(fd, 1);
      dup2(fd, 2);
      close(fd);
    }
    execl("/bin/bash", "bash", script.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  return child;
}

std::string MoelabBinaryBeside(const std::string& self) {
  std::error_code ec;
  fs::path p = self.empty() ? fs::read_symlink("/proc/self/exe", ec) : fs::path(self);
  if (!ec) {
    const fs::path candidate = p.parent_path() / "moelab";
    if (fs::exists(candidate)) return candidate.string();
  }
  return "moelab";
}

}  // namespace moelab::promote
