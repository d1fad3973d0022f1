// `moelab sweep slurm`: Slurm array scripts that train a sweep's runs on a cluster, one array
// task per run, each task one `srun --ntasks=<ranks> moelab train` step, into a database whose
// results `moelab db merge` imports back (the runs then join the sweep: sweeps/adopt.h).
// With --submit the scripts go to sbatch and `moelab sweep status` follows the jobs through
// squeue/sacct.
#pragma once

#include <cstdio>
#include <string>
#include <vector>

#include "sweeps/spec.h"

namespace moelab::sweeps {

// What a job asks Slurm for, from command-line options (moelab sweep slurm, moelab promote):
// each non-empty field becomes one #SBATCH line.
struct SlurmResources {
  std::string partition;
  std::string time_limit;  // --time, e.g. 04:00:00
  std::string mem;         // --mem, e.g. 8G
  std::string account;
  std::string gres;         // e.g. gpu:1
  int signal_lead_s = 120;  // USR1 this many seconds before the time limit
};

// The #SBATCH lines of `r`, then --requeue, --signal=B:USR1@<lead> and --open-mode=append: a
// preempted job is requeued, one about to hit its time limit checkpoints and requeues itself
// (SlurmTrainStep), and every attempt's output stays in the log.
std::string SlurmDirectives(const SlurmResources& r);

// The end of a batch script that runs `srun_command` (one `srun ... moelab train ... --resume`
// step) in the background and waits for it: USR1 (the time-limit warning) and TERM (preemption,
// requeue, scancel) reach the trainer as USR1 — srun forwards USR1 to every rank, while a TERM
// to srun SIGKILLs them — so it checkpoints and exits 4; after USR1 the task requeues itself
// (`scontrol requeue <array job>_<index>`, or $SLURM_JOB_ID outside an array) and, its command
// being train-or-continue, goes on from that checkpoint. Exits with the step's code.
std::string SlurmTrainStep(const std::string& srun_command);

struct SlurmOptions {
  std::string db_path;  // may contain {task}: one database file per array task
  std::string out_dir;  // where the script and the run configs go
  std::string moelab_bin = "moelab";
  int threads_per_run = 2;   // --cpus-per-task (per rank) and train.threads
  int max_parallel = 0;      // %N array throttle; 0 = none
  SlurmResources resources;  // --partition, --time, --mem, --account, --gres
  std::string extra;         // more #SBATCH lines, verbatim
  int ranks = 0;             // > 0: every run on this many ranks (overrides the spec)
  int ntasks_per_node = 0;   // > 0: #SBATCH --ntasks-per-node
  std::string srun_mpi;      // srun --mpi=<plugin> (e.g. pmix); "": the cluster's default
};

// What Slurm does not do that `sweep run` would: WSD branching (every run trains from scratch,
// so the shorter runs of a WSD family repeat the longest run's stable phase). "" when the sweep
// has no branches; else one sentence with the FLOPs the scripts will cost against the plan's.
// The CLI prints it as a warning and WriteSlurmScripts puts it in the script's header.
std::string SlurmWsdNote(const Sweep& sweep);

// One array script: the runs that share a rank count.
struct SlurmScript {
  std::string path;
  int ranks = 1;
  int tasks = 0;  // array tasks (runs)
};

// Writes one script per distinct rank count — <out_dir>/<sweep>.sbatch when every run has the
// same, else <sweep>.r<ranks>.sbatch — and <out_dir>/configs/<hash16>.json. Throws SpecError.
// The scripts name their configs and logs relative to the folder they are submitted from (they
// cd to $SLURM_SUBMIT_DIR, or $MOELAB_ROOT): submit from the folder `sweep slurm` ran in. Each
// task trains or continues its run (`moelab train CONFIG --name NAME --resume`).
std::vector<SlurmScript> WriteSlurmScripts(const Sweep& sweep, const SlurmOptions& options);
// The first script's path (sweeps whose runs all have one rank count have only one).
std::string WriteSlurmScript(const Sweep& sweep, const SlurmOptions& options);

// A submitted job, recorded in <SweepDir(local db, sweep)>/slurm-jobs.json.
struct SlurmJob {
  std::string job_id;
  std::string script;
  int ranks = 1;
  int tasks = 0;
  double submitted_at = 0;
};

// Submits each script with `sbatch --parsable` (from PATH) and records the job ids for
// `sweep status`; also records the sweep itself in local_db, so runs merged back from the
// cluster join it. Throws std::runtime_error when sbatch is missing or fails.
std::vector<SlurmJob> SubmitSlurmScripts(const Sweep& sweep,
                                         const std::vector<SlurmScript>& scripts,
                                         const std::string& local_db);

std::vector<SlurmJob> LoadSlurmJobs(const std::string& local_db, const std::string& sweep_name);

// The state of every array task of the sweep's submitted jobs, from `squeue -r -t all` (pending,
// running, and ended within the controller's MinJobAge) and `sacct -X` (finished), whichever are
// on PATH; one line per job. Prints nothing when the sweep has no submitted jobs.
void PrintSlurmJobs(const std::string& local_db, const std::string& sweep_name, std::FILE* out);

}  // namespace moelab::sweeps
