// The only translation unit that includes Ceres (its headers are slow to compile).
#include "analysis/fit_engine.h"

#include <ceres/ceres.h>

#include <algorithm>
#include <cmath>
#include <memory>

namespace moelab::analysis::internal {
namespace {

template <int kParams>
struct LogLossResidual {
  LogLossResidual(Form form, double x0, double x1, double log_loss)
      : form(form), x{x0, x1}, log_loss(log_loss) {}
  template <typename T>
  bool operator()(const T* p, T* residual) const {
    residual[0] = PredictLogLoss(form, p, x) - T(log_loss);
    return true;
  }
  Form form;
  double x[2];
  double log_loss;
};

template <int kParams>
SolveResult SolveFixed(const FitData& d, const std::vector<double>& init,
                       const std::vector<double>& lower, const std::vector<double>& upper,
                       double huber_delta, int max_iterations) {
  SolveResult r;
  r.params = init;
  for (int i = 0; i < kParams; ++i) r.params[i] = std::clamp(init[i], lower[i], upper[i]);
  ceres::Problem::Options popts;
  // One HuberLoss shared by all residuals; ScaledLoss wrappers carry bootstrap weights.
  popts.loss_function_ownership = ceres::DO_NOT_TAKE_OWNERSHIP;
  ceres::Problem problem(popts);
  std::vector<std::unique_ptr<ceres::LossFunction>> losses;
  auto huber = std::make_unique<ceres::HuberLoss>(huber_delta);
  for (size_t i = 0; i < d.log_loss.size(); ++i) {
    double w = d.weight.empty() ? 1.0 : d.weight[i];
    if (w <= 0) continue;
    ceres::LossFunction* loss = huber.get();
    if (w != 1.0) {
      losses.push_back(
          std::make_unique<ceres::ScaledLoss>(huber.get(), w, ceres::DO_NOT_TAKE_OWNERSHIP));
      loss = losses.back().get();
    }
    double x1 = d.x1.empty() ? 0.0 : d.x1[i];
    auto* cost = new ceres::AutoDiffCostFunction<LogLossResidual<kParams>, 1, kParams>(
        new LogLossResidual<kParams>(d.form, d.x0[i], x1, d.log_loss[i]));
    problem.AddResidualBlock(cost, loss, r.params.data());
  }
  for (int i = 0; i < kParams; ++i) {
    problem.SetParameterLowerBound(r.params.data(), i, lower[i]);
    problem.SetParameterUpperBound(r.params.data(), i, upper[i]);
  }
  ceres::Solver::Options opts;
  opts.linear_solver_type = ceres::DENSE_QR;
  opts.max_num_iterations = max_iterations;
  // Absolute tolerances far below the objective's scale: with δ = 1e-3 the Huber objective is
  // tiny, and loose tolerances stop early (the failure Epoch found in the Chinchilla fit).
  opts.function_tolerance = 1e-12;
  opts.gradient_tolerance = 1e-16;
  opts.parameter_tolerance = 1e-12;
  opts.num_threads = 1;
  opts.logging_type = ceres::SILENT;
  ceres::Solver::Summary summary;
  ceres::Solve(opts, &problem, &summary);
  r.cost = summary.final_cost;
  r.termination = ceres::TerminationTypeToString(summary.termination_type);
  r.usable = summary.termination_type != ceres::FAILURE && std::isfinite(summary.final_cost);
  for (double v : r.params) r.usable = r.usable && std::isfinite(v);
  return r;
}

}  // namespace

SolveResult Solve(const FitData& data, const std::vector<double>& init,
                  const std::vector<double>& lower, const std::vector<double>& upper,
                  double huber_delta, int max_iterations) {
  switch (NumParams(data.form)) {
    case 3:
      return SolveFixed<3>(data, init, lower, upper, huber_delta, max_iterations);
    case 4:
      return SolveFixed<4>(data, init, lower, upper, huber_delta, max_iterations);
    default:
      return SolveFixed<5>(data, init, lower, upper, huber_delta, max_iterations);
  }
}

}  // namespace moelab::analysis::internal
