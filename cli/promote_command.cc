// `moelab promote`: scale a configuration chosen from a sweep to a FLOPs budget or a target
// loss with the sweep's stored fits, print the plan, write the promoted config and launch
// scripts (local, mpirun, Slurm), record the promotion, and optionally launch the run.
// The work is in analysis/promote_db.cc (shared with moelab-gui's Promote panel).
#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "analysis/promote_db.h"
#include "cli/commands.h"
#include "cli/db_option.h"
#include "sweeps/plan.h"

namespace moelab::cli {

void AddPromoteCommand(CLI::App& app) {
  struct Args {
    analysis::PromoteRequest req;
    bool launch = false, plan_only = false, measure = false, json = false;
  };
  auto a = std::make_shared<Args>();
  analysis::PromoteRequest& r = a->req;
  CLI::App* cmd = app.add_subcommand(
      "promote",
      "Scale a sweep's configuration to a full run from its fitted laws: plan (shape, tokens, "
      "layout, memory, time, predicted loss band and curve), config, launch scripts, record");
  AddDbOption(cmd, &r.db_path, DbAccess::kWrite);
  cmd->add_option("--sweep", r.sweep, "Sweep whose stored fits to use")->required();
  auto* fam = cmd->add_option("--family", r.family, "KEY=VALUE: the family to promote");
  auto* run = cmd->add_option("--run", r.run_id, "Run id whose configuration to promote");
  fam->excludes(run);
  auto* bud = cmd->add_option("--budget-flops", r.target.budget_flops,
                              "Training FLOPs of the promoted run");
  auto* tl = cmd->add_option("--target-loss", r.target.target_loss,
                             "Smallest compute-optimal run predicted to reach this loss");
  bud->excludes(tl);
  cmd->add_option("--ranks", r.layout.ranks, "Processes (data parallel × expert parallel)")
      ->capture_default_str();
  cmd->add_option("--ep", r.layout.ep, "Expert-parallel group size")->capture_default_str();
  cmd->add_option("--device", r.layout.device, "cpu | cuda")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->capture_default_str();
  cmd->add_option("--threads", r.layout.threads, "CPU threads per rank")->capture_default_str();
  cmd->add_option("--gpu", r.options.gpu,
                  "Time from a named GPU's peak: a100 | h100 | h200 | l40s | b200");
  cmd->add_flag("--measure", a->measure,
                "Time from this machine's measured training rate (a few real steps)");
  cmd->add_option("--max-extrapolation", r.options.max_extrapolation,
                  "Largest budget as a multiple of the sweep's largest FLOPs")
      ->capture_default_str();
  cmd->add_option("--out", r.out_dir,
                  "Folder for the config and scripts (default <db>.promotions/<hash>)");
  cmd->add_option("--partition", r.slurm.partition, "launch_slurm.sbatch: Slurm partition");
  cmd->add_option("--time", r.slurm.time_limit,
                  "launch_slurm.sbatch: time limit per job (HH:MM:SS); the job checkpoints and "
                  "requeues itself before it");
  cmd->add_option("--mem", r.slurm.mem, "launch_slurm.sbatch: memory per node (e.g. 16G)");
  cmd->add_option("--account", r.slurm.account, "launch_slurm.sbatch: Slurm account");
  cmd->add_option("--gres", r.slurm.gres, "launch_slurm.sbatch: generic resources (gpu:1)");
  cmd->add_flag("--plan-only", a->plan_only, "Print the plan; write and record nothing");
  cmd->add_flag("--launch", a->launch,
                "Start the promoted run now (local, or mpirun for ranks > 1)");
  cmd->add_flag("--json", a->json, "Print the plan as JSON");
  cmd->callback([a]() {
    analysis::PromoteRequest req = a->req;
    if (a->measure) {
      req.measure = [](const RunConfig& c, std::string* how) {
        const sweeps::Throughput tp = sweeps::MeasureThroughput(c, c.train.threads, 3, 3.0);
        *how = tp.how;
        return tp.flops_per_s;
      };
    }
    const analysis::PreparedPromotion p = analysis::PreparePromotion(req);
    if (a->json) {
      fmt::print("{}\n", nlohmann::json(p.plan).dump(2));
    } else {
      fmt::print("{}", analysis::FormatPlan(p.plan));
    }
    if (a->plan_only) return;
    const analysis::RecordedPromotion rec =
        analysis::RecordPromotion(req, p, analysis::MoelabBinaryBeside(""));
    const auto say = [&](const std::string& s) { fmt::print(a->json ? stderr : stdout, "{}", s); };
    say(fmt::format("\nrecorded promotion {} (fit {}, sweep '{}'); run {} '{}' queued\nwrote",
                    rec.promotion_id, p.fit.id, req.sweep, rec.run_id, rec.run_name));
    for (const auto& f : rec.files) say(" " + f);
    say("\n");
    if (a->launch) {
      const int pid = analysis::LaunchPromotion(rec, req.layout.ranks);
      say(fmt::format("launched (pid {}), log {}/train.log\n", pid, rec.out_dir));
    }
  });
}

}  // namespace moelab::cli
