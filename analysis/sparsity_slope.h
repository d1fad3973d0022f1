// The pre-registered sparsity estimand (DESIGN.md "Statistics"): the per-doubling slope β in
//   log(C_S / C_ref) = β · log2(S_ref / S),
// fitted through the origin for each seed at each target loss L*, over the sparsities S the
// model-free table compares with the reference (K2's reference is S = 48). exp(β) is the FLOPs
// factor one doubling of sparsity saves; K2's 1.69× between S = 8 and 48 is β = ln 1.69 /
// log2 6 ≈ 0.20 (1.22× per doubling). β is reported per target with its t interval over seeds
// and exact sign-flip p, and as a trend in L* (each seed's least-squares slope dβ/dL*), since
// a constant gap on a flattening curve moves β with the target by itself.
//
// Which frontier the C's come from is the caller's: a single model size per S is a training
// curve (a different estimand from the report's compute-optimal frontier), and says so.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "analysis/model_free.h"
#include "analysis/seed_stats.h"

namespace moelab::analysis {

struct SparsitySlopeAtTarget {
  double target_loss = 0;
  std::vector<std::string> seeds;     // seeds with every compared sparsity at this target
  std::vector<double> beta_per_seed;  // β_s
  SeedStatement beta;                 // over seeds, additive scale
  double per_doubling = 0;            // exp(mean β)
  double per_doubling_lo = 0, per_doubling_hi = 0;  // exp of the t interval ends
};

struct SparsitySlope {
  double reference_sparsity = 0;
  std::vector<double> sparsities;  // compared with the reference
  std::vector<SparsitySlopeAtTarget> targets;
  std::vector<std::string> trend_seeds;
  std::vector<double> trend_per_seed;  // dβ/dL* per seed (seeds with ≥ 2 targets)
  SeedStatement trend;
  std::vector<std::string> notes;
};

// `sparsity_of`: family name -> sparsity (total / active experts); families missing from it are
// read as numbers when their names are numbers, and left out otherwise. Throws AnalysisError
// when fewer than one non-reference sparsity is known.
SparsitySlope EstimateSparsitySlope(const ModelFreeTable& table,
                                    const std::map<std::string, double>& sparsity_of,
                                    double level = 0.90, int min_seeds = 3);

// The printed block `moelab fit` shows (and docs/analysis.md describes), labelled with the
// estimand of the table it was read from (ModelFreeTable::estimand: "frontier
// (compute-optimal)", "fixed size (training curve)" or "mixed (...)").
std::string FormatSparsitySlope(const SparsitySlope& s, const std::string& estimand);

// What `moelab fit` prints after the model-free table: the β block (labelled with the table's
// estimand: the report's compute-optimal frontier, or a single-size training curve when every
// family has one model size), or "" when the families carry no
// sparsity (a sweep over another variable) or fewer than two sparsities are compared.
std::string SparsitySlopeReport(const ModelFreeTable& table, const std::vector<Observation>& points,
                                const std::map<std::string, double>& sparsity_of, double level,
                                int min_seeds);

void to_json(nlohmann::json& j, const SparsitySlopeAtTarget& v);
void to_json(nlohmann::json& j, const SparsitySlope& v);

}  // namespace moelab::analysis
