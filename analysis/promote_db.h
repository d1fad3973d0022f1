// Promotion against a database: choose the stored fit, the family and the source run, plan,
// write the promoted config and launch scripts, record the promotion with its queued run, and
// launch it. Shared by `moelab promote` and moelab-gui's Promote panel.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "analysis/promote.h"
#include "db/fits.h"
#include "sweeps/slurm.h"

namespace moelab::analysis {

struct PromoteRequest {
  std::string db_path;
  std::string sweep;
  std::string family;  // "KEY=VALUE" (or empty with run_id)
  int64_t run_id = -1;
  PromoteTarget target;
  PromoteLayout layout;
  PromoteOptions options;
  std::string out_dir;  // empty: <db>.promotions/<config hash 16>
  // launch_slurm.sbatch's #SBATCH --partition/--time/--mem/--account/--gres.
  sweeps::SlurmResources slurm;
  // Optional: measures this machine's training rate (FLOP/s of one rank) for a config; the
  // CLI passes sweeps::MeasureThroughput. Returns the rate and fills `how`.
  std::function<double(const RunConfig&, std::string* how)> measure;
};

struct PreparedPromotion {
  PromotionPlan plan;
  db::FitRecord fit;
  int64_t sweep_id = 0;
  std::string key, value, source_run;
};

// Throws PromotionRefused with the reason (no sweep, no fit, unknown family/run, target out of
// range). Reads the database read-only.
PreparedPromotion PreparePromotion(const PromoteRequest& request);

struct RecordedPromotion {
  int64_t promotion_id = 0;
  int64_t run_id = 0;
  std::string run_name;
  std::string out_dir;
  std::vector<std::string> files;
};

// Writes config.json, plan.json, plan.txt, launch_local.sh, launch_mpirun.sh and
// launch_slurm.sbatch, inserts the promotions row and the queued run it links to. Every launcher
// trains or continues that run (`moelab train --run-id N --resume`): running one again, or
// requeueing the Slurm job, continues from the run's newest checkpoint and never restarts it.
// The scripts name the config, database and checkpoints relative to the folder `moelab promote`
// ran in (the local ones find it from their own location; the Slurm one is submitted from it);
// MOELAB, MOELAB_DB and MOELAB_ROOT override the binary, database and folder.
RecordedPromotion RecordPromotion(const PromoteRequest& request, const PreparedPromotion& prepared,
                                  const std::string& moelab_bin);

// Starts launch_local.sh (launch_mpirun.sh for ranks > 1) detached, logging to train.log in the
// promotion's folder; returns the child's pid.
int LaunchPromotion(const RecordedPromotion& recorded, int ranks);

// The moelab binary next to `self` (for the GUI: moelab-gui and moelab share build/bin), or
// "moelab" from PATH.
std::string MoelabBinaryBeside(const std::string& self);

}  // namespace moelab::analysis
