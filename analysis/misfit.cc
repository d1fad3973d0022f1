#include "analysis/misfit.h"

#include <fmt/format.h>

#include <cmath>
#include <map>
#include <string>

#include "analysis/fit_common.h"

namespace moelab::analysis {

namespace {

// One-sided level of the runs test. Stricter than the intervals' 5 % tail because every family
// of every fit is tested: at 0.05 one family in twenty would be called misfit by chance.
constexpr double kRunsTestLevel = 0.01;

double LogChoose(int n, int k) {
  if (k < 0 || k > n) return -INFINITY;
  return std::lgamma(n + 1.0) - std::lgamma(k + 1.0) - std::lgamma(n - k + 1.0);
}

// P(R = r) for n1 + n2 exchangeable signs (Swed & Eisenhart 1943).
double RunsPmf(int n1, int n2, int r) {
  const double total = LogChoose(n1 + n2, n1);
  if (r % 2 == 0) {
    const int k = r / 2;
    return 2 * std::exp(LogChoose(n1 - 1, k - 1) + LogChoose(n2 - 1, k - 1) - total);
  }
  const int k = (r - 1) / 2;
  return std::exp(LogChoose(n1 - 1, k) + LogChoose(n2 - 1, k - 1) - total) +
         std::exp(LogChoose(n1 - 1, k - 1) + LogChoose(n2 - 1, k) - total);
}

}  // namespace

double RunsTestLowerP(int positives, int negatives, int runs) {
  if (positives <= 0 || negatives <= 0) return internal::kNaN;
  double p = 0;
  for (int r = 2; r <= runs; ++r) p += RunsPmf(positives, negatives, r);
  return std::min(1.0, p);
}

MisfitCheck CheckPowerLawMisfit(const std::vector<FrontierPoint>& frontier,
                                const std::vector<double>& best, const FitOptions& opt) {
  MisfitCheck m;
  // Mean residual per budget, in compute order. A budget is a run's final compute: the points
  // of one run (all-points frontiers) and the seeds of one budget share it, so residuals that
  // are correlated by construction count once.
  std::map<std::string, double> budget_of_run;
  for (const auto& p : frontier) budget_of_run[p.run] = std::max(budget_of_run[p.run], p.flops);
  std::map<double, std::pair<double, int>> by_budget;
  for (const auto& p : frontier) {
    const double x = std::log(p.flops / opt.flops_unit);
    auto& [sum, n] = by_budget[budget_of_run[p.run]];
    sum += std::log(p.loss) - internal::PredictLogLoss(internal::Form::kPowerLaw, best.data(), &x);
    n++;
  }
  std::vector<double> residuals;
  for (const auto& [budget, sn] : by_budget) residuals.push_back(sn.first / sn.second);
  m.n_budgets = static_cast<int>(residuals.size());
  int prev = 0;
  for (double r : residuals) {
    const int sign = r > 0 ? 1 : (r < 0 ? -1 : 0);
    if (sign == 0) continue;
    (sign > 0 ? m.positives : m.negatives)++;
    if (sign != prev) m.runs++;
    prev = sign;
  }
  m.runs_p = RunsTestLowerP(m.positives, m.negatives, m.runs);

  // Unconstrained E: the lower bound moved far below zero.
  internal::FitData d;
  d.form = internal::Form::kPowerLaw;
  double min_loss = INFINITY;
  for (const auto& p : frontier) {
    d.x0.push_back(std::log(p.flops / opt.flops_unit));
    d.log_loss.push_back(std::log(p.loss));
    d.weight.push_back(1.0);
    min_loss = std::min(min_loss, p.loss);
  }
  const std::vector<double> lo = {-10 * min_loss, -50.0, 0.005}, hi = {min_loss, 50.0, 3.0};
  internal::SolveResult sr = internal::Solve(d, best, lo, hi, opt.huber_delta, opt.max_iterations);
  m.unconstrained_E = sr.usable ? sr.params[0] : internal::kNaN;

  const double alpha_level = kRunsTestLevel;
  const bool e_at_zero = best[0] <= 1e-6 * std::max(1.0, min_loss);
  std::vector<std::string> why;
  if (!std::isnan(m.runs_p) && m.runs_p < alpha_level) {
    why.push_back(fmt::format(
        "the residual signs over {} budgets fall in {} runs (runs test p = {:.3f} < {:.3f}): the "
        "curve bends away from the form",
        m.n_budgets, m.runs, m.runs_p, alpha_level));
  }
  if (e_at_zero && m.unconstrained_E < 0) {
    why.push_back(fmt::format(
        "E sits at its bound 0 and the unconstrained fit puts it at {:.3g} < 0: the local "
        "log-log slopes steepen with compute, the opposite of the form's curvature",
        m.unconstrained_E));
  }
  m.rejected = !why.empty();
  m.reason = fmt::format("{}", fmt::join(why, "; "));
  return m;
}

}  // namespace moelab::analysis
