// Promotion against a database: choose the stored fit, the family and the source run, plan,
// record the promotion with its queued run and write its folder (promote/launch.h starts it).
// Shared by `moelab promote` and moelab-gui's Promote panel.
//
// One plan, one run: a plan whose config (hash) already has a promoted run is not recorded
// again (FindPromotedRun says which run and how to continue it); a second run of the same plan
// must be asked for (`--again`: another seed, ReseedForAnotherRun). Every promotion writes its
// own folder (<db>.promotions/<promotion id> by default) and never another's.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "db/fits.h"
#include "db/promotions.h"
#include "db/types.h"
#include "promote/launch.h"
#include "promote/plan.h"

namespace moelab::promote {

struct PromoteRequest {
  std::string db_path;
  std::string sweep;
  std::string family;  // "KEY=VALUE" (or empty with run_id)
  int64_t run_id = -1;
  PromoteTarget target;
  PromoteLayout layout;
  PromoteOptions options;
  // Empty: <db>.promotions/<promotion id>. Either way a folder that holds files already (another
  // promotion's) is refused: no promotion's files are rewritten by another.
  std::string out_dir;
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

// Refuses (PromotionRefused, naming --out) a folder that holds files or that a recorded
// promotion wrote: RecordPromotion checks it too; the CLI calls it before planning.
void CheckOutFolder(const std::string& db_path, const std::string& out_dir);

// A run the plan's config already has: the promotion that recorded it and the run as stored.
struct PromotedRun {
  db::PromotionRecord promotion;
  db::RunRow run;
  std::string state;  // "done" | "running" | "resumable" | "diverged"
};

// The newest promotion whose run has the config's hash (one plan, one run), if any.
std::optional<PromotedRun> FindPromotedRun(const std::string& db_path, const RunConfig& config);

// Which run, its state (done / running / resumable / diverged, with its step and loss) and, for a
// resumable one, the command that continues it; ends by saying that nothing new was started and
// what `--again` does.
std::string DescribePromotedRun(const PromotedRun& existing, const std::string& db_path);

// `--again`: sets the plan's train.seed to the first seed after its own whose config has no
// promoted run yet, so the new run is another sample of the same plan (not a replay of the
// first); returns the sentence that says so. The seed is kept when no run has the plan's config.
std::string ReseedForAnotherRun(const std::string& db_path, PromotionPlan* plan);

// Inserts the promotions row and the queued run it links to, takes the promotion's own folder
// and writes it (WritePromotionFiles). Refuses (PromotionRefused) a plan whose config already
// has a promoted run (DescribePromotedRun is the message) and a folder that holds files already.
RecordedPromotion RecordPromotion(const PromoteRequest& request, const PreparedPromotion& prepared,
                                  const std::string& moelab_bin);

}  // namespace moelab::promote
