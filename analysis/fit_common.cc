// The fit machinery every scaling analysis shares (see fit_common.h).
#include "analysis/fit_common.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "analysis/bootstrap.h"

namespace moelab::analysis::internal {

namespace {
bool Finite(double v) { return std::isfinite(v); }
}  // namespace

// Drops points that cannot be fitted (diverged runs give NaN/inf losses) and reports them per
// run, so a sweep with a few broken runs still fits but says what it ignored.
std::vector<Observation> CleanObservations(const std::vector<Observation>& obs,
                                           bool need_params_tokens,
                                           std::vector<std::string>* warnings) {
  std::vector<Observation> out;
  std::map<std::string, int> dropped;
  for (const auto& o : obs) {
    bool ok = Finite(o.loss) && o.loss > 0 && Finite(o.flops) && o.flops > 0;
    if (need_params_tokens)
      ok = ok && Finite(o.params) && o.params > 0 && Finite(o.tokens) && o.tokens > 0;
    if (ok) {
      out.push_back(o);
    } else {
      dropped[o.family + "/" + o.run]++;
    }
  }
  for (const auto& [key, n] : dropped) {
    warnings->push_back(fmt::format(
        "run {}: dropped {} point(s) with non-finite or non-positive loss/FLOPs{} (diverged run?)",
        key, n, need_params_tokens ? "/params/tokens" : ""));
  }
  return out;
}

std::string UnitOf(const Observation& o) { return o.unit.empty() ? "run " + o.run : o.unit; }

int ClusterPlan::DrawIndex(const Observation& o) const {
  return index.at(paired_by_seed ? "seed " + o.seed : o.family + "\n" + UnitOf(o));
}

ClusterPlan MakeClusterPlan(const std::map<std::string, std::vector<Observation>>& families) {
  ClusterPlan plan;
  bool pairable = true;
  std::map<std::string, std::map<std::string, std::set<std::string>>> units_of_seed;
  for (const auto& [family, obs] : families) {
    std::set<std::string> units, seeds;
    for (const auto& o : obs) {
      units.insert(UnitOf(o));
      if (o.seed.empty()) pairable = false;
      seeds.insert(o.seed);
      units_of_seed[family][o.seed].insert(UnitOf(o));
    }
    plan.units[family] = static_cast<int>(units.size());
    plan.seeds[family] = {seeds.begin(), seeds.end()};
    for (const auto& [seed, u] : units_of_seed[family]) pairable = pairable && u.size() == 1;
  }
  plan.paired_by_seed = pairable;
  if (pairable) {
    std::set<std::string> all;
    for (const auto& [family, seeds] : plan.seeds) all.insert(seeds.begin(), seeds.end());
    plan.strata.emplace_back();
    for (const auto& seed : all) {
      plan.index["seed " + seed] = plan.n_draw;
      plan.strata.back().push_back(plan.n_draw++);
    }
    return plan;
  }
  for (const auto& [family, obs] : families) {
    plan.strata.emplace_back();
    for (const auto& o : obs) {
      auto [it, inserted] = plan.index.emplace(family + "\n" + UnitOf(o), plan.n_draw);
      if (inserted) plan.strata.back().push_back(plan.n_draw++);
    }
  }
  return plan;
}

int UnitsNeeded(const ClusterPlan& plan, int min_units) {
  return plan.paired_by_seed ? min_units : std::max(min_units, kMinDesignUnits);
}

std::string TooFewUnits(int n_units, int needed, bool seeds) {
  if (n_units >= needed) return "";
  return fmt::format(
      "{} {}{}: too few for an interval (the replicate is a seed's trunk with its branches; an "
      "interval needs >= {})",
      n_units, seeds ? "seed" : "trunk", n_units == 1 ? "" : "s", needed);
}

Estimate MakeEstimate(double point, const std::vector<double>& draws, double level) {
  auto [lo, hi] = internal::PercentileInterval(draws, level);
  return {point, lo, hi};
}

bool AtBound(double v, double lo, double hi) {
  double tol = 1e-6 * std::max(1.0, hi - lo);
  return v - lo <= tol || hi - v <= tol;
}

// Bit k set when parameter k of `p` sits on its bound: the last column of a bootstrap row.
double BoundMask(const std::vector<double>& p, const Bounds& b, int n_params) {
  uint64_t mask = 0;
  for (int k = 0; k < n_params; ++k) {
    if (AtBound(p[k], b.lo[k], b.hi[k])) mask |= uint64_t{1} << k;
  }
  return static_cast<double>(mask);
}

BootstrapDraws SummarizeBootstrap(const std::string& what,
                                  const std::vector<std::vector<double>>& rows, int n_params,
                                  const FitOptions& opt, std::vector<std::string>* warnings) {
  BootstrapDraws d;
  const int width = rows.empty() ? 1 : static_cast<int>(rows.front().size());
  d.columns.assign(width - 1, {});
  std::vector<int> bound(n_params, 0);
  for (const auto& r : rows) {
    if (std::isnan(r[0])) {
      d.failed++;
      continue;
    }
    d.ok++;
    for (int k = 0; k < width - 1; ++k) d.columns[k].push_back(r[k]);
    const auto mask = static_cast<uint64_t>(r[width - 1]);
    for (int k = 0; k < n_params; ++k) bound[k] += (mask >> k) & 1;
  }
  const int total = static_cast<int>(rows.size());
  if (d.ok < 2 || d.failed > opt.max_failed_fraction * total) {
    throw AnalysisError(fmt::format(
        "{}: {} of {} bootstrap resamples failed ({:.1f}%, limit {:.0f}%, see "
        "--max-failed-fraction); intervals from the survivors would be biased towards resamples "
        "that look like the full data, so the fit is refused (more runs per family help)",
        what, d.failed, total, 100.0 * d.failed / std::max(1, total),
        100 * opt.max_failed_fraction));
  }
  if (d.failed > 0) {
    warnings->push_back(fmt::format(
        "{}: {} of {} bootstrap resamples failed ({:.1f}%, under the {:.0f}% limit); intervals "
        "use the other {}",
        what, d.failed, total, 100.0 * d.failed / total, 100 * opt.max_failed_fraction, d.ok));
  }
  d.at_bound.resize(n_params);
  for (int k = 0; k < n_params; ++k) d.at_bound[k] = static_cast<double>(bound[k]) / d.ok;
  return d;
}

MultiStartResult MultiStart(const internal::FitData& data,
                            const std::vector<std::vector<double>>& starts, const Bounds& b,
                            const FitOptions& opt) {
  MultiStartResult r;
  for (size_t s = 0; s < starts.size(); ++s) {
    internal::SolveResult sr =
        internal::Solve(data, starts[s], b.lo, b.hi, opt.huber_delta, opt.max_iterations);
    r.tried++;
    if (!sr.usable) continue;
    if (r.winning_start < 0 || sr.cost < r.best.cost) {
      r.best = sr;
      r.winning_start = static_cast<int>(s);
      r.winning_values = starts[s];
    }
  }
  return r;
}

double RmseLog(const internal::FitData& d, const std::vector<double>& p) {
  double s = 0;
  for (size_t i = 0; i < d.log_loss.size(); ++i) {
    double x[2] = {d.x0[i], d.x1.empty() ? 0.0 : d.x1[i]};
    double r = internal::PredictLogLoss(d.form, p.data(), x) - d.log_loss[i];
    s += r * r;
  }
  return std::sqrt(s / std::max<size_t>(1, d.log_loss.size()));
}

ParamEstimate RawParamEstimate(const std::string& name, const std::vector<double>& best, int k,
                               const internal::BootstrapDraws& bd, const internal::Bounds& bounds,
                               double level) {
  ParamEstimate p;
  p.name = name;
  p.value = internal::MakeEstimate(best[k], bd.columns[k], level);
  p.lower_bound = bounds.lo[k];
  p.upper_bound = bounds.hi[k];
  p.at_bound = internal::AtBound(best[k], bounds.lo[k], bounds.hi[k]);
  p.resamples_at_bound = bd.at_bound[k];
  return p;
}

void FillDiagnostics(const internal::MultiStartResult& ms, const internal::FitData& data,
                     const std::vector<double>& best, int n_points, int n_runs,
                     const internal::BootstrapDraws& bd, FitDiagnostics* dg) {
  dg->starts_tried = ms.tried;
  dg->winning_start = ms.winning_start;
  dg->winning_start_values = ms.winning_values;
  dg->cost = ms.best.cost;
  dg->rmse_log = RmseLog(data, best);
  dg->n_points = n_points;
  dg->n_runs = n_runs;
  dg->resamples_ok = bd.ok;
  dg->resamples_failed = bd.failed;
}

// log_A that best matches the points for a given (E, α [, β]): the starting grid spans E and the
// exponents, and the amplitude follows from them, so no start is wildly off in scale.
double AmplitudeFor(const internal::FitData& d, double E, double alpha, double beta,
                    double min_loss) {
  double s = 0;
  int n = 0;
  for (size_t i = 0; i < d.log_loss.size(); ++i) {
    double L = std::exp(d.log_loss[i]);
    double x1 = d.x1.empty() ? 0.0 : d.x1[i];
    double gap = std::max(L - E, 1e-3 * min_loss);
    s += std::log(gap) + alpha * d.x0[i] + beta * x1;
    n++;
  }
  return n ? s / n : 0.0;
}

double MinLoss(const std::vector<FrontierPoint>& pts) {
  double m = std::numeric_limits<double>::infinity();
  for (const auto& p : pts) m = std::min(m, p.loss);
  return m;
}

double MinExpLoss(const FitData& d) {
  double m = std::numeric_limits<double>::infinity();
  for (double l : d.log_loss) m = std::min(m, std::exp(l));
  return m;
}

std::vector<FrontierPoint> FrontierOf(const std::vector<Observation>& obs, bool final_only) {
  std::vector<const Observation*> pts;
  if (final_only) {
    std::map<std::string, const Observation*> last;
    for (const auto& o : obs) {
      auto& l = last[o.run];
      if (!l || o.flops > l->flops) l = &o;
    }
    for (const auto& [run, o] : last) pts.push_back(o);
  } else {
    for (const auto& o : obs) pts.push_back(&o);
  }
  std::sort(pts.begin(), pts.end(), [](const Observation* a, const Observation* b) {
    if (a->flops != b->flops) return a->flops < b->flops;
    if (a->loss != b->loss) return a->loss < b->loss;
    return a->run < b->run;
  });
  std::vector<FrontierPoint> front;
  double best = std::numeric_limits<double>::infinity();
  for (const Observation* o : pts) {
    if (o->loss < best) {
      best = o->loss;
      front.push_back({o->run, o->flops, o->loss});
    }
  }
  return front;
}

std::vector<FrontierPoint> SeedFrontiers(const std::vector<Observation>& obs, bool final_only) {
  std::map<std::string, std::vector<Observation>> groups;
  for (const auto& o : obs) groups[SeedOf(o)].push_back(o);
  std::vector<FrontierPoint> out;
  for (const auto& [seed, g] : groups) {
    auto f = FrontierOf(g, final_only);
    out.insert(out.end(), f.begin(), f.end());
  }
  std::stable_sort(out.begin(), out.end(), [](const FrontierPoint& a, const FrontierPoint& b) {
    return a.flops < b.flops;
  });
  return out;
}

// Validates one family and returns its cleaned observations; throws with the family's name.
void CheckFamily(const std::string& family, const std::vector<Observation>& obs, int min_frontier,
                 bool final_only) {
  if (obs.empty()) {
    throw AnalysisError(fmt::format(
        "family '{}': no finite observations (all points dropped as NaN/inf/non-positive)",
        family));
  }
  if (obs.size() == 1) {
    throw AnalysisError(fmt::format(
        "family '{}': only one observation (run '{}'); a fit needs at least {} frontier points",
        family, obs[0].run, min_frontier));
  }
  auto [mn, mx] = std::minmax_element(obs.begin(), obs.end(),
                                      [](const auto& a, const auto& b) { return a.loss < b.loss; });
  if (mx->loss - mn->loss <= 1e-12 * std::abs(mx->loss)) {
    throw AnalysisError(fmt::format(
        "family '{}': all {} losses are equal ({}); loss does not vary with compute, so there "
        "is no power law to fit",
        family, obs.size(), mn->loss));
  }
  auto front = SeedFrontiers(obs, final_only);
  if (static_cast<int>(front.size()) < min_frontier) {
    throw AnalysisError(fmt::format(
        "family '{}': no usable frontier: {} point(s) on the lower envelope of loss over "
        "compute (need ≥ {}); loss does not decrease with compute across its runs",
        family, front.size(), min_frontier));
  }
}

double ComputeAt(double E, double log_A, double alpha, double unit, double loss) {
  if (!(loss > E)) return kNaN;
  return unit * std::exp((log_A - std::log(loss - E)) / alpha);
}

}  // namespace moelab::analysis::internal
