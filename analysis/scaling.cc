// Frontiers, per-family power laws, multipliers, joint sparsity laws and Chinchilla fits.
#include "analysis/scaling.h"

#include <fmt/format.h>

#include <Eigen/Dense>
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <set>

#include "analysis/bootstrap.h"
#include "analysis/fit_engine.h"

namespace moelab::analysis {

using internal::Form;

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

bool Finite(double v) { return std::isfinite(v); }

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

// Index of runs (in first-seen order) for the resampler.
struct RunIndex {
  std::vector<std::string> names;
  std::map<std::string, int> id;
  int Add(const std::string& run) {
    auto [it, inserted] = id.emplace(run, static_cast<int>(names.size()));
    if (inserted) names.push_back(run);
    return it->second;
  }
};

Estimate MakeEstimate(double point, const std::vector<double>& draws, double level) {
  auto [lo, hi] = internal::PercentileInterval(draws, level);
  return {point, lo, hi};
}

bool AtBound(double v, double lo, double hi) {
  double tol = 1e-6 * std::max(1.0, hi - lo);
  return v - lo <= tol || hi - v <= tol;
}

struct Bounds {
  std::vector<double> lo, hi;
};

// Bit k set when parameter k of `p` sits on its bound: the last column of a bootstrap row.
double BoundMask(const std::vector<double>& p, const Bounds& b, int n_params) {
  uint64_t mask = 0;
  for (int k = 0; k < n_params; ++k) {
    if (AtBound(p[k], b.lo[k], b.hi[k])) mask |= uint64_t{1} << k;
  }
  return static_cast<double>(mask);
}

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

// Multi-start solve: every start is run to convergence and the lowest objective wins.
struct MultiStartResult {
  internal::SolveResult best;
  int winning_start = -1;
  std::vector<double> winning_values;
  int tried = 0;
};

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

// ---- Per-family power law --------------------------------------------------------------

struct WeightedFrontier {
  std::vector<FrontierPoint> points;
  std::vector<double> weights;
};

Bounds PowerLawBounds(double min_loss) { return {{0.0, -50.0, 0.005}, {min_loss, 50.0, 3.0}}; }

internal::FitData PowerLawData(const WeightedFrontier& f, double unit) {
  internal::FitData d;
  d.form = Form::kPowerLaw;
  for (size_t i = 0; i < f.points.size(); ++i) {
    d.x0.push_back(std::log(f.points[i].flops / unit));
    d.log_loss.push_back(std::log(f.points[i].loss));
    d.weight.push_back(f.weights.empty() ? 1.0 : f.weights[i]);
  }
  return d;
}

std::vector<std::vector<double>> PowerLawStarts(const internal::FitData& d, double min_loss) {
  std::vector<std::vector<double>> starts;
  for (double e_frac : {0.0, 0.3, 0.6, 0.9}) {
    for (double alpha : {0.05, 0.15, 0.3, 0.6, 1.0}) {
      double E = e_frac * min_loss;
      starts.push_back({E, AmplitudeFor(d, E, alpha, 0, min_loss), alpha});
    }
  }
  return starts;
}

double MinLoss(const std::vector<FrontierPoint>& pts) {
  double m = std::numeric_limits<double>::infinity();
  for (const auto& p : pts) m = std::min(m, p.loss);
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

// Validates one family and returns its cleaned observations; throws with the family's name.
void CheckFamily(const std::string& family, const std::vector<Observation>& obs, int min_runs,
                 int min_frontier, bool final_only) {
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
  std::set<std::string> runs;
  for (const auto& o : obs) runs.insert(o.run);
  auto front = FrontierOf(obs, final_only);
  if (static_cast<int>(front.size()) < min_frontier) {
    throw AnalysisError(fmt::format(
        "family '{}': no usable frontier: {} point(s) on the lower envelope of loss over "
        "compute (need ≥ {}); loss does not decrease with compute across its runs",
        family, front.size(), min_frontier));
  }
  if (static_cast<int>(runs.size()) < min_runs) {
    throw AnalysisError(fmt::format(
        "family '{}': {} run(s); the bootstrap resamples whole runs and needs at least {}", family,
        runs.size(), min_runs));
  }
}

PowerLawFit FitOneFamily(const std::string& family, const std::vector<Observation>& obs,
                         const FitOptions& opt, std::vector<std::string>* warnings) {
  CheckFamily(family, obs, opt.min_runs, kMinFrontierPoints, opt.final_only);
  PowerLawFit fit;
  fit.family = family;
  fit.flops_unit = opt.flops_unit;
  fit.frontier = FrontierOf(obs, opt.final_only);
  fit.min_flops = fit.frontier.front().flops;
  fit.max_flops = fit.frontier.back().flops;
  fit.min_loss = fit.frontier.back().loss;
  fit.max_loss = fit.frontier.front().loss;

  WeightedFrontier wf{fit.frontier, {}};
  internal::FitData data = PowerLawData(wf, opt.flops_unit);
  double min_loss = fit.min_loss;
  Bounds bounds = PowerLawBounds(min_loss);
  MultiStartResult ms = MultiStart(data, PowerLawStarts(data, min_loss), bounds, opt);
  if (ms.winning_start < 0) {
    throw AnalysisError(fmt::format("family '{}': every start of the fit failed", family));
  }
  const std::vector<double> best = ms.best.params;

  // Bootstrap over runs: resample runs, rebuild the frontier from the drawn runs (each frontier
  // point weighted by how often its run was drawn), refit from the full-data optimum. Paired
  // fits order runs by their final compute (position i = budget i in every family) and share
  // the seed; unpaired fits draw from a per-family stream.
  RunIndex index;
  {
    std::map<std::string, double> final_flops;
    for (const auto& o : obs) final_flops[o.run] = std::max(final_flops[o.run], o.flops);
    std::vector<std::pair<double, std::string>> order;
    for (const auto& o : obs) {
      if (!index.id.count(o.run)) order.push_back({opt.paired ? final_flops[o.run] : 0.0, o.run});
      index.Add(o.run);
    }
    if (opt.paired) {
      std::stable_sort(order.begin(), order.end());
      index = RunIndex();
      for (const auto& [f, run] : order) index.Add(run);
    }
  }
  std::vector<int> run_of;
  for (const auto& o : obs) run_of.push_back(index.id.at(o.run));
  std::vector<int> all(index.names.size());
  std::iota(all.begin(), all.end(), 0);
  const int n_runs = static_cast<int>(index.names.size());
  fit.paired = opt.paired;
  fit.bootstrap_seed = opt.paired ? opt.seed : internal::StreamSeed(opt.seed, family);
  const double full_span = std::log(fit.max_flops / fit.min_flops);
  auto rows = internal::Bootstrap(
      {all}, n_runs, opt.bootstrap_resamples, fit.bootstrap_seed, opt.threads, 4,
      [&](int, const std::vector<int>& counts) -> std::vector<double> {
        std::vector<Observation> sub;
        for (size_t i = 0; i < obs.size(); ++i) {
          if (counts[run_of[i]] > 0) sub.push_back(obs[i]);
        }
        WeightedFrontier f{FrontierOf(sub, opt.final_only), {}};
        if (f.points.size() < 4) return {};
        // A resample whose frontier spans under half the full data's
        // log-compute range has lost the design (whole decades of
        // budgets): its α and E are an extrapolation, not a replicate.
        // Counted as failed, so too few runs are refused, not reported
        // with intervals 10-100x too wide.
        const double span = std::log(f.points.back().flops / f.points.front().flops);
        if (span < opt.min_span_fraction * full_span) return {};
        for (const auto& p : f.points) f.weights.push_back(counts[index.id.at(p.run)]);
        internal::FitData d = PowerLawData(f, opt.flops_unit);
        Bounds b = PowerLawBounds(MinLoss(f.points));
        internal::SolveResult sr =
            internal::Solve(d, best, b.lo, b.hi, opt.huber_delta, opt.max_iterations);
        if (!sr.usable) return {};
        return {sr.params[0], sr.params[1], sr.params[2], BoundMask(sr.params, b, 3)};
      });
  const BootstrapDraws bd =
      SummarizeBootstrap(fmt::format("family '{}'", family), rows, 3, opt, warnings);
  fit.draws.resize(rows.size());
  for (size_t b = 0; b < rows.size(); ++b) fit.draws[b] = {rows[b][0], rows[b][1], rows[b][2]};
  std::vector<double> dA = bd.columns[1];
  for (double& v : dA) v = std::exp(v);
  const int ok = bd.ok, failed = bd.failed;

  const double level =
      opt.expanded_percentile ? internal::ExpandedLevel(opt.level, n_runs) : opt.level;
  const char* names[3] = {"E", "log_A", "alpha"};
  for (int k = 0; k < 3; ++k) {
    ParamEstimate p;
    p.name = names[k];
    p.value = MakeEstimate(best[k], bd.columns[k], level);
    p.lower_bound = bounds.lo[k];
    p.upper_bound = bounds.hi[k];
    p.at_bound = AtBound(best[k], bounds.lo[k], bounds.hi[k]);
    p.resamples_at_bound = bd.at_bound[k];
    if (p.at_bound) fit.diagnostics.params_at_bound.push_back(p.name);
    fit.params.push_back(p);
  }
  ParamEstimate a;
  a.name = "A";
  a.value = MakeEstimate(std::exp(best[1]), dA, level);
  a.lower_bound = std::exp(bounds.lo[1]);
  a.upper_bound = std::exp(bounds.hi[1]);
  a.resamples_at_bound = bd.at_bound[1];
  fit.params.insert(fit.params.begin() + 2, a);
  for (const auto& name : fit.diagnostics.params_at_bound) {
    warnings->push_back(fmt::format("family '{}': fitted {} sits on its bound", family, name));
  }

  auto& dg = fit.diagnostics;
  dg.starts_tried = ms.tried;
  dg.winning_start = ms.winning_start;
  dg.winning_start_values = ms.winning_values;
  dg.cost = ms.best.cost;
  dg.rmse_log = RmseLog(data, best);
  dg.n_points = static_cast<int>(fit.frontier.size());
  dg.n_runs = n_runs;
  dg.resamples_ok = ok;
  dg.resamples_failed = failed;
  return fit;
}

double ComputeAt(double E, double log_A, double alpha, double unit, double loss) {
  if (!(loss > E)) return kNaN;
  return unit * std::exp((log_A - std::log(loss - E)) / alpha);
}

}  // namespace

// ---- PowerLawFit accessors --------------------------------------------------------------

double PowerLawFit::E() const { return params.at(0).value.estimate; }
double PowerLawFit::log_A() const { return params.at(1).value.estimate; }
double PowerLawFit::alpha() const { return params.at(3).value.estimate; }
double PowerLawFit::ComputeAtLoss(double loss) const {
  return ComputeAt(E(), log_A(), alpha(), flops_unit, loss);
}
double PowerLawFit::LossAtCompute(double flops) const {
  return E() + std::exp(log_A() - alpha() * std::log(flops / flops_unit));
}

const PowerLawFit& FamilyFits::Get(const std::string& family) const {
  for (const auto& f : families) {
    if (f.family == family) return f;
  }
  throw AnalysisError(fmt::format("no fitted family '{}'", family));
}

std::vector<FrontierPoint> ComputeFrontier(const std::vector<Observation>& obs, bool final_only) {
  std::vector<std::string> warnings;
  auto clean = CleanObservations(obs, false, &warnings);
  if (clean.empty()) throw AnalysisError("frontier: no finite observations");
  return FrontierOf(clean, final_only);
}

FamilyFits FitFamilies(const std::vector<Observation>& obs, const FitOptions& options) {
  FamilyFits out;
  out.options = options;
  if (options.bootstrap_resamples < 2) {
    throw AnalysisError("bootstrap_resamples must be ≥ 2 (use ≥ 1000 for reported intervals)");
  }
  if (!(options.level > 0 && options.level < 1)) {
    throw AnalysisError("interval level must lie in (0, 1)");
  }
  std::map<std::string, std::vector<Observation>> by_family;
  for (const auto& o : obs) by_family[o.family];  // keeps families whose points all drop
  for (const auto& o : CleanObservations(obs, false, &out.warnings)) {
    by_family[o.family].push_back(o);
  }
  if (by_family.empty()) throw AnalysisError("no observations");
  for (const auto& [family, fobs] : by_family) {
    try {
      out.families.push_back(FitOneFamily(family, fobs, options, &out.warnings));
    } catch (const AnalysisError& e) {
      if (!options.skip_failed_families) throw;
      out.warnings.push_back(fmt::format("skipped: {}", e.what()));
    }
  }
  if (out.families.empty()) {
    throw AnalysisError(fmt::format("no family could be fitted: {}", out.warnings.back()));
  }
  return out;
}

// ---- Multipliers -------------------------------------------------------------------------

Multiplier ComputeMultiplier(const PowerLawFit& f, const PowerLawFit& ref, double target,
                             const MultiplierOptions& opt) {
  Multiplier m;
  m.family = f.family;
  m.reference = ref.family;
  m.target_loss = target;
  // Refusals before estimation leave the numbers NaN (null in JSON), never a misleading 0.
  m.multiplier = m.compute_family = m.compute_reference = {kNaN, kNaN, kNaN};
  for (const PowerLawFit* p : {&f, &ref}) {
    if (!(target > p->E() * (1 + opt.loss_margin))) {
      m.refusal = fmt::format(
          "L* = {:.4g} is not above family '{}''s fitted irreducible loss E = {:.4g} by the "
          "{:.0f}% margin; the law would be extrapolated to (or past) its asymptote",
          target, p->family, p->E(), 100 * opt.loss_margin);
      return m;
    }
    double c = p->ComputeAtLoss(target);
    if (c > p->max_flops * opt.extrapolation_factor ||
        c < p->min_flops / opt.extrapolation_factor) {
      m.refusal = fmt::format(
          "reaching L* = {:.4g} takes {:.3g} FLOPs for family '{}', outside {}x its measured "
          "compute range [{:.3g}, {:.3g}]",
          target, c, p->family, opt.extrapolation_factor, p->min_flops, p->max_flops);
      return m;
    }
  }
  for (const PowerLawFit* p : {&f, &ref}) {
    const ParamEstimate& e = p->params.at(0);
    if (e.at_bound) {
      const std::string what = fmt::format(
          "family '{}''s fitted E = {:.4g} sits on its bound [{:.4g}, {:.4g}]: the asymptote is "
          "not identified by the data, and C(L*) depends on where the bound was put",
          p->family, e.value.estimate, e.lower_bound, e.upper_bound);
      if (!opt.allow_e_at_bound) {
        m.refusal = what + " (allow with --allow-e-at-bound)";
        return m;
      }
      m.flags.push_back(what);
    } else if (e.resamples_at_bound > 0) {
      m.flags.push_back(fmt::format("E of family '{}' is on its bound in {:.1f}% of resamples",
                                    p->family, 100 * e.resamples_at_bound));
    }
  }
  // Paired draws (the same run positions in resample b) only when both fits were drawn that
  // way; otherwise each family's stream is independent and combining draw b with draw b is an
  // independent combination.
  m.paired = f.paired && ref.paired;
  if (m.paired && f.diagnostics.n_runs != ref.diagnostics.n_runs) {
    m.refusal = fmt::format(
        "paired bootstrap needs the same run count in both families ('{}' has {}, '{}' has {})",
        f.family, f.diagnostics.n_runs, ref.family, ref.diagnostics.n_runs);
    return m;
  }
  if (f.paired != ref.paired || (m.paired && f.bootstrap_seed != ref.bootstrap_seed)) {
    m.refusal =
        "one family was fitted with a paired bootstrap and the other not (or with "
        "another seed); refit both the same way";
    return m;
  }
  const size_t n = std::min(f.draws.size(), ref.draws.size());
  std::vector<double> mult, cf, cr;
  int undefined = 0;
  const double inf = std::numeric_limits<double>::infinity();
  for (size_t b = 0; b < n; ++b) {
    const auto& a = f.draws[b];
    const auto& r = ref.draws[b];
    if (std::isnan(a[0]) || std::isnan(r[0])) continue;
    // A resample whose E lies above L* never reaches it: that family's C is infinite.
    double ca = ComputeAt(a[0], a[1], a[2], f.flops_unit, target);
    double cb = ComputeAt(r[0], r[1], r[2], ref.flops_unit, target);
    if (std::isnan(ca) || std::isnan(cb)) undefined++;
    ca = std::isnan(ca) ? inf : ca;
    cb = std::isnan(cb) ? inf : cb;
    cf.push_back(ca);
    cr.push_back(cb);
    mult.push_back(std::isinf(ca) && std::isinf(cb) ? kNaN : ca / cb);
  }
  m.undefined_fraction = cf.empty() ? 1.0 : static_cast<double>(undefined) / cf.size();
  double c_f = f.ComputeAtLoss(target), c_r = ref.ComputeAtLoss(target);
  const int n_runs = std::min(f.diagnostics.n_runs, ref.diagnostics.n_runs);
  const double level =
      opt.expanded_percentile ? internal::ExpandedLevel(opt.level, n_runs) : opt.level;
  m.compute_family = MakeEstimate(c_f, cf, level);
  m.compute_reference = MakeEstimate(c_r, cr, level);
  m.multiplier = MakeEstimate(c_f / c_r, mult, level);
  if (m.undefined_fraction > (1 - level) / 2) {
    m.refusal = fmt::format(
        "in {:.0f}% of bootstrap resamples L* = {:.4g} lies below a fitted E, so the {:.0f}% "
        "interval is unbounded",
        100 * m.undefined_fraction, target, 100 * opt.level);
    return m;
  }
  m.ok = true;
  return m;
}

MultiplierTable ComputeMultiplierTable(const FamilyFits& fits, const std::string& reference,
                                       double target, const MultiplierOptions& opt) {
  MultiplierTable t;
  t.reference = reference;
  t.target_loss = target;
  const PowerLawFit& ref = fits.Get(reference);
  for (const auto& f : fits.families) {
    if (f.family == reference) continue;
    t.rows.push_back(ComputeMultiplier(f, ref, target, opt));
  }
  return t;
}

std::vector<Multiplier> MultiplierCurve(const PowerLawFit& f, const PowerLawFit& ref, int points,
                                        const MultiplierOptions& opt) {
  double lo = std::max(f.min_loss, ref.min_loss);
  double hi = std::min(f.max_loss, ref.max_loss);
  if (!(lo < hi)) {
    throw AnalysisError(fmt::format(
        "families '{}' and '{}' cover disjoint loss ranges ([{:.4g}, {:.4g}] vs [{:.4g}, {:.4g}]); "
        "no common L* to compare at",
        f.family, ref.family, f.min_loss, f.max_loss, ref.min_loss, ref.max_loss));
  }
  if (points < 2) points = 2;
  std::vector<Multiplier> out;
  for (int i = 0; i < points; ++i) {
    double l = lo + (hi - lo) * i / (points - 1);
    out.push_back(ComputeMultiplier(f, ref, l, opt));
  }
  return out;
}

// ---- Joint sparsity laws -----------------------------------------------------------------

namespace {

struct JointPoint {
  int run;
  double x0, x1, log_loss;
  bool held_out;
};

std::vector<JointPoint> JointPoints(const std::map<std::string, std::vector<Observation>>& fams,
                                    const std::map<std::string, double>& sparsity,
                                    const RunIndex& index, const std::vector<int>* counts,
                                    double unit, double holdout_fraction, bool final_only) {
  std::vector<JointPoint> pts;
  for (const auto& [family, fobs] : fams) {
    std::vector<Observation> sub;
    for (const auto& o : fobs) {
      if (!counts || (*counts)[index.id.at(o.run)] > 0) sub.push_back(o);
    }
    if (sub.empty()) continue;
    auto front = FrontierOf(sub, final_only);
    double lmin = std::log(front.front().flops), lmax = std::log(front.back().flops);
    double cut = lmax - holdout_fraction * (lmax - lmin);
    for (const auto& p : front) {
      int reps = counts ? (*counts)[index.id.at(p.run)] : 1;
      for (int r = 0; r < reps; ++r) {
        pts.push_back({index.id.at(p.run), std::log(p.flops / unit), std::log(sparsity.at(family)),
                       std::log(p.loss), holdout_fraction > 0 && std::log(p.flops) > cut + 1e-12});
      }
    }
  }
  return pts;
}

internal::FitData JointData(Form form, const std::vector<JointPoint>& pts, bool train_only) {
  internal::FitData d;
  d.form = form;
  for (const auto& p : pts) {
    if (train_only && p.held_out) continue;
    d.x0.push_back(p.x0);
    d.x1.push_back(p.x1);
    d.log_loss.push_back(p.log_loss);
  }
  return d;
}

Bounds JointBounds(Form form, double min_loss) {
  if (form == Form::kSparsityProduct) return {{0.0, -50, 0.005, -1.0}, {min_loss, 50, 3.0, 3.0}};
  return {{-20, -5, -5, -5}, {20, 5, 5, 5}};
}

std::vector<std::vector<double>> JointStarts(Form form, const internal::FitData& d,
                                             double min_loss) {
  std::vector<std::vector<double>> starts;
  if (form == Form::kSparsityProduct) {
    for (double e_frac : {0.0, 0.3, 0.6, 0.9}) {
      for (double alpha : {0.1, 0.3, 0.6}) {
        for (double beta : {0.0, 0.1, 0.3}) {
          double E = e_frac * min_loss;
          starts.push_back({E, AmplitudeFor(d, E, alpha, beta, min_loss), alpha, beta});
        }
      }
    }
    return starts;
  }
  // The Clark form is linear in its parameters: ordinary least squares is the natural start and
  // the Huber objective is convex, so one start reaches the optimum.
  Eigen::MatrixXd X(d.log_loss.size(), 4);
  Eigen::VectorXd y(d.log_loss.size());
  for (size_t i = 0; i < d.log_loss.size(); ++i) {
    X.row(i) << 1.0, d.x0[i], d.x1[i], d.x0[i] * d.x1[i];
    y(i) = d.log_loss[i];
  }
  Eigen::VectorXd beta = X.colPivHouseholderQr().solve(y);
  starts.push_back({beta(0), beta(1), beta(2), beta(3)});
  return starts;
}

double MinExpLoss(const internal::FitData& d) {
  double m = std::numeric_limits<double>::infinity();
  for (double l : d.log_loss) m = std::min(m, std::exp(l));
  return m;
}

}  // namespace

JointSparsityFit FitJointSparsity(const std::vector<Observation>& obs,
                                  const std::map<std::string, double>& sparsity,
                                  const JointOptions& jopt) {
  const FitOptions& opt = jopt.fit;
  JointSparsityFit out;
  std::map<std::string, std::vector<Observation>> fams;
  for (const auto& o : CleanObservations(obs, false, &out.warnings)) {
    auto it = sparsity.find(o.family);
    if (it == sparsity.end()) {
      throw AnalysisError(fmt::format("joint fit: family '{}' has no sparsity value", o.family));
    }
    if (!(it->second > 0)) {
      throw AnalysisError(fmt::format("joint fit: family '{}' has sparsity {} (must be > 0)",
                                      o.family, it->second));
    }
    fams[o.family].push_back(o);
  }
  if (fams.size() < 2) {
    throw AnalysisError(fmt::format(
        "joint fit: {} family(ies) with data; a sparsity term needs at least 2 sparsities",
        fams.size()));
  }
  RunIndex index;
  std::vector<std::vector<int>> strata;
  for (const auto& [family, fobs] : fams) {
    CheckFamily(family, fobs, opt.min_runs, 2, opt.final_only);
    std::vector<int> s;
    std::set<int> seen;
    for (const auto& o : fobs) {
      int id = index.Add(o.run);
      if (seen.insert(id).second) s.push_back(id);
    }
    strata.push_back(s);
  }
  const int n_runs = static_cast<int>(index.names.size());
  out.holdout_rule = fmt::format(
      "per family, frontier points in the top {:.0f}% of its log-compute range are held out; "
      "forms are refitted on the rest and scored by RMSE of log-loss on the held-out points",
      100 * jopt.holdout_fraction);

  auto all_pts = JointPoints(fams, sparsity, index, nullptr, opt.flops_unit, jopt.holdout_fraction,
                             opt.final_only);
  struct FormSpec {
    Form form;
    const char* name;
    const char* formula;
    std::vector<const char*> params;
  };
  const FormSpec specs[] = {
      {Form::kSparsityProduct,
       "product",
       "L = E + A·(C/unit)^(−alpha)·S^(−beta)",
       {"E", "log_A", "alpha", "beta"}},
      {Form::kClarkLog,
       "clark",
       "log L = a + b·log(C/unit) + c·log S + d·log(C/unit)·log S",
       {"a", "b", "c", "d"}},
  };
  double best_rmse = std::numeric_limits<double>::infinity();
  for (const auto& spec : specs) {
    JointFormFit jf;
    jf.form = spec.name;
    jf.formula = spec.formula;
    const int np = internal::NumParams(spec.form);
    // Held-out score.
    internal::FitData train = JointData(spec.form, all_pts, true);
    if (train.log_loss.size() < static_cast<size_t>(np) + 1) {
      throw AnalysisError(fmt::format("joint fit: {} training points for {} parameters",
                                      train.log_loss.size(), np));
    }
    double tmin = MinExpLoss(train);
    MultiStartResult hs =
        MultiStart(train, JointStarts(spec.form, train, tmin), JointBounds(spec.form, tmin), opt);
    if (hs.winning_start < 0) {
      throw AnalysisError(
          fmt::format("joint fit '{}': every start failed on the training points", spec.name));
    }
    double se = 0, ae = 0;
    for (const auto& p : all_pts) {
      if (!p.held_out) continue;
      double x[2] = {p.x0, p.x1};
      double r = internal::PredictLogLoss(spec.form, hs.best.params.data(), x) - p.log_loss;
      se += r * r;
      ae += std::abs(r);
      jf.holdout_points++;
    }
    jf.holdout_rmse_log = jf.holdout_points ? std::sqrt(se / jf.holdout_points) : kNaN;
    jf.holdout_mae_log = jf.holdout_points ? ae / jf.holdout_points : kNaN;

    // Full-data fit with a bootstrap over runs, stratified by family.
    internal::FitData full = JointData(spec.form, all_pts, false);
    double fmin = MinExpLoss(full);
    Bounds bounds = JointBounds(spec.form, fmin);
    MultiStartResult ms = MultiStart(full, JointStarts(spec.form, full, fmin), bounds, opt);
    if (ms.winning_start < 0) {
      throw AnalysisError(fmt::format("joint fit '{}': every start failed", spec.name));
    }
    const auto best = ms.best.params;
    auto rows = internal::Bootstrap(
        strata, n_runs, opt.bootstrap_resamples, opt.seed, opt.threads, np + 1,
        [&](int, const std::vector<int>& counts) -> std::vector<double> {
          auto pts =
              JointPoints(fams, sparsity, index, &counts, opt.flops_unit, 0.0, opt.final_only);
          internal::FitData d = JointData(spec.form, pts, false);
          if (d.log_loss.size() < static_cast<size_t>(np) + 1) return {};
          Bounds b = JointBounds(spec.form, MinExpLoss(d));
          auto sr = internal::Solve(d, best, b.lo, b.hi, opt.huber_delta, opt.max_iterations);
          if (!sr.usable) return {};
          auto r = sr.params;
          r.push_back(BoundMask(sr.params, b, np));
          return r;
        });
    const BootstrapDraws bd =
        SummarizeBootstrap(fmt::format("joint fit '{}'", spec.name), rows, np, opt, &out.warnings);
    const int ok = bd.ok, failed = bd.failed;
    const auto& draws = bd.columns;
    size_t smallest = strata.front().size();
    for (const auto& st : strata) smallest = std::min(smallest, st.size());
    const double level = opt.expanded_percentile
                             ? internal::ExpandedLevel(opt.level, static_cast<int>(smallest))
                             : opt.level;
    for (int k = 0; k < np; ++k) {
      ParamEstimate p;
      p.name = spec.params[k];
      p.value = MakeEstimate(best[k], draws[k], level);
      p.lower_bound = bounds.lo[k];
      p.upper_bound = bounds.hi[k];
      p.at_bound = AtBound(best[k], bounds.lo[k], bounds.hi[k]);
      p.resamples_at_bound = bd.at_bound[k];
      if (p.at_bound) jf.diagnostics.params_at_bound.push_back(p.name);
      jf.params.push_back(p);
    }
    auto& dg = jf.diagnostics;
    dg.starts_tried = ms.tried;
    dg.winning_start = ms.winning_start;
    dg.winning_start_values = ms.winning_values;
    dg.cost = ms.best.cost;
    dg.rmse_log = RmseLog(full, best);
    dg.n_points = static_cast<int>(full.log_loss.size());
    dg.n_runs = n_runs;
    dg.resamples_ok = ok;
    dg.resamples_failed = failed;
    if (jf.holdout_rmse_log < best_rmse) {
      best_rmse = jf.holdout_rmse_log;
      out.better_form = jf.form;
    }
    out.forms.push_back(std::move(jf));
  }
  return out;
}

// ---- Chinchilla ----------------------------------------------------------------------------

namespace {

struct ChinchillaDerived {
  double E, A, B, alpha, beta, a_exp, b_exp;
};

ChinchillaDerived Derive(const std::vector<double>& p) {
  ChinchillaDerived d;
  d.E = std::exp(p[0]);
  d.A = std::exp(p[1]);
  d.B = std::exp(p[2]);
  d.alpha = p[3];
  d.beta = p[4];
  d.a_exp = d.beta / (d.alpha + d.beta);
  d.b_exp = d.alpha / (d.alpha + d.beta);
  return d;
}

// Compute-optimal N, D and loss at budget C under C = k·N·D (Hoffmann et al. eq. 4).
std::array<double, 3> Optimal(const std::vector<double>& p, double flops, double k) {
  ChinchillaDerived d = Derive(p);
  // G = (αA/(βB))^(1/(α+β)), computed in logs because A and B can be e^20.
  double log_g = (std::log(d.alpha) + p[1] - std::log(d.beta) - p[2]) / (d.alpha + d.beta);
  double log_c = std::log(flops / k);
  double n = std::exp(log_g + d.a_exp * log_c);
  double dd = std::exp(-log_g + d.b_exp * log_c);
  double x[2] = {std::log(n), std::log(dd)};
  double loss = std::exp(internal::PredictLogLoss(Form::kChinchilla, p.data(), x));
  return {n, dd, loss};
}

}  // namespace

ChinchillaFit FitChinchilla(const std::vector<Observation>& obs, const ChinchillaOptions& copt) {
  const FitOptions& opt = copt.fit;
  ChinchillaFit out;
  out.flops_per_param_token = copt.flops_per_param_token;
  auto clean = CleanObservations(obs, true, &out.warnings);
  std::set<double> ns, ds;
  RunIndex index;
  std::vector<int> run_of;
  for (const auto& o : clean) {
    ns.insert(o.params);
    ds.insert(o.tokens);
    run_of.push_back(index.Add(o.run));
  }
  if (clean.size() < 6) {
    throw AnalysisError(fmt::format(
        "Chinchilla fit: {} usable point(s); L(N, D) has 5 parameters, need ≥ 6", clean.size()));
  }
  if (ns.size() < 2 || ds.size() < 2) {
    throw AnalysisError(fmt::format(
        "Chinchilla fit: {} distinct model size(s) and {} distinct token count(s); need a grid "
        "with ≥ 2 of each to separate A/N^α from B/D^β",
        ns.size(), ds.size()));
  }
  const int n_runs = static_cast<int>(index.names.size());
  if (n_runs < opt.min_runs) {
    throw AnalysisError(
        fmt::format("Chinchilla fit: {} run(s); the bootstrap resamples whole runs and needs ≥ {}",
                    n_runs, opt.min_runs));
  }
  auto make_data = [&](const std::vector<int>* counts) {
    internal::FitData d;
    d.form = Form::kChinchilla;
    for (size_t i = 0; i < clean.size(); ++i) {
      double w = counts ? (*counts)[run_of[i]] : 1;
      if (w <= 0) continue;
      d.x0.push_back(std::log(clean[i].params));
      d.x1.push_back(std::log(clean[i].tokens));
      d.log_loss.push_back(std::log(clean[i].loss));
      d.weight.push_back(w);
    }
    return d;
  };
  auto bounds_for = [](const internal::FitData& d) {
    double max_e = std::log(MinExpLoss(d));
    return Bounds{{-10, -20, -20, 0.01, 0.01}, {max_e, 80, 80, 3, 3}};
  };
  internal::FitData data = make_data(nullptr);
  Bounds bounds = bounds_for(data);
  std::vector<std::vector<double>> starts;
  for (double e : copt.grid_e)
    for (double a : copt.grid_log_a)
      for (double b : copt.grid_log_b)
        for (double al : copt.grid_alpha)
          for (double be : copt.grid_beta) starts.push_back({e, a, b, al, be});
  MultiStartResult ms = MultiStart(data, starts, bounds, opt);
  if (ms.winning_start < 0) throw AnalysisError("Chinchilla fit: every start failed");
  const auto best = ms.best.params;

  std::vector<int> all(n_runs);
  std::iota(all.begin(), all.end(), 0);
  const int nb = static_cast<int>(copt.budgets.size());
  // Row: 5 raw params, a, b, then (N, D, L) per budget, then the at-bound flag.
  const int width = 7 + 3 * nb + 1;
  auto rows = internal::Bootstrap(
      {all}, n_runs, opt.bootstrap_resamples, opt.seed, opt.threads, width,
      [&](int, const std::vector<int>& counts) -> std::vector<double> {
        internal::FitData d = make_data(&counts);
        Bounds b = bounds_for(d);
        auto sr = internal::Solve(d, best, b.lo, b.hi, opt.huber_delta, opt.max_iterations);
        if (!sr.usable) return {};
        std::vector<double> r = sr.params;
        ChinchillaDerived dv = Derive(sr.params);
        r.push_back(dv.a_exp);
        r.push_back(dv.b_exp);
        for (double c : copt.budgets) {
          auto o = Optimal(sr.params, c, copt.flops_per_param_token);
          r.insert(r.end(), o.begin(), o.end());
        }
        r.push_back(BoundMask(sr.params, b, 5));
        return r;
      });
  const BootstrapDraws bd = SummarizeBootstrap("Chinchilla fit", rows, 5, opt, &out.warnings);
  const int ok = bd.ok, failed = bd.failed;
  const auto& col = bd.columns;
  auto exp_col = [](std::vector<double> v) {
    for (double& x : v) x = std::exp(x);
    return v;
  };
  const double level =
      opt.expanded_percentile ? internal::ExpandedLevel(opt.level, n_runs) : opt.level;
  ChinchillaDerived dv = Derive(best);
  struct Spec {
    const char* name;
    double point;
    std::vector<double> draws;
    int raw;
  };
  const Spec specs[] = {
      {"E", dv.E, exp_col(col[0]), 0}, {"A", dv.A, exp_col(col[1]), 1},
      {"B", dv.B, exp_col(col[2]), 2}, {"alpha", dv.alpha, col[3], 3},
      {"beta", dv.beta, col[4], 4},    {"log_E", best[0], col[0], 0},
      {"log_A", best[1], col[1], 1},   {"log_B", best[2], col[2], 2},
  };
  for (const auto& s : specs) {
    ParamEstimate p;
    p.name = s.name;
    p.value = MakeEstimate(s.point, s.draws, level);
    bool exp_scale = s.name[0] != 'l' && s.raw < 3;
    p.lower_bound = exp_scale ? std::exp(bounds.lo[s.raw]) : bounds.lo[s.raw];
    p.upper_bound = exp_scale ? std::exp(bounds.hi[s.raw]) : bounds.hi[s.raw];
    p.at_bound = AtBound(best[s.raw], bounds.lo[s.raw], bounds.hi[s.raw]);
    p.resamples_at_bound = bd.at_bound[s.raw];
    if (p.at_bound && std::string(s.name).rfind("log_", 0) != 0) {
      out.diagnostics.params_at_bound.push_back(p.name);
    }
    out.params.push_back(p);
  }
  out.exponent_n = MakeEstimate(dv.a_exp, col[5], level);
  out.exponent_d = MakeEstimate(dv.b_exp, col[6], level);
  for (int i = 0; i < nb; ++i) {
    auto o = Optimal(best, copt.budgets[i], copt.flops_per_param_token);
    ComputeOptimal co;
    co.flops = copt.budgets[i];
    co.params = MakeEstimate(o[0], col[7 + 3 * i], level);
    co.tokens = MakeEstimate(o[1], col[8 + 3 * i], level);
    co.loss = MakeEstimate(o[2], col[9 + 3 * i], level);
    out.optimal.push_back(co);
  }
  auto& dg = out.diagnostics;
  dg.starts_tried = ms.tried;
  dg.winning_start = ms.winning_start;
  dg.winning_start_values = ms.winning_values;
  dg.cost = ms.best.cost;
  dg.rmse_log = RmseLog(data, best);
  dg.n_points = static_cast<int>(data.log_loss.size());
  dg.n_runs = n_runs;
  dg.resamples_ok = ok;
  dg.resamples_failed = failed;
  for (const auto& name : dg.params_at_bound) {
    out.warnings.push_back(fmt::format("Chinchilla fit: {} sits on its bound", name));
  }
  return out;
}

}  // namespace moelab::analysis
