// Internal: deterministic, run-level bootstrap shared by every fit.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace moelab::analysis::internal {

// Multiplicity of each run in resample `b`: within each stratum (a family), as many draws with
// replacement as the stratum has runs. Depends only on (seed, b), not on threads or order.
std::vector<int> ResampleCounts(const std::vector<std::vector<int>>& strata, int n_runs,
                                uint64_t seed, int b);

// Runs fn(b, counts) for b in [0, resamples), in parallel with OpenMP; row b of the result is
// fn's output (a row of NaN when fn returns an empty vector = failed resample).
std::vector<std::vector<double>> Bootstrap(
    const std::vector<std::vector<int>>& strata, int n_runs, int resamples, uint64_t seed,
    int threads, int width,
    const std::function<std::vector<double>(int b, const std::vector<int>& counts)>& fn);

// An independent resample stream per name (a family): SplitMix64 folded over the bytes, stable
// across platforms and standard libraries (unlike std::hash).
uint64_t StreamSeed(uint64_t seed, const std::string& name);

// Hesterberg's expanded percentile interval (Amer. Stat. 2015): the plain percentile interval
// is too narrow for few resampling units (runs), by about sqrt((n−1)/n) and the z→t gap. The
// returned level is the one whose plain percentile interval has the corrected width:
// 1 − 2·Φ(−sqrt(n/(n−1))·t_{n−1, 1−(1−level)/2}). Returns `level` for n < 2.
double ExpandedLevel(double level, int n_units);

// Two-sided percentile interval at `level` over the finite-or-infinite, non-NaN values.
// Returns {NaN, NaN} when there are none.
std::pair<double, double> PercentileInterval(std::vector<double> values, double level);

}  // namespace moelab::analysis::internal
