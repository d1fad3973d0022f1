// Internal: the one place that talks to Ceres. Forms are evaluated by a template shared by the
// Ceres cost functor (Jets) and plain double code, so predictions and fits cannot disagree.
#pragma once

#include <cmath>
#include <string>
#include <vector>

namespace moelab::analysis::internal {

enum class Form {
  kPowerLaw,         // p = [E, log_A, alpha]; x = [log c]
  kSparsityProduct,  // p = [E, log_A, alpha, beta]; x = [log c, log S]
  kClarkLog,         // p = [a, b, c, d]; x = [log c, log S]
  kChinchilla,       // p = [e, a, b, alpha, beta] (E = e^e, A = e^a, B = e^b); x = [log N, log D]
};

inline int NumParams(Form f) {
  switch (f) {
    case Form::kPowerLaw:
      return 3;
    case Form::kSparsityProduct:
    case Form::kClarkLog:
      return 4;
    case Form::kChinchilla:
      return 5;
  }
  return 0;
}

// Predicted log-loss. Written with log/exp found by argument-dependent lookup so Ceres Jets work.
template <typename T>
T PredictLogLoss(Form f, const T* p, const double* x) {
  using std::exp;
  using std::log;
  using std::max;
  switch (f) {
    case Form::kPowerLaw:
      return log(p[0] + exp(p[1] - p[2] * x[0]));
    case Form::kSparsityProduct:
      return log(p[0] + exp(p[1] - p[2] * x[0] - p[3] * x[1]));
    case Form::kClarkLog:
      return p[0] + p[1] * x[0] + p[2] * x[1] + p[3] * x[0] * x[1];
    case Form::kChinchilla: {
      // Log-sum-exp, shifted by the largest term for stability.
      T t0 = p[0], t1 = p[1] - p[3] * x[0], t2 = p[2] - p[4] * x[1];
      T m = t0;
      if (t1 > m) m = t1;
      if (t2 > m) m = t2;
      return m + log(exp(t0 - m) + exp(t1 - m) + exp(t2 - m));
    }
  }
  return T(0);
}

struct FitData {
  Form form = Form::kPowerLaw;
  std::vector<double> x0, x1;  // covariates (x1 unused by the power law)
  std::vector<double> log_loss;
  std::vector<double> weight;  // bootstrap multiplicities
};

struct SolveResult {
  std::vector<double> params;
  double cost = 0;
  bool usable = false;  // finite cost and Ceres did not fail
  std::string termination;
};

SolveResult Solve(const FitData& data, const std::vector<double>& init,
                  const std::vector<double>& lower, const std::vector<double>& upper,
                  double huber_delta, int max_iterations);

}  // namespace moelab::analysis::internal
