// Joint sparsity laws over all families' frontiers: L = E + A·C^−α·S^−β and the log-quadratic
// (Clark et al.) form, with a held-out comparison and the seed-level bootstrap.
#include <fmt/format.h>

#include <Eigen/Dense>
#include <algorithm>
#include <cmath>
#include <limits>
#include <set>

#include "analysis/bootstrap.h"
#include "analysis/fit_common.h"
#include "analysis/scaling.h"

namespace moelab::analysis {

using internal::Bounds;
using internal::Form;
using internal::kNaN;
using internal::MinExpLoss;
using internal::MultiStart;
using internal::MultiStartResult;

namespace {

struct JointPoint {
  int run;
  double x0, x1, log_loss;
  bool held_out;
};

std::vector<JointPoint> JointPoints(const std::map<std::string, std::vector<Observation>>& fams,
                                    const std::map<std::string, double>& sparsity,
                                    const std::map<std::string, int>& draw_of_run,
                                    const std::vector<int>* counts, double unit,
                                    double holdout_fraction, bool final_only) {
  std::vector<JointPoint> pts;
  for (const auto& [family, fobs] : fams) {
    std::vector<Observation> sub;
    for (const auto& o : fobs) {
      if (!counts || (*counts)[draw_of_run.at(o.run)] > 0) sub.push_back(o);
    }
    if (sub.empty()) continue;
    auto front = internal::SeedFrontiers(sub, final_only);
    double lmin = std::log(front.front().flops), lmax = std::log(front.back().flops);
    double cut = lmax - holdout_fraction * (lmax - lmin);
    for (const auto& p : front) {
      int reps = counts ? (*counts)[draw_of_run.at(p.run)] : 1;
      for (int r = 0; r < reps; ++r) {
        pts.push_back({draw_of_run.at(p.run), std::log(p.flops / unit),
                       std::log(sparsity.at(family)), std::log(p.loss),
                       holdout_fraction > 0 && std::log(p.flops) > cut + 1e-12});
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
          starts.push_back({E, internal::AmplitudeFor(d, E, alpha, beta, min_loss), alpha, beta});
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

}  // namespace

JointSparsityFit FitJointSparsity(const std::vector<Observation>& obs,
                                  const std::map<std::string, double>& sparsity,
                                  const JointOptions& jopt) {
  const FitOptions& opt = jopt.fit;
  JointSparsityFit out;
  std::map<std::string, std::vector<Observation>> fams;
  for (const auto& o : internal::CleanObservations(obs, false, &out.warnings)) {
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
  for (const auto& [family, fobs] : fams) internal::CheckFamily(family, fobs, 2, opt.final_only);
  const internal::ClusterPlan plan = internal::MakeClusterPlan(fams);
  std::map<std::string, int> draw_of_run;
  std::set<std::string> runs;
  int fewest_units = std::numeric_limits<int>::max();
  for (const auto& [family, fobs] : fams) {
    for (const auto& o : fobs) draw_of_run[o.run] = plan.DrawIndex(o), runs.insert(o.run);
    fewest_units = std::min(fewest_units, plan.units.at(family));
  }
  const int n_runs = static_cast<int>(runs.size());
  const std::string too_few = internal::TooFewUnits(
      fewest_units, internal::UnitsNeeded(plan, opt.min_units), plan.paired_by_seed);
  if (!too_few.empty()) out.warnings.push_back("joint fit: " + too_few);
  out.holdout_rule = fmt::format(
      "per family, frontier points in the top {:.0f}% of its log-compute range are held out; "
      "forms are refitted on the rest and scored by RMSE of log-loss on the held-out points",
      100 * jopt.holdout_fraction);

  auto all_pts = JointPoints(fams, sparsity, draw_of_run, nullptr, opt.flops_unit,
                             jopt.holdout_fraction, opt.final_only);
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
    std::vector<std::vector<double>> rows;
    if (too_few.empty()) {
      rows = internal::Bootstrap(
          plan.strata, plan.n_draw, opt.bootstrap_resamples, opt.seed, opt.threads, np + 1,
          [&](int, const std::vector<int>& counts) -> std::vector<double> {
            auto pts = JointPoints(fams, sparsity, draw_of_run, &counts, opt.flops_unit, 0.0,
                                   opt.final_only);
            internal::FitData d = JointData(spec.form, pts, false);
            if (d.log_loss.size() < static_cast<size_t>(np) + 1) return {};
            Bounds b = JointBounds(spec.form, MinExpLoss(d));
            auto sr = internal::Solve(d, best, b.lo, b.hi, opt.huber_delta, opt.max_iterations);
            if (!sr.usable) return {};
            auto r = sr.params;
            r.push_back(internal::BoundMask(sr.params, b, np));
            return r;
          });
    }
    internal::BootstrapDraws bd;
    if (rows.empty()) {
      bd.columns.assign(np, {});
      bd.at_bound.assign(np, 0.0);
    } else {
      bd = internal::SummarizeBootstrap(fmt::format("joint fit '{}'", spec.name), rows, np, opt,
                                        &out.warnings);
    }
    const double level =
        opt.expanded_percentile ? internal::ExpandedLevel(opt.level, fewest_units) : opt.level;
    for (int k = 0; k < np; ++k) {
      ParamEstimate p = internal::RawParamEstimate(spec.params[k], best, k, bd, bounds, level);
      if (p.at_bound) jf.diagnostics.params_at_bound.push_back(p.name);
      jf.params.push_back(p);
    }
    internal::FillDiagnostics(ms, full, best, static_cast<int>(full.log_loss.size()), n_runs, bd,
                              &jf.diagnostics);
    if (jf.holdout_rmse_log < best_rmse) {
      best_rmse = jf.holdout_rmse_log;
      out.better_form = jf.form;
    }
    out.forms.push_back(std::move(jf));
  }
  return out;
}

}  // namespace moelab::analysis
