// A promotion's folder: the promoted config, the plan and three launchers (local, mpirun,
// Slurm) that train or continue the promotion's run, and starting one detached. The scripts
// name the config, database and checkpoints relative to the folder `moelab promote` ran in (the
// local ones find it from their own location; the Slurm one is submitted from it); MOELAB,
// MOELAB_DB and MOELAB_ROOT override the binary, database and folder. docs/promote.md.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "promote/plan.h"
#include "sweeps/slurm.h"

namespace moelab::promote {

// What the launchers need besides the plan: whose run they train, where the database is, the
// parallel layout and the Slurm request.
struct LaunchFiles {
  int64_t promotion_id = 0;
  int64_t run_id = 0;
  std::string db_path;
  PromoteLayout layout;
  sweeps::SlurmResources slurm;  // launch_slurm.sbatch's #SBATCH lines
  std::string moelab_bin;        // a path, or "moelab" (from PATH)
};

// Writes config.json, plan.json, plan.txt, launch_local.sh, launch_mpirun.sh and
// launch_slurm.sbatch into out_dir (which the caller has taken for this promotion); returns
// their paths. Every launcher runs `moelab train --run-id N --resume`: running one again, or
// requeueing the Slurm job, continues from the run's newest checkpoint and never restarts it.
std::vector<std::string> WritePromotionFiles(const std::string& out_dir, const PromotionPlan& plan,
                                             const LaunchFiles& files);

// Starts out_dir's launch_local.sh (launch_mpirun.sh for ranks > 1) detached, logging to
// train.log there; returns the child's pid.
int LaunchPromotion(const std::string& out_dir, int ranks);

// The moelab binary next to `self` (for the GUI: moelab-gui and moelab share build/bin), or
// "moelab" from PATH.
std::string MoelabBinaryBeside(const std::string& self);

}  // namespace moelab::promote
