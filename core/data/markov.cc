#include "core/data/markov.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>

#include "core/data/random.h"

namespace moelab {
namespace {

// Index of the first cdf entry > u (clamped: rounding may leave the last entry just below 1).
int64_t InverseCdf(const double* cdf, int64_t n, double u) {
  int64_t i = std::upper_bound(cdf, cdf + n, u) - cdf;
  return std::min(i, n - 1);
}

}  // namespace

MarkovChain::MarkovChain(const MarkovOptions& options) : opt_(options) {
  const int v = opt_.vocab_size;
  if (v < 2 || v > 65536) {
    throw std::runtime_error(
        fmt::format("markov source: vocab_size {} must be between 2 and 65536", v));
  }
  if (opt_.order < 1) {
    throw std::runtime_error(fmt::format("data.markov_order {} must be >= 1", opt_.order));
  }
  if (!(opt_.concentration > 0.0) || !std::isfinite(opt_.concentration)) {
    throw std::runtime_error(
        fmt::format("data.markov_concentration {} must be > 0", opt_.concentration));
  }
  // vocab^(order+1) transition probabilities, checked without overflow.
  double entries = std::pow(static_cast<double>(v), opt_.order + 1);
  if (entries > static_cast<double>(kMaxEntries)) {
    throw std::runtime_error(fmt::format(
        "markov source: order {} over vocab {} needs {:.3g} transition probabilities (vocab^"
        "(order+1)); the limit is {} — lower data.markov_order or model.vocab_size",
        opt_.order, v, entries, kMaxEntries));
  }
  num_states_ = 1;
  for (int i = 0; i < opt_.order; ++i) num_states_ *= v;
  const int64_t n = num_states_ * v;

  // Rows ~ Dirichlet(alpha): normalised Gamma(alpha) variates, combined in log space.
  prob_.resize(n);
  cdf_.resize(n);
  data::Rng rng(data::HashCombine(opt_.seed, 0x6d61726b6f76ULL));
  std::vector<double> logg(v);
  for (int64_t s = 0; s < num_states_; ++s) {
    double mx = -std::numeric_limits<double>::infinity();
    for (int x = 0; x < v; ++x) {
      logg[x] = rng.LogGamma(opt_.concentration);
      mx = std::max(mx, logg[x]);
    }
    double sum = 0.0;
    for (int x = 0; x < v; ++x) sum += std::exp(logg[x] - mx);
    double* p = &prob_[s * v];
    double* c = &cdf_[s * v];
    double acc = 0.0;
    for (int x = 0; x < v; ++x) {
      p[x] = std::exp(logg[x] - mx) / sum;
      acc += p[x];
      c[x] = acc;
    }
  }

  // Stationary distribution by power iteration on the state chain s -> (s * v + x) mod v^k. All
  // transition probabilities are positive (up to underflow), so the chain is irreducible and
  // aperiodic and the iteration converges.
  pi_.assign(num_states_, 1.0 / static_cast<double>(num_states_));
  std::vector<double> next(num_states_);
  const int max_iterations =
      static_cast<int>(std::clamp<int64_t>(int64_t{4'000'000'000} / n, 200, 100'000));
  double delta = 1.0;
  for (iterations_ = 0; iterations_ < max_iterations && delta > 1e-14;) {
    std::fill(next.begin(), next.end(), 0.0);
    for (int64_t s = 0; s < num_states_; ++s) {
      const double ps = pi_[s];
      const double* p = &prob_[s * v];
      const int64_t base = (s * v) % num_states_;
      for (int x = 0; x < v; ++x) next[base + x] += ps * p[x];
    }
    double total = 0.0;
    for (double q : next) total += q;
    delta = 0.0;
    for (int64_t s = 0; s < num_states_; ++s) {
      double q = next[s] / total;
      delta += std::abs(q - pi_[s]);
      pi_[s] = q;
    }
    ++iterations_;
  }
  if (delta > 1e-9) {
    throw std::runtime_error(fmt::format(
        "markov source: stationary distribution did not converge ({} iterations, L1 change "
        "{:.2g}); use a larger data.markov_concentration",
        iterations_, delta));
  }
  pi_cdf_.resize(num_states_);
  double acc = 0.0;
  for (int64_t s = 0; s < num_states_; ++s) pi_cdf_[s] = (acc += pi_[s]);

  double h = 0.0;
  for (int64_t s = 0; s < num_states_; ++s) {
    double hs = 0.0;
    const double* p = &prob_[s * v];
    for (int x = 0; x < v; ++x) {
      if (p[x] > 0.0) hs -= p[x] * std::log(p[x]);
    }
    h += pi_[s] * hs;
  }
  entropy_rate_ = h;
}

int64_t MarkovChain::StateOf(const int32_t* context) const {
  int64_t s = 0;
  for (int i = 0; i < opt_.order; ++i) s = s * opt_.vocab_size + context[i];
  return s;
}

double MarkovChain::LogProb(int64_t state, int next) const {
  return std::log(prob_[state * opt_.vocab_size + next]);
}

void MarkovChain::Sample(uint64_t stream, int64_t n, int32_t* out) const {
  const int v = opt_.vocab_size, k = opt_.order;
  data::Rng rng(stream);
  int64_t s = InverseCdf(pi_cdf_.data(), num_states_, rng.Unit() * pi_cdf_.back());
  // Unpack the initial state into its k tokens (oldest first); only the first n are kept.
  std::vector<int32_t> init(k);
  for (int64_t i = k - 1, rest = s; i >= 0; --i, rest /= v) {
    init[i] = static_cast<int32_t>(rest % v);
  }
  for (int64_t i = 0; i < std::min<int64_t>(k, n); ++i) out[i] = init[i];
  for (int64_t i = k; i < n; ++i) {
    const double* c = &cdf_[s * v];
    int32_t x = static_cast<int32_t>(InverseCdf(c, v, rng.Unit() * c[v - 1]));
    out[i] = x;
    s = (s * v + x) % num_states_;
  }
}

}  // namespace moelab
