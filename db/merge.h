// Importing runs from another moelab database (`moelab db merge`): results of a Slurm array
// or another machine join the main file without duplicating runs already there.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace moelab::db {

struct MergeResult {
  int imported = 0;
  int skipped = 0;  // runs whose config hash the destination already has
  std::vector<std::pair<int64_t, int64_t>> id_map;  // (source run id, new destination run id)
  int promotions_imported = 0;
  int promotions_skipped = 0;         // already in dst (same creation time, plan and config)
  int adaptive_batches_imported = 0;  // adaptive sweeps' batches (with their looks) copied
  int adaptive_batches_skipped = 0;   // already in dst (same batch number and runs)
  // Adaptive sweeps (by name) whose history in dst differs from src's: left as dst has it.
  std::vector<std::string> adaptive_conflicts;
};

// Copies every run of src whose config_hash is not yet in dst, with all its rows (summary,
// variables, steps, evaluations, max logits, expert counts, clip events), in one transaction.
// A run's sweep is matched by name and created in dst when missing. Promotions of src travel
// with their runs: each one dst does not have yet is copied, its launched and source runs
// re-linked to the destination's runs of the same config hash (imported now or already there),
// its sweep by name; its fit (fits are not merged) is dropped (NULL). An adaptive sweep's history
// (its chosen batches and the look after each, migration 9) travels with its sweep: the batches
// dst lacks are copied when the ones both hold are the same (dst holds a prefix of src's
// history, or none of it); where a batch of the same number chose other runs the two histories
// of one sequential question cannot be joined (its error rate was spent along one of them), so
// dst's is kept and the sweep is named in adaptive_conflicts. Both files must have this
// build's schema version (dst is migrated on open).
MergeResult MergeDatabase(const std::string& dst_path, const std::string& src_path);

}  // namespace moelab::db
