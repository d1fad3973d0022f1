// Counter-based randomness for the data sources: every draw is a pure function of its inputs, so
// a batch depends only on (seed, step, rank, row) and a resumed run needs no loader state. Written
// by hand (not <random>) because the standard distributions differ between library vendors.
#pragma once

#include <cmath>
#include <cstdint>

namespace moelab::data {

inline uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// Chains the inputs through SplitMix64 so that nearby tuples give unrelated outputs.
inline uint64_t HashCombine(uint64_t a, uint64_t b) { return SplitMix64(a ^ SplitMix64(b)); }
inline uint64_t HashOf(uint64_t a, uint64_t b, uint64_t c, uint64_t d) {
  return HashCombine(HashCombine(HashCombine(SplitMix64(a), b), c), d);
}

// Maps a 64-bit draw to [0, n) without division (Lemire); the bias is below n / 2^64.
inline uint64_t Below(uint64_t r, uint64_t n) {
  return static_cast<uint64_t>((static_cast<unsigned __int128>(r) * n) >> 64);
}

// Uniform in [0, 1) with 53 random bits.
inline double ToUnit(uint64_t r) { return static_cast<double>(r >> 11) * 0x1.0p-53; }

// A small sequential generator (SplitMix64 stream) seeded from a hash.
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t Next() {
    state_ += 0x9e3779b97f4a7c15ULL;
    uint64_t z = state_;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  // In (0, 1): never 0, so log() is always finite.
  double Unit() { return (static_cast<double>(Next() >> 11) + 0.5) * 0x1.0p-53; }
  double Normal() {  // Box-Muller; one value per call keeps the stream simple
    double u1 = Unit(), u2 = Unit();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }
  // log of a Gamma(shape, 1) variate (Marsaglia-Tsang). Returned in log space because for the
  // small Dirichlet concentrations used here the variates underflow doubles.
  double LogGamma(double shape) {
    double boost = 0.0;
    if (shape < 1.0) {  // G(a) = G(a+1) * U^(1/a)
      boost = std::log(Unit()) / shape;
      shape += 1.0;
    }
    const double d = shape - 1.0 / 3.0, c = 1.0 / std::sqrt(9.0 * d);
    for (;;) {
      double x = Normal(), v = 1.0 + c * x;
      if (v <= 0.0) continue;
      v = v * v * v;
      double u = Unit();
      if (std::log(u) < 0.5 * x * x + d - d * v + d * std::log(v)) return std::log(d * v) + boost;
    }
  }

 private:
  uint64_t state_;
};

}  // namespace moelab::data
