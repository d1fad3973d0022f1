#include "kernels/cpu/sum_squares.h"

#include <algorithm>
#include <vector>

namespace moelab::cpu {

template <typename T>
double SumSquares(const T* x, size_t n) {
  constexpr size_t kChunk = 1 << 16;
  const size_t chunks = (n + kChunk - 1) / kChunk;
  std::vector<double> partial(chunks, 0.0);
#pragma omp parallel for schedule(static)
  for (size_t c = 0; c < chunks; ++c) {
    double s = 0;
    const size_t end = std::min(n, (c + 1) * kChunk);
    for (size_t i = c * kChunk; i < end; ++i) s += static_cast<double>(x[i]) * x[i];
    partial[c] = s;
  }
  double total = 0;
  for (double p : partial) total += p;
  return total;
}

template double SumSquares<float>(const float*, size_t);
template double SumSquares<double>(const double*, size_t);

}  // namespace moelab::cpu
