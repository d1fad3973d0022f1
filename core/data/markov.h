// A seeded random order-k Markov chain over a token vocabulary, with its exact entropy rate: the
// loss floor that no model can beat on its samples, used to check fitted irreducible losses.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace moelab {

struct MarkovOptions {
  int vocab_size = 512;
  int order = 1;               // k: the next token depends on the previous k tokens
  double concentration = 0.1;  // symmetric Dirichlet parameter of each transition row
  uint64_t seed = 1234;
};

class MarkovChain {
 public:
  // Largest number of transition probabilities (vocab^(order+1)) a chain may have: two doubles
  // each, so 64 MiB at the limit.
  static constexpr int64_t kMaxEntries = int64_t{1} << 22;

  // Draws the transition rows and computes the stationary distribution and entropy rate.
  // Throws std::runtime_error for invalid or infeasible options.
  explicit MarkovChain(const MarkovOptions& options);

  const MarkovOptions& options() const { return opt_; }
  int64_t num_states() const { return num_states_; }  // vocab^order
  // Entropy rate in nats/token: sum_s pi(s) H(P(.|s)).
  double entropy_rate() const { return entropy_rate_; }
  const std::vector<double>& stationary() const { return pi_; }
  int power_iterations() const { return iterations_; }

  // State index of the k tokens ending at context[order-1] (oldest first).
  int64_t StateOf(const int32_t* context) const;
  // log P(next | state).
  double LogProb(int64_t state, int next) const;
  // Fills out[0..n) with a stationary sample: the first `order` tokens come from pi, the rest
  // from the transitions. A pure function of `stream`.
  void Sample(uint64_t stream, int64_t n, int32_t* out) const;

 private:
  MarkovOptions opt_;
  int64_t num_states_ = 0;
  std::vector<double> prob_;  // [state][next]
  std::vector<double> cdf_;   // row-wise cumulative sums of prob_, for inverse-CDF sampling
  std::vector<double> pi_;
  std::vector<double> pi_cdf_;
  double entropy_rate_ = 0.0;
  int iterations_ = 0;
};

}  // namespace moelab
