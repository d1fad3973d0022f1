// Per-family power laws L(C) = E + A·(C/unit)^(−α) on the compute frontier, with a seed-level
// (cluster) bootstrap and the misfit checks of analysis/misfit.h.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <set>

#include "analysis/bootstrap.h"
#include "analysis/fit_common.h"
#include "analysis/misfit.h"
#include "analysis/scaling.h"

namespace moelab::analysis {

using internal::Bounds;
using internal::Form;
using internal::kNaN;

namespace {

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
      starts.push_back({E, internal::AmplitudeFor(d, E, alpha, 0, min_loss), alpha});
    }
  }
  return starts;
}

PowerLawFit FitOneFamily(const std::string& family, const std::vector<Observation>& obs,
                         const internal::ClusterPlan& plan, const FitOptions& opt,
                         std::vector<std::string>* warnings) {
  internal::CheckFamily(family, obs, kMinFrontierPoints, opt.final_only);
  PowerLawFit fit;
  fit.family = family;
  fit.flops_unit = opt.flops_unit;
  fit.frontier = internal::SeedFrontiers(obs, opt.final_only);
  fit.min_flops = fit.frontier.front().flops;
  fit.max_flops = fit.frontier.back().flops;
  fit.min_loss = internal::MinLoss(fit.frontier);
  fit.max_loss = fit.min_loss;
  for (const auto& p : fit.frontier) fit.max_loss = std::max(fit.max_loss, p.loss);

  WeightedFrontier wf{fit.frontier, {}};
  internal::FitData data = PowerLawData(wf, opt.flops_unit);
  const double min_loss = fit.min_loss;
  Bounds bounds = PowerLawBounds(min_loss);
  internal::MultiStartResult ms =
      internal::MultiStart(data, PowerLawStarts(data, min_loss), bounds, opt);
  if (ms.winning_start < 0) {
    throw AnalysisError(fmt::format("family '{}': every start of the fit failed", family));
  }
  const std::vector<double> best = ms.best.params;
  fit.misfit = CheckPowerLawMisfit(fit.frontier, best, opt);

  // Seed-level bootstrap: resample b draws trunks (a seed's run with its WSD branches), never
  // runs, since branches of one trunk share its noise; every family draws the same seeds when
  // the plan pairs them. Each seed's frontier points carry its draw count as their weight.
  const int n_units = plan.units.at(family);
  fit.n_units = n_units;
  fit.paired = plan.paired_by_seed;
  fit.bootstrap_seed = plan.paired_by_seed ? opt.seed : internal::StreamSeed(opt.seed, family);
  fit.interval_note = internal::TooFewUnits(n_units, internal::UnitsNeeded(plan, opt.min_units),
                                            plan.paired_by_seed);
  std::map<std::string, int> draw_of_run;
  for (const auto& o : obs) draw_of_run[o.run] = plan.DrawIndex(o);
  const double full_span = std::log(fit.max_flops / fit.min_flops);
  std::vector<std::vector<double>> rows;
  if (fit.interval_note.empty()) {
    rows = internal::Bootstrap(
        plan.strata, plan.n_draw, opt.bootstrap_resamples, fit.bootstrap_seed, opt.threads, 4,
        [&](int, const std::vector<int>& counts) -> std::vector<double> {
          std::vector<Observation> sub;
          for (const auto& o : obs) {
            if (counts[draw_of_run.at(o.run)] > 0) sub.push_back(o);
          }
          if (sub.empty()) return {};
          WeightedFrontier f{internal::SeedFrontiers(sub, opt.final_only), {}};
          if (f.points.size() < 4) return {};
          // A resample whose frontier spans under half the full data's log-compute range has
          // lost the design (whole decades of budgets): counted as failed, not reported.
          const double span = std::log(f.points.back().flops / f.points.front().flops);
          if (span < opt.min_span_fraction * full_span) return {};
          for (const auto& p : f.points) f.weights.push_back(counts[draw_of_run.at(p.run)]);
          internal::FitData d = PowerLawData(f, opt.flops_unit);
          Bounds b = PowerLawBounds(internal::MinLoss(f.points));
          internal::SolveResult sr =
              internal::Solve(d, best, b.lo, b.hi, opt.huber_delta, opt.max_iterations);
          if (!sr.usable) return {};
          return {sr.params[0], sr.params[1], sr.params[2], internal::BoundMask(sr.params, b, 3)};
        });
  }
  internal::BootstrapDraws bd;
  if (!rows.empty()) {
    bd = internal::SummarizeBootstrap(fmt::format("family '{}'", family), rows, 3, opt, warnings);
    fit.draws.resize(rows.size());
    for (size_t b = 0; b < rows.size(); ++b) fit.draws[b] = {rows[b][0], rows[b][1], rows[b][2]};
  } else {
    bd.columns.assign(3, {});
    bd.at_bound.assign(3, 0.0);
  }
  std::vector<double> dA = bd.columns[1];
  for (double& v : dA) v = std::exp(v);

  const double level =
      opt.expanded_percentile ? internal::ExpandedLevel(opt.level, n_units) : opt.level;
  const char* names[3] = {"E", "log_A", "alpha"};
  for (int k = 0; k < 3; ++k) {
    ParamEstimate p = internal::RawParamEstimate(names[k], best, k, bd, bounds, level);
    if (p.at_bound) fit.diagnostics.params_at_bound.push_back(p.name);
    fit.params.push_back(p);
  }
  ParamEstimate a;
  a.name = "A";
  a.value = internal::MakeEstimate(std::exp(best[1]), dA, level);
  a.lower_bound = std::exp(bounds.lo[1]);
  a.upper_bound = std::exp(bounds.hi[1]);
  a.resamples_at_bound = bd.at_bound[1];
  fit.params.insert(fit.params.begin() + 2, a);
  for (const auto& name : fit.diagnostics.params_at_bound) {
    warnings->push_back(fmt::format("family '{}': fitted {} sits on its bound", family, name));
  }
  if (fit.misfit.rejected) {
    warnings->push_back(
        fmt::format("family '{}': the power-law form is rejected: {}", family, fit.misfit.reason));
  }

  std::set<std::string> runs;
  for (const auto& o : obs) runs.insert(o.run);
  internal::FillDiagnostics(ms, data, best, static_cast<int>(fit.frontier.size()),
                            static_cast<int>(runs.size()), bd, &fit.diagnostics);
  return fit;
}

}  // namespace

double PowerLawFit::E() const { return params.at(0).value.estimate; }
double PowerLawFit::log_A() const { return params.at(1).value.estimate; }
double PowerLawFit::alpha() const { return params.at(3).value.estimate; }
double PowerLawFit::ComputeAtLoss(double loss) const {
  return internal::ComputeAt(E(), log_A(), alpha(), flops_unit, loss);
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
  auto clean = internal::CleanObservations(obs, false, &warnings);
  if (clean.empty()) throw AnalysisError("frontier: no finite observations");
  return internal::FrontierOf(clean, final_only);
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
  for (const auto& o : internal::CleanObservations(obs, false, &out.warnings)) {
    by_family[o.family].push_back(o);
  }
  if (by_family.empty()) throw AnalysisError("no observations");
  std::map<std::string, std::vector<Observation>> usable;
  for (const auto& [family, fobs] : by_family) {
    if (!fobs.empty()) usable[family] = fobs;
  }
  const internal::ClusterPlan plan = internal::MakeClusterPlan(usable);
  for (const auto& [family, fobs] : by_family) {
    try {
      if (fobs.empty()) internal::CheckFamily(family, fobs, kMinFrontierPoints, options.final_only);
      out.families.push_back(FitOneFamily(family, fobs, plan, options, &out.warnings));
    } catch (const AnalysisError& e) {
      if (!options.skip_failed_families) throw;
      out.warnings.push_back(fmt::format("skipped: {}", e.what()));
    }
  }
  if (out.families.empty()) {
    // Every family failed: name each one and why, not only the last.
    std::vector<std::string> reasons;
    for (const std::string& w : out.warnings)
      if (w.rfind("skipped: ", 0) == 0) reasons.push_back(w.substr(9));
    throw AnalysisError(fmt::format("no family could be fitted ({} of {}):\n  {}", reasons.size(),
                                    by_family.size(), fmt::join(reasons, "\n  ")));
  }
  return out;
}

}  // namespace moelab::analysis
