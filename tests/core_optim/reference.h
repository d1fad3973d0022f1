// Straightforward double-precision reference optimizers for the tests: written from the
// equations with plain loops and Eigen, sharing no code with the implementations.
#pragma once

#include <Eigen/Dense>
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "core/config.h"
#include "core/model/model.h"

namespace moelab::testing {

using MatD = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

inline bool ReferenceNoDecay(const OptimizerConfig& c, const ParamInfo& p) {
  return std::find(c.no_decay.begin(), c.no_decay.end(), ParamKindName(p.kind)) != c.no_decay.end();
}

// Keller Jordan's zeropower_via_newtonschulz5, in double with full products.
inline MatD ReferenceNs5(MatD x, int steps) {
  const bool tall = x.rows() > x.cols();
  if (tall) x.transposeInPlace();
  x /= (x.norm() + 1e-7);
  for (int s = 0; s < steps; ++s) {
    const MatD a = x * x.transpose();
    const MatD b = -4.7750 * a + 2.0315 * a * a;
    x = 3.4445 * x + b * x;
  }
  if (tall) x.transposeInPlace();
  return x;
}

// AdamW on one tensor, textbook form with explicit bias correction.
struct ReferenceAdamW {
  std::vector<double> m, v;
  void Step(const OptimizerConfig& c, bool decay, double* w, const double* g, size_t n, double lr,
            int64_t t) {
    if (m.empty()) m.assign(n, 0.0), v.assign(n, 0.0);
    for (size_t i = 0; i < n; ++i) {
      m[i] = c.beta1 * m[i] + (1 - c.beta1) * g[i];
      v[i] = c.beta2 * v[i] + (1 - c.beta2) * g[i] * g[i];
      const double mhat = m[i] / (1 - std::pow(c.beta1, t));
      const double vhat = v[i] / (1 - std::pow(c.beta2, t));
      w[i] = w[i] - lr * (mhat / (std::sqrt(vhat) + c.eps) + (decay ? c.weight_decay : 0.0) * w[i]);
    }
  }
};

// Muon + AdamW over a whole parameter list, each matrix of a stacked tensor on its own.
struct ReferenceMuon {
  OptimizerConfig c;
  std::vector<ParamInfo> params;
  std::vector<std::vector<double>> momentum;
  std::vector<ReferenceAdamW> adam;

  ReferenceMuon(const OptimizerConfig& config, const std::vector<ParamInfo>& p)
      : c(config), params(p), momentum(p.size()), adam(p.size()) {}

  void Step(double* w, const double* g, double lr, int64_t t) {
    for (size_t pi = 0; pi < params.size(); ++pi) {
      const ParamInfo& p = params[pi];
      double* wp = w + p.offset;
      const double* gp = g + p.offset;
      if (!p.is_hidden_matrix()) {
        adam[pi].Step(c, !ReferenceNoDecay(c, p), wp, gp, p.size(), lr, t);
        continue;
      }
      auto& mom = momentum[pi];
      if (mom.empty()) mom.assign(p.size(), 0.0);
      const double s = c.muon_scale == "rms_match"
                           ? 0.2 * std::sqrt(double(std::max(p.rows, p.cols)))
                           : std::sqrt(std::max(1.0, double(p.rows) / p.cols));
      const size_t e = static_cast<size_t>(p.rows) * p.cols;
      for (int b = 0; b < p.batch; ++b) {
        MatD u(p.rows, p.cols);
        for (size_t i = 0; i < e; ++i) {
          double& m = mom[b * e + i];
          m = c.muon_momentum * m + gp[b * e + i];
          u.data()[i] = c.muon_nesterov ? gp[b * e + i] + c.muon_momentum * m : m;
        }
        const MatD o = ReferenceNs5(u, c.muon_ns_steps);
        for (size_t i = 0; i < e; ++i) {
          double& x = wp[b * e + i];
          x = x - lr * (s * o.data()[i] + c.weight_decay * x);
        }
      }
    }
  }
};

}  // namespace moelab::testing
