// `moelab sweep plan|run|resume|status|slurm`: families of runs from a JSON spec
// (docs/sweeps.md).
#include <fmt/format.h>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <thread>

#include "cli/commands.h"
#include "cli/db_option.h"
#include "core/train/trainer.h"
#include "sweeps/adaptive_chooser.h"
#include "sweeps/adaptive_estimand.h"
#include "sweeps/adaptive_runner.h"
#include "sweeps/launch.h"
#include "sweeps/plan.h"
#include "sweeps/runner.h"
#include "sweeps/slurm.h"
#include "sweeps/spec.h"
#include "sweeps/store.h"

namespace moelab::cli {

namespace {

std::atomic<bool> g_sweep_stop{false};

void OnSweepSignal(int) { g_sweep_stop.store(true); }

// Spec errors are the user's to fix: one clear message, exit code 2 (like a config error).
template <typename F>
void Guard(const char* what, F&& f) {
  try {
    f();
  } catch (const sweeps::SpecError& e) {
    fmt::print(stderr, "moelab sweep {}: error: {}\n", what, e.what());
    throw CLI::RuntimeError(kExitConfig);
  }
}

struct RunArgs {
  std::string spec;
  int ranks = 0;  // --ranks: processes per run for every run (0: the spec's)
  bool live = false, no_live = false;
  bool adaptive = false;  // --adaptive: batches chosen by the spec's "adaptive" block
  int64_t max_runs = 0;   // 0: the spec's max_runs or 10,000
  // The runner's options the flags fill directly (--db, -j, -t, --max-retries, --rerun).
  sweeps::RunOptions run;
};

void AddRunOptions(CLI::App* cmd, RunArgs* a) {
  AddDbOption(cmd, &a->run.db_path, DbAccess::kWrite);
  cmd->add_option("--parallel,-j", a->run.parallel, "Runs trained at once")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--threads-per-run,-t", a->run.threads_per_run,
                  "CPU threads per run (default: cores / parallel)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--max-retries", a->run.max_retries,
                  "Retries of a failed run (from its last checkpoint)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--ranks", a->ranks,
                  "Processes per run for every run (mpirun -np N; overrides the spec's ranks; "
                  "each rank takes a --parallel slot)")
      ->check(CLI::PositiveNumber);
  cmd->add_flag("--live", a->live, "Redraw a live table (default when stdout is a terminal)");
  cmd->add_flag("--no-live", a->no_live, "Print one line per event instead of a live table");
  cmd->add_option("--max-runs", a->max_runs,
                  "Refuse specs expanding to more runs than this (default 10000 or the spec's "
                  "max_runs)")
      ->check(CLI::PositiveNumber);
  cmd->add_flag("--extendable", a->run.extendable,
                "WSD runs keep a checkpoint at their decay start, so a longer run of their family "
                "added later continues them instead of starting over (adaptive sweeps always do)");
  cmd->add_flag("--adaptive", a->adaptive,
                "Answer the spec's \"adaptive\" question: train chosen batches until its "
                "stopping rule or budget ends the sweep (docs/sweeps-adaptive.md)");
}

void Execute(const RunArgs& a, bool resume) {
  sweeps::Sweep sweep;
  Guard(resume ? "resume" : "run", [&] {
    sweeps::ExpandOptions eo;
    eo.check_data = true;
    eo.check_device = true;
    eo.max_runs = a.max_runs;
    sweep = sweeps::LoadSweepFromArg(a.spec, a.run.db_path, eo);
    if (a.ranks > 0) sweeps::OverrideRanks(&sweep, a.ranks);
    sweeps::CheckLocalLaunch(sweep);
  });
  for (const std::string& w : sweep.warnings) fmt::print("warning: {}\n", w);
  sweeps::RunOptions ro = a.run;
  ro.live = a.live ? 1 : a.no_live ? 0 : -1;
  ro.stop_flag = &g_sweep_stop;
  std::signal(SIGINT, OnSweepSignal);
  std::signal(SIGTERM, OnSweepSignal);
  // An adaptive sweep resumes adaptively once it has batches; a fresh run needs --adaptive (a
  // spec with an "adaptive" block run without it trains the full grid, its comparison).
  const bool adaptive = a.adaptive || (resume && sweep.adaptive &&
                                       sweeps::HasAdaptiveBatches(a.run.db_path, sweep.name));
  if (adaptive && !sweep.adaptive) {
    fmt::print(stderr, "moelab sweep {}: error: --adaptive: the spec has no \"adaptive\" block\n",
               resume ? "resume" : "run");
    throw CLI::RuntimeError(kExitConfig);
  }
  if (!adaptive && sweep.adaptive && !resume) {
    fmt::print(
        "note: the spec has an \"adaptive\" block; without --adaptive every run of its "
        "grid is trained\n");
  }
  sweeps::RunSummary s;
  try {
    if (adaptive) {
      const sweeps::AdaptiveSummary as = sweeps::RunAdaptiveSweep(sweep, ro);
      fmt::print("adaptive sweep '{}': {} batch(es), {:.3g} FLOPs; {}\n", sweep.name, as.batches,
                 as.spent_flops, as.decision.empty() ? "interrupted" : as.decision);
      s.exit_code = as.exit_code;
    } else {
      s = sweeps::RunSweep(sweep, ro);
    }
  } catch (const sweeps::SweepBusyError& e) {
    fmt::print(stderr, "moelab sweep {}: {}\n", resume ? "resume" : "run", e.what());
    throw CLI::RuntimeError(sweeps::kExitSweepBusy);
  }
  if (s.exit_code != 0) throw CLI::RuntimeError(s.exit_code);
}

}  // namespace

void AddSweepCommand(CLI::App& app) {
  CLI::App* sweep = app.add_subcommand("sweep", "Plan, run and resume families of runs");
  sweep->require_subcommand(1);

  {
    struct Args {
      std::string spec, db;
      int parallel = 1, threads = 0;
      bool no_calibrate = false, no_data_check = false;
      int64_t max_runs = 0;
      double gpu_tflops = 0, gpu_mfu = 0;
      std::string gpu_name = "GPU";
    };
    auto a = std::make_shared<Args>();
    CLI::App* cmd = sweep->add_subcommand(
        "plan", "Validate every run of a spec and print the table with sizes, FLOPs and time");
    cmd->add_option("spec", a->spec, "Sweep spec JSON")->required()->check(CLI::ExistingFile);
    AddDbOption(cmd, &a->db, DbAccess::kReadIfPresent);  // marks the runs already done
    cmd->add_option("--parallel,-j", a->parallel, "Runs at once (for the wall-time estimate)")
        ->check(CLI::PositiveNumber);
    cmd->add_option("--threads-per-run,-t", a->threads, "Threads per run (default cores/parallel)")
        ->check(CLI::NonNegativeNumber);
    cmd->add_flag("--no-calibrate", a->no_calibrate,
                  "Skip the few timed training steps that calibrate the time estimate");
    cmd->add_flag("--no-data-check", a->no_data_check,
                  "Plan a spec whose data is prepared elsewhere (e.g. on the GPU machine)");
    cmd->add_option("--gpu-peak-tflops", a->gpu_tflops,
                    "Print GPU-hours at this peak TFLOP/s per GPU (e.g. 989: H100 SXM, BF16)")
        ->check(CLI::PositiveNumber);
    cmd->add_option("--gpu-mfu", a->gpu_mfu,
                    "Model-FLOPs utilisation for --gpu-peak-tflops (measured or stated)")
        ->check(CLI::Range(0.0, 1.0));
    cmd->add_option("--gpu-name", a->gpu_name, "Name of the GPU in the GPU-time line");
    cmd->add_option("--max-runs", a->max_runs,
                    "Refuse specs expanding to more runs than this (default 10000 or the "
                    "spec's max_runs)")
        ->check(CLI::PositiveNumber);
    cmd->callback([a] {
      Guard("plan", [&] {
        sweeps::ExpandOptions eo;
        eo.check_data = !a->no_data_check;
        // A plan is arithmetic: it is printed in full on a machine without the sweep's device,
        // with a warning (PrintPlan); `sweep run` is what refuses.
        eo.max_runs = a->max_runs;
        if ((a->gpu_tflops > 0) != (a->gpu_mfu > 0)) {
          throw std::runtime_error("--gpu-peak-tflops and --gpu-mfu go together");
        }
        const sweeps::Sweep s = sweeps::LoadSweep(a->spec, eo);
        sweeps::PlanOptions po;
        po.parallel = a->parallel;
        po.threads_per_run = a->threads;
        po.calibrate = !a->no_calibrate;
        po.db_path = a->db;
        po.gpu_peak_tflops = a->gpu_tflops;
        po.gpu_mfu = a->gpu_mfu;
        po.gpu_name = a->gpu_name;
        if (s.adaptive) {
          fmt::print("{}\n", sweeps::DescribeAdaptivePlan(s, sweeps::BuildSpace(s, *s.adaptive),
                                                          *s.adaptive));
          fmt::print("The full grid the adaptive sweep draws from:\n");
        }
        sweeps::PrintPlan(s, po, stdout);
      });
    });
  }
  {
    auto a = std::make_shared<RunArgs>();
    CLI::App* cmd = sweep->add_subcommand(
        "run",
        "Train every run of a spec (done runs are reused), each as a `moelab train` "
        "process");
    cmd->add_option("spec", a->spec, "Sweep spec JSON")->required()->check(CLI::ExistingFile);
    AddRunOptions(cmd, a.get());
    cmd->add_flag("--rerun", a->run.rerun,
                  "Train again even when a done run with the same config exists");
    cmd->callback([a] { Execute(*a, false); });
  }
  {
    auto a = std::make_shared<RunArgs>();
    CLI::App* cmd = sweep->add_subcommand(
        "resume",
        "Continue a sweep after a crash or Ctrl-C: stale, stopped, queued and "
        "retryable failed runs continue from their last checkpoint");
    cmd->add_option("sweep", a->spec, "Spec file or the sweep's name in the database")->required();
    AddRunOptions(cmd, a.get());
    cmd->callback([a] { Execute(*a, true); });
  }
  {
    struct Args {
      std::string name, db;
    };
    auto a = std::make_shared<Args>();
    CLI::App* cmd = sweep->add_subcommand("status", "Sweeps in a database, or one sweep's runs");
    cmd->add_option("sweep", a->name, "Spec file or sweep name (default: list every sweep)");
    AddDbOption(cmd, &a->db, DbAccess::kRead)->check(CLI::ExistingFile);
    cmd->callback([a] {
      Guard("status", [&] {
        sweeps::PrintStatus(a->db, a->name, stdout);
        if (a->name.empty()) return;
        // The adaptive batches and looks, for a sweep with an "adaptive" block (the table above
        // is complete without them: a spec that no longer expands only loses this part).
        try {
          const sweeps::Sweep s = sweeps::LoadSweepFromArg(a->name, a->db);
          if (s.adaptive) sweeps::PrintAdaptiveStatus(a->db, s, stdout);
        } catch (const std::exception& e) {
          fmt::print("(adaptive status not shown: {})\n", e.what());
        }
      });
    });
  }
  {
    auto a = std::make_shared<sweeps::SlurmOptions>();
    auto spec = std::make_shared<std::string>();
    auto submit = std::make_shared<bool>(false);
    auto local_db = std::make_shared<std::string>(kDefaultDb);
    CLI::App* cmd = sweep->add_subcommand(
        "slurm",
        "Write Slurm array scripts (one task per run, each an `srun --ntasks=<ranks> moelab "
        "train` step); --submit sends them to sbatch");
    cmd->add_option("spec", *spec, "Sweep spec JSON")->required()->check(CLI::ExistingFile);
    cmd->add_option("--db", a->db_path,
                    "Database path on the cluster; {task} becomes the array index (one file per "
                    "task, safest on network file systems)")
        ->required();
    cmd->add_option("--out", a->out_dir, "Folder for the script and configs (default: .)");
    cmd->add_option("--moelab", a->moelab_bin, "moelab binary on the cluster");
    cmd->add_option("--threads-per-run,-t", a->threads_per_run, "CPUs per task (per rank)")
        ->check(CLI::PositiveNumber);
    cmd->add_option("--max-parallel", a->max_parallel, "Array throttle (%N)");
    cmd->add_option("--partition", a->resources.partition, "Slurm partition");
    cmd->add_option("--time", a->resources.time_limit, "Time limit per task (HH:MM:SS)");
    cmd->add_option("--mem", a->resources.mem, "Memory per node (#SBATCH --mem, e.g. 8G)");
    cmd->add_option("--account", a->resources.account, "Slurm account to charge");
    cmd->add_option("--gres", a->resources.gres, "Generic resources (e.g. gpu:1)");
    cmd->add_option("--ranks", a->ranks, "Ranks (srun tasks) per run for every run")
        ->check(CLI::PositiveNumber);
    cmd->add_option("--ntasks-per-node", a->ntasks_per_node, "#SBATCH --ntasks-per-node")
        ->check(CLI::PositiveNumber);
    cmd->add_option("--srun-mpi", a->srun_mpi,
                    "srun --mpi=PLUGIN (e.g. pmix; default: the cluster's)");
    cmd->add_flag("--submit", *submit,
                  "Submit the scripts with sbatch and record the jobs for `sweep status`");
    cmd->add_option("--local-db", *local_db,
                    "Local database that records the sweep and its jobs (`db merge` into it "
                    "joins the runs to the sweep); written with --submit or when given")
        ->capture_default_str();
    cmd->callback([a, spec, submit, local_db, cmd] {
      Guard("slurm", [&] {
        const sweeps::Sweep s = sweeps::LoadSweep(*spec);
        const auto scripts = sweeps::WriteSlurmScripts(s, *a);
        for (const auto& sc : scripts) {
          fmt::print("wrote {} ({} array tasks of {} rank(s))\n", sc.path, sc.tasks, sc.ranks);
        }
        if (const std::string note = sweeps::SlurmWsdNote(s); !note.empty()) {
          fmt::print("warning: {}\n", note);
        }
        // Known locally before its runs come back: `db merge` joins them to it. Only written
        // when asked for (--submit or --local-db): writing scripts creates no database.
        const bool record = *submit || cmd->count("--local-db") > 0;
        if (record) {
          sweeps::Store(*local_db).UpsertSweep(s.name, s.spec.dump());
          fmt::print("recorded sweep '{}' in {}\n", s.name, *local_db);
        }
        if (*submit) {
          for (const auto& job : sweeps::SubmitSlurmScripts(s, scripts, *local_db)) {
            fmt::print("submitted {} as Slurm job {}\n", job.script, job.job_id);
          }
          fmt::print("  follow: moelab sweep status {} --db {}\n", s.name, *local_db);
        } else {
          fmt::print("  submit: sbatch <script>   (or add --submit)\n");
          if (!record) {
            fmt::print("  (--local-db DB records the sweep there, so runs merged back join it)\n");
          }
        }
        fmt::print("  then merge: moelab db merge <cluster db> --db {}  (docs/distributed.md)\n",
                   *local_db);
      });
    });
  }
}

}  // namespace moelab::cli
