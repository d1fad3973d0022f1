// `moelab promote`: scale a configuration chosen from a sweep to a FLOPs budget or a target
// loss with the sweep's stored fits, print the plan, write the promoted config and launch
// scripts (local, mpirun, Slurm), record the promotion, and optionally launch the run.
// The work is in promote/ (shared with moelab-gui's Promote panel).
#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/db_option.h"
#include "promote/db.h"
#include "sweeps/plan.h"

namespace moelab::cli {

void AddPromoteCommand(CLI::App& app) {
  struct Args {
    promote::PromoteRequest req;
    bool launch = false, plan_only = false, measure = false, json = false, again = false;
  };
  auto a = std::make_shared<Args>();
  promote::PromoteRequest& r = a->req;
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
                  "Folder for the config and scripts, empty or new (default "
                  "<db>.promotions/<promotion id>)");
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
  cmd->add_flag("--again", a->again,
                "Record a new run although this plan's config already has a promoted run: "
                "another seed (without it, promote reports that run and starts nothing)");
  cmd->callback([a]() {
    promote::PromoteRequest req = a->req;
    if (a->measure) {
      req.measure = [](const RunConfig& c, std::string* how) {
        const sweeps::Throughput tp = sweeps::MeasureThroughput(c, c.train.threads, 3, 3.0);
        *how = tp.how;
        return tp.flops_per_s;
      };
    }
    if (!req.out_dir.empty() && !a->plan_only) {
      try {
        promote::CheckOutFolder(req.db_path, req.out_dir);
      } catch (const promote::PromotionRefused& e) {
        fmt::print(stderr, "moelab promote: error: {}\n", e.what());
        throw CLI::RuntimeError(2);
      }
    }
    promote::PreparedPromotion p = promote::PreparePromotion(req);
    // --again changes the seed before the plan is printed, so the printed config is the one run.
    const std::string again_note =
        a->again ? promote::ReseedForAnotherRun(req.db_path, &p.plan) : std::string();
    if (a->json) {
      fmt::print("{}\n", nlohmann::json(p.plan).dump(2));
    } else {
      fmt::print("{}", promote::FormatPlan(p.plan));
    }
    if (a->plan_only) return;
    const auto say = [&](const std::string& s) { fmt::print(a->json ? stderr : stdout, "{}", s); };
    say(again_note.empty() ? "" : "\n" + again_note);
    // One plan, one run: the same promotion again reports its run (and how to continue it).
    if (const auto existing = promote::FindPromotedRun(req.db_path, p.plan.config)) {
      say("\n" + promote::DescribePromotedRun(*existing, req.db_path));
      return;
    }
    const promote::RecordedPromotion rec =
        promote::RecordPromotion(req, p, promote::MoelabBinaryBeside(""));
    say(fmt::format("\nrecorded promotion {} (fit {}, sweep '{}'); run {} '{}' queued\nwrote",
                    rec.promotion_id, p.fit.id, req.sweep, rec.run_id, rec.run_name));
    for (const auto& f : rec.files) say(" " + f);
    say("\n");
    if (a->launch) {
      const int pid = promote::LaunchPromotion(rec.out_dir, req.layout.ranks);
      say(fmt::format("launched (pid {}), log {}/train.log\n", pid, rec.out_dir));
    }
  });
}

}  // namespace moelab::cli
