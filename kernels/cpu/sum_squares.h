// Σ x² in double with a fixed summation order, for gradient norms.
#pragma once

#include <cstddef>

namespace moelab::cpu {

// Chunks of 2^16 elements from x, each summed in order (chunks in parallel), then the chunks in
// order: the same bits for every thread count, and for a range of an arena the same bits whether
// one process sums it or a ZeRO-1 shard does (core/dist/zero.h).
template <typename T>
double SumSquares(const T* x, size_t n);

}  // namespace moelab::cpu
