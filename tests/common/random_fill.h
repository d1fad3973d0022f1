// Random test data: normal draws from a seeded std::mt19937_64, the one recipe the MoE tests and
// benches share, so that a seed names the same numbers in each of them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <random>
#include <type_traits>
#include <vector>

namespace moelab::test {

// n draws of N(0, stddev²) from std::mt19937_64(seed) (T: float or double, named at the call).
template <typename T>
std::vector<T> RandomNormal(size_t n, std::type_identity_t<T> stddev, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<T> dist(T(0), stddev);
  std::vector<T> v(n);
  for (T& x : v) x = dist(rng);
  return v;
}

}  // namespace moelab::test
