// Internal: what every fit shares — cleaning observations, the seed-level (cluster) resampling
// plan, the bootstrap bookkeeping, multi-start solves and frontiers. Not part of the public API.
#pragma once

#include <cstdint>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "analysis/fit_engine.h"
#include "analysis/scaling.h"

namespace moelab::analysis::internal {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// Drops points that cannot be fitted (diverged runs give NaN/inf losses) and reports them per
// run, so a sweep with a few broken runs still fits but says what it ignored.
std::vector<Observation> CleanObservations(const std::vector<Observation>& obs,
                                           bool need_params_tokens,
                                           std::vector<std::string>* warnings);

// The resampling unit of an observation: its trunk (Observation::unit: seed + BranchHash
// family), or the run itself when the loader did not know the trunk.
std::string UnitOf(const Observation& o);
// The seed group whose lower envelope is the frontier (empty: one group for all runs).
inline const std::string& SeedOf(const Observation& o) { return o.seed; }

// How bootstrap resample b draws units across families. Paired by seed when every observation
// has a seed and no family holds two trunks of one seed (the WSD sweep design: one trunk per
// seed and family): then one stratum of seeds, and resample b gives every family the same
// seeds. Otherwise each family draws its own units (one stratum per family).
struct ClusterPlan {
  bool paired_by_seed = false;
  int n_draw = 0;                                         // length of the counts vector
  std::vector<std::vector<int>> strata;                   // indices into counts
  std::map<std::string, int> index;                       // draw key -> index into counts
  std::map<std::string, int> units;                       // family -> distinct units (trunks)
  std::map<std::string, std::vector<std::string>> seeds;  // family -> its seeds (sorted)
  int DrawIndex(const Observation& o) const;
};
ClusterPlan MakeClusterPlan(const std::map<std::string, std::vector<Observation>>& families);

// Units a family needs for an interval: `min_units` seeds when units are seeds paired across
// families; at least kMinDesignUnits when each unit is its own design point (a model size or
// budget trained once): resampling 3–4 of those measured 74–124x too wide (docs/analysis.md).
constexpr int kMinDesignUnits = 5;
int UnitsNeeded(const ClusterPlan& plan, int min_units);
// "n seeds: too few for an interval": what a statement lacks, or "" when it has enough units.
std::string TooFewUnits(int n_units, int needed, bool seeds = true);

Estimate MakeEstimate(double point, const std::vector<double>& draws, double level);
bool AtBound(double v, double lo, double hi);

struct Bounds {
  std::vector<double> lo, hi;
};

// Bit k set when parameter k of `p` sits on its bound: the last column of a bootstrap row.
double BoundMask(const std::vector<double>& p, const Bounds& b, int n_params);

// One bookkeeping path for every bootstrap (power law, joint, Chinchilla). Row b is a failed
// resample when its first value is NaN; its last column is BoundMask over the first `n_params`
// columns. Failures are counted and warned about, and the fit is refused above
// FitOptions::max_failed_fraction: intervals are never computed from a silently thinned set.
struct BootstrapDraws {
  int ok = 0, failed = 0;
  std::vector<std::vector<double>> columns;  // successful draws of each value column
  std::vector<double> at_bound;              // per parameter: fraction of successful resamples
};
BootstrapDraws SummarizeBootstrap(const std::string& what,
                                  const std::vector<std::vector<double>>& rows, int n_params,
                                  const FitOptions& opt, std::vector<std::string>* warnings);

// Multi-start solve: every start is run to convergence and the lowest objective wins.
struct MultiStartResult {
  SolveResult best;
  int winning_start = -1;
  std::vector<double> winning_values;
  int tried = 0;
};
MultiStartResult MultiStart(const FitData& data, const std::vector<std::vector<double>>& starts,
                            const Bounds& b, const FitOptions& opt);

double RmseLog(const FitData& d, const std::vector<double>& p);
// Raw parameter k of `best` as reported: its estimate over the bootstrap's draws of column k at
// `level`, its bounds, and whether it (and what share of the resamples) sits on one.
ParamEstimate RawParamEstimate(const std::string& name, const std::vector<double>& best, int k,
                               const BootstrapDraws& bd, const Bounds& bounds, double level);
// Fills what every fit reports alike: the multi-start's winner, the residual RMS of `best` over
// `data` and the bootstrap's counts. params_at_bound stays the caller's: it names them its way.
void FillDiagnostics(const MultiStartResult& ms, const FitData& data,
                     const std::vector<double>& best, int n_points, int n_runs,
                     const BootstrapDraws& bd, FitDiagnostics* dg);
// log_A that best matches the points for a given (E, α [, β]).
double AmplitudeFor(const FitData& d, double E, double alpha, double beta, double min_loss);
double MinLoss(const std::vector<FrontierPoint>& pts);
double MinExpLoss(const FitData& d);

// Lower envelope of loss over compute of `obs` (each run's last point only when final_only).
std::vector<FrontierPoint> FrontierOf(const std::vector<Observation>& obs, bool final_only);
// The frontier of each seed group (SeedOf), merged and sorted by compute: with several seeds the
// envelope across them would keep each budget's luckiest seed, a downward bias.
std::vector<FrontierPoint> SeedFrontiers(const std::vector<Observation>& obs, bool final_only);

// Validates one family (finite points, varying loss, `min_frontier` frontier points); throws
// AnalysisError naming the family.
void CheckFamily(const std::string& family, const std::vector<Observation>& obs, int min_frontier,
                 bool final_only);

// C(L) = unit·(A / (L − E))^(1/alpha); NaN for L ≤ E.
double ComputeAt(double E, double log_A, double alpha, double unit, double loss);

}  // namespace moelab::analysis::internal
