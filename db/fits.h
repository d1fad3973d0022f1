// Stored scaling-law fits (`moelab fit`), so the GUI shows them without refitting, and the
// sweep list the fits are grouped by.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace moelab::db {

struct SweepRow {
  int64_t id = 0;
  std::string name;
  double created_at = 0;
  int runs = 0;
};

struct FitRecord {
  int64_t id = 0;
  std::optional<int64_t> sweep_id;
  double created_at = 0;
  std::string family_key;    // the sweep variable or config path families are grouped by
  std::string form;          // "power" | "joint" | "chinchilla" | "heads"
  std::string options_json;  // fit options incl. resamples, level, Huber delta
  std::string inputs_json;   // the observations fitted
  std::string result_json;   // the analysis result (parameters with intervals, tables)
  uint64_t bootstrap_seed = 0;
};

// Every sweep with its run count, oldest first (read-only connection).
std::vector<SweepRow> ListSweeps(const std::string& path);
std::optional<SweepRow> FindSweep(const std::string& path, const std::string& name);

// Inserts a fit; returns its id.
int64_t SaveFit(const std::string& path, const FitRecord& fit);
// Fits of a sweep (all fits when sweep_id is nullopt), newest first (read-only connection).
std::vector<FitRecord> ListFits(const std::string& path, std::optional<int64_t> sweep_id);

}  // namespace moelab::db
