#include "kernels/cpu/embedding.h"

#include <omp.h>

#include <cstring>

namespace moelab::cpu {

template <typename T>
void EmbeddingForward(const T* table, const int32_t* tokens, int n, int d, T* out) {
  const bool par = static_cast<long>(n) * d > 16384;
#pragma omp parallel for schedule(static) if (par)
  for (int i = 0; i < n; ++i)
    std::memcpy(out + static_cast<long>(i) * d, table + static_cast<long>(tokens[i]) * d,
                sizeof(T) * d);
}

template <typename T>
void EmbeddingBackward(const int32_t* tokens, const T* dout, int n, int d, T* dtable) {
  const bool par = static_cast<long>(n) * d > 16384;
#pragma omp parallel if (par)
  {
    const int t = omp_get_thread_num(), nt = omp_get_num_threads();
    for (int i = 0; i < n; ++i) {
      if (tokens[i] % nt != t) continue;
      T* dst = dtable + static_cast<long>(tokens[i]) * d;
      const T* src = dout + static_cast<long>(i) * d;
#pragma omp simd
      for (int j = 0; j < d; ++j) dst[j] += src[j];
    }
  }
}

template void EmbeddingForward<float>(const float*, const int32_t*, int, int, float*);
template void EmbeddingForward<double>(const double*, const int32_t*, int, int, double*);
template void EmbeddingBackward<float>(const int32_t*, const float*, int, int, float*);
template void EmbeddingBackward<double>(const int32_t*, const double*, int, int, double*);

}  // namespace moelab::cpu
