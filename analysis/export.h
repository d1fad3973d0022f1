// A self-contained export of a sweep's results (`moelab db export`): every run with its status,
// variables, config and shape, and every evaluation point, flagged final / on the loss-compute
// frontier. `moelab fit --inputs EXPORT.json` reads the same observations back, so a committed
// export reproduces an experiment's tables without its database.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <ostream>
#include <string>

#include "analysis/observations.h"

namespace moelab::analysis {

constexpr int kExportVersion = 1;

// {"moelab_export": 1, "sweep": name|null, "runs": [...], "points": [...]}; see docs/analysis.md.
// Runs of every status are listed (the fit uses done and diverged ones, as LoadObservations).
nlohmann::json ExportRuns(const std::string& db_path, std::optional<int64_t> sweep_id,
                          const std::string& sweep_name = "");

// The observations LoadObservations would read from the database the export came from.
// Throws std::runtime_error for a file that is not a moelab export.
ObservationSet ObservationsFromExport(const nlohmann::json& exported,
                                      const std::string& family_key);

// One row per evaluation point: run columns, the run's variables, then the point.
std::string ExportCsv(const nlohmann::json& exported);

// Per-step metrics (`moelab db export --steps`): one row per (run, recorded step) with run_id,
// run_name, the run's sweep variables (one column each, e.g. sparsity, moe.experts_total;
// blank for a run without it; not the trainer's own build.*, data.*, dist.* records), step, tokens,
// flops, loss, aux_loss, lr, grad_norm, val_loss (empty off evaluation steps), max_logit (over all
// heads), smax_l<L>_h<H> for every layer and head, and load_l<L>_e<E> (the expert's share of its
// MoE layer's routed assignments at that step). CSV has the union of the runs' columns (blank where
// a run has none); JSON Lines has one flat object per row with the keys of its run (null for a
// missing value). Streams run by run, so a large database never sits in memory. Returns the number
// of rows. See docs/database.md.
enum class StepsFormat { kCsv, kJsonLines };
int64_t ExportSteps(const std::string& db_path, std::optional<int64_t> sweep_id, StepsFormat format,
                    std::ostream& out);

}  // namespace moelab::analysis
