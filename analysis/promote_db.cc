#include "analysis/promote_db.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "analysis/compute_optimal.h"
#include "analysis/family_design.h"
#include "analysis/observations.h"
#include "core/run_shape.h"
#include "db/promotions.h"
#include "db/reader.h"
#include "db/writer.h"

namespace moelab::analysis {

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

// The newest Chinchilla fit (compute-optimal law) for the key, else the newest power-law fit.
const db::FitRecord* ChooseFit(const std::vector<db::FitRecord>& fits, const std::string& key) {
  for (const auto& f : fits)
    if (f.form == "chinchilla" && (key.empty() || f.family_key == key)) return &f;
  for (const auto& f : fits)
    if (f.form == "power" && (key.empty() || f.family_key == key)) return &f;
  return nullptr;
}

}  // namespace

PreparedPromotion PreparePromotion(const PromoteRequest& a) {
  if (a.family.empty() && a.run_id < 0)
    throw PromotionRefused("choose a family (KEY=VALUE) or a run id");
  if (!(a.target.budget_flops > 0) && !(a.target.target_loss > 0))
    throw PromotionRefused("choose a target: a FLOPs budget or a target loss");
  const PromoteLayout& layout = a.layout;
  if (layout.ranks < 1 || layout.ep < 1 || layout.ranks % layout.ep != 0)
    throw PromotionRefused("the expert-parallel size must divide the rank count");
  const auto sweep = db::FindSweep(a.db_path, a.sweep);
  if (!sweep) throw PromotionRefused(fmt::format("no sweep '{}' in {}", a.sweep, a.db_path));
  const std::vector<db::FitRecord> fits = db::ListFits(a.db_path, sweep->id);
  if (fits.empty())
    throw PromotionRefused(fmt::format(
        "sweep '{}' has no stored fits: run `moelab fit --db {} --sweep {} --by KEY` (power law) "
        "or with `--form chinchilla` first",
        a.sweep, a.db_path, a.sweep));
  PreparedPromotion out;
  out.sweep_id = sweep->id;
  std::string key, value;
  if (!a.family.empty()) {
    const auto eq = a.family.find('=');
    if (eq == std::string::npos || eq == 0)
      throw PromotionRefused("the family is KEY=VALUE, e.g. sparsity=8");
    key = a.family.substr(0, eq);
    value = a.family.substr(eq + 1);
  }
  const db::FitRecord* fit = ChooseFit(fits, key);
  if (!fit) {
    std::string have;
    for (const auto& f : fits) have += fmt::format(" {} (by {})", f.form, f.family_key);
    throw PromotionRefused(fmt::format("sweep '{}' has no power-law or Chinchilla fit{}; stored:{}",
                                       a.sweep, key.empty() ? "" : " by '" + key + "'", have));
  }
  out.fit = *fit;
  key = fit->family_key;
  const std::vector<Observation> obs = ObservationsFromJson(json::parse(fit->inputs_json));
  FitOptions fo = FitOptionsFromJson(json::parse(fit->options_json));
  fo.threads = layout.threads;

  db::Reader reader(a.db_path);
  std::string source_run;
  if (a.run_id >= 0) {
    if (!reader.GetRun(a.run_id))
      throw PromotionRefused(fmt::format("unknown run {} in {}", a.run_id, a.db_path));
    source_run = std::to_string(a.run_id);
    const auto f = FamilyOf(reader.RunVars(a.run_id), reader.RunConfigJson(a.run_id), key);
    if (!f)
      throw PromotionRefused(
          fmt::format("run {} has no value for the fit's family key '{}'", a.run_id, key));
    value = *f;
  }
  RequireUnmixedStoredFamily(a.db_path, obs, key, value, json::parse(fit->options_json));
  double src_flops = -1, src_params = 0, src_tokens = 0;
  std::set<std::string> families;
  for (const auto& o : obs) {
    families.insert(o.family);
    if (o.family != value) continue;
    if (a.run_id >= 0 && o.run != source_run) continue;
    if (o.flops > src_flops) {
      src_flops = o.flops, src_params = o.params, src_tokens = o.tokens;
      if (a.run_id < 0) source_run = o.run;
    }
  }
  if (!families.count(value)) {
    std::string list;
    for (const auto& f : families) list += (list.empty() ? "" : ", ") + f;
    throw PromotionRefused(
        fmt::format("unknown family {}={} in fit {} (families: {})", key, value, fit->id, list));
  }
  if (src_flops < 0)
    throw PromotionRefused(
        fmt::format("run {} is not among fit {}'s observations", source_run, fit->id));
  const RunConfig source =
      ConfigFromJson(json::parse(reader.RunConfigJson(std::stoll(source_run))));

  PromoteOptions po = a.options;
  po.level = fo.level;
  if (layout.device == "cuda" && po.gpu.empty()) po.gpu = "h100";
  PromotionPlan plan;
  if (fit->form == "chinchilla") {
    plan = PlanFromChinchilla(obs, fo, source, source_run, a.target, layout, po);
  } else {
    fo.skip_failed_families = true;
    const FamilyFits ff = FitFamilies(obs, fo);
    plan = PlanFromPowerLaw(ff.Get(value), source, source_run, src_params, src_tokens, a.target,
                            layout, po);
  }
  plan.family_key = key;
  plan.family = value;
  if (a.measure && po.gpu.empty()) {
    // The promoted config itself when a step is cheap enough to time, else the source's rate.
    const bool own = plan.flops_per_token * plan.batch * plan.config.model.seq_len < 5e11;
    std::string how;
    const double rate = a.measure(own ? plan.config : source, &how);
    double load[1] = {0};
    if (getloadavg(load, 1) < 1) load[0] = NAN;
    if (rate > 0) {
      plan.time_s = plan.flops / (rate * layout.ranks);
      plan.time_basis = fmt::format(
          "{:.3g} FLOP/s per rank on the {} config ({}); load average {:.1f} on {} cores{}. The "
          "time is the FLOPs over a rate timed for a few seconds now: on a shared machine two "
          "measurements differ as much as its load does (compare their load averages)",
          rate, own ? "promoted" : "source", how, load[0], std::thread::hardware_concurrency(),
          layout.ranks > 1 ? fmt::format(", × {} ranks (ideal scaling)", layout.ranks) : "");
    }
  }
  out.plan = std::move(plan);
  out.key = key;
  out.value = value;
  out.source_run = source_run;
  return out;
}

RecordedPromotion RecordPromotion(const PromoteRequest& a, const PreparedPromotion& p,
                                  const std::string& bin) {
  const PromotionPlan& plan = p.plan;
  const json plan_json = plan;
  const std::string hash = ConfigHash(plan.config);
  RecordedPromotion r;
  const fs::path out =
      fs::absolute(a.out_dir.empty() ? fs::path(a.db_path + ".promotions") / hash.substr(0, 16)
                                     : fs::path(a.out_dir));
  fs::create_directories(out);
  r.out_dir = out.string();
  WriteFile(out / "config.json", ConfigToJson(plan.config).dump(2) + "\n");
  WriteFile(out / "plan.json", plan_json.dump(2) + "\n");
  WriteFile(out / "plan.txt", FormatPlan(plan));

  // The run row exists before any launcher starts: every launcher records into it (--run-id),
  // so the promotion is linked to its run whichever way it is started.
  db::RunInfo info;
  info.config_json = ConfigToJson(plan.config).dump();
  info.config_hash = hash;
  info.shape = RunShapeOf(plan.config);
  db::PromotionRecord rec;
  rec.sweep_id = p.sweep_id;
  rec.fit_id = p.fit.id;
  rec.law = plan.law;
  rec.family_key = p.key;
  rec.family = p.value;
  rec.source_run_id = std::stoll(p.source_run);
  rec.target_json = (a.target.budget_flops > 0 ? json{{"budget_flops", a.target.budget_flops}}
                                               : json{{"target_loss", a.target.target_loss}})
                        .dump();
  rec.plan_json = plan_json.dump();
  rec.config_json = info.config_json;
  rec.out_dir = r.out_dir;
  rec.predicted_loss = plan.loss.estimate;
  rec.band_lo = plan.band.lo;
  rec.band_hi = plan.band.hi;
  r.promotion_id = db::SavePromotion(a.db_path, rec);
  info.name = fmt::format("promoted-{}-{}{}", r.promotion_id, p.key, p.value);
  r.run_name = info.name;
  r.run_id = db::RunWriter::CreateRun(a.db_path, info, RunStatus::kQueued);
  db::LinkPromotionRun(a.db_path, r.promotion_id, r.run_id);
  db::RunWriter::SetRunVar(a.db_path, r.run_id, "promotion", std::to_string(r.promotion_id));
  db::RunWriter::SetRunVar(a.db_path, r.run_id, p.key, p.value);

  const int ranks = a.layout.ranks, ep = a.layout.ep, threads = a.layout.threads;
  // Paths relative to the folder promote runs in (ROOT): the checkout moves, the scripts work.
  const fs::path root = fs::current_path();
  const auto rel = [&](const fs::path& p) {
    const fs::path r = fs::absolute(p).lexically_normal().lexically_relative(root);
    return r.empty() || *r.begin() == ".." ? fs::absolute(p).lexically_normal().string()
                                           : r.string();
  };
  const std::string bin_path =
      bin.find('/') == std::string::npos ? bin : rel(fs::path(bin));  // "moelab": from PATH
  const std::string root_from_out = root.lexically_relative(out).string();
  const std::string prologue = fmt::format(
      "# Train-or-continue: running this again continues run {} from its newest checkpoint (a\n"
      "# finished run is left alone). Paths are relative to the folder `moelab promote` ran in;\n"
      "# MOELAB, MOELAB_DB and MOELAB_ROOT override the binary, the database and that folder.\n"
      "set -euo pipefail\n",
      r.run_id);
  const std::string vars =
      fmt::format("MOELAB=${{MOELAB:-{}}}\nDB=${{MOELAB_DB:-{}}}\n", bin_path, rel(a.db_path));
  const std::string train = fmt::format(
      "\"$MOELAB\" train {}/config.json --db \"$DB\" --run-id {} --resume --no-progress", rel(out),
      r.run_id);
  const std::string cd_local =
      fmt::format("cd \"${{MOELAB_ROOT:-$(dirname \"${{BASH_SOURCE[0]}}\")/{}}}\"\n",
                  root_from_out.empty() ? "." : root_from_out);
  WriteFile(out / "launch_local.sh",
            fmt::format("#!/usr/bin/env bash\n# Promotion {}: one process, {} threads.\n{}{}{}"
                        "export OMP_NUM_THREADS={}\nexec {}\n",
                        r.promotion_id, threads, prologue, cd_local, vars, threads, train),
            true);
  WriteFile(out / "launch_mpirun.sh",
            fmt::format("#!/usr/bin/env bash\n# Promotion {}: {} ranks ({} data parallel × {} "
                        "expert parallel) under mpirun.\n{}{}{}"
                        "exec mpirun -np {} --bind-to none -x OMP_NUM_THREADS={} {}\n",
                        r.promotion_id, ranks, ranks / ep, ep, prologue, cd_local, vars, ranks,
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
                r.promotion_id, ranks, threads,
                a.layout.device == "cuda" ? "#SBATCH --gpus-per-task=1\n" : "", rel(out),
                sweeps::SlurmDirectives(a.slurm), r.promotion_id, plan.time_s, plan.time_basis,
                rel(out), prologue, vars, threads, sweeps::SlurmTrainStep("srun " + train)),
            true);
  for (const char* f : {"config.json", "plan.json", "plan.txt", "launch_local.sh",
                        "launch_mpirun.sh", "launch_slurm.sbatch"})
    r.files.push_back((out / f).string());
  return r;
}

int LaunchPromotion(const RecordedPromotion& r, int ranks) {
  const std::string script =
      (fs::path(r.out_dir) / (ranks > 1 ? "launch_mpirun.sh" : "launch_local.sh")).string();
  const std::string log = (fs::path(r.out_dir) / "train.log").string();
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

}  // namespace moelab::analysis
