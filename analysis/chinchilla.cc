// Chinchilla L(N, D) = E + A/N^α + B/D^β (Hoffmann et al., Approach 3) with the seed-level
// bootstrap, and the compute-optimal allocation it implies.
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <set>

#include "analysis/bootstrap.h"
#include "analysis/fit_common.h"
#include "analysis/scaling.h"

namespace moelab::analysis {

using internal::Bounds;
using internal::Form;
using internal::MakeEstimate;

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
  auto clean = internal::CleanObservations(obs, true, &out.warnings);
  std::set<double> ns, ds;
  // One stratum: the plan keys units by family, so every point is filed under "all".
  std::vector<Observation> keyed = clean;
  for (auto& o : keyed) o.family = "all";
  const internal::ClusterPlan plan = internal::MakeClusterPlan({{"all", keyed}});
  std::vector<int> run_of;
  std::set<std::string> runs;
  for (const auto& o : keyed) {
    ns.insert(o.params);
    ds.insert(o.tokens);
    run_of.push_back(plan.DrawIndex(o));
    runs.insert(o.run);
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
  const int n_runs = static_cast<int>(runs.size());
  const int n_units = plan.units.at("all");
  const std::string too_few = internal::TooFewUnits(
      n_units, internal::UnitsNeeded(plan, opt.min_units), plan.paired_by_seed);
  if (!too_few.empty()) out.warnings.push_back("Chinchilla fit: " + too_few);
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
    double max_e = std::log(internal::MinExpLoss(d));
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
  internal::MultiStartResult ms = internal::MultiStart(data, starts, bounds, opt);
  if (ms.winning_start < 0) throw AnalysisError("Chinchilla fit: every start failed");
  const auto best = ms.best.params;

  const int nb = static_cast<int>(copt.budgets.size());
  // Row: 5 raw params, a, b, then (N, D, L) per budget, then the at-bound flag.
  const int width = 7 + 3 * nb + 1;
  std::vector<std::vector<double>> rows;
  if (too_few.empty()) {
    rows = internal::Bootstrap(
        plan.strata, plan.n_draw, opt.bootstrap_resamples, opt.seed, opt.threads, width,
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
          r.push_back(internal::BoundMask(sr.params, b, 5));
          return r;
        });
  }
  internal::BootstrapDraws bd;
  if (rows.empty()) {
    bd.columns.assign(width - 1, {});
    bd.at_bound.assign(5, 0.0);
  } else {
    bd = internal::SummarizeBootstrap("Chinchilla fit", rows, 5, opt, &out.warnings);
  }
  const auto& col = bd.columns;
  auto exp_col = [](std::vector<double> v) {
    for (double& x : v) x = std::exp(x);
    return v;
  };
  const double level =
      opt.expanded_percentile ? internal::ExpandedLevel(opt.level, n_units) : opt.level;
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
    p.at_bound = internal::AtBound(best[s.raw], bounds.lo[s.raw], bounds.hi[s.raw]);
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
  internal::FillDiagnostics(ms, data, best, static_cast<int>(data.log_loss.size()), n_runs, bd,
                            &out.diagnostics);
  for (const auto& name : out.diagnostics.params_at_bound) {
    out.warnings.push_back(fmt::format("Chinchilla fit: {} sits on its bound", name));
  }
  return out;
}

}  // namespace moelab::analysis
