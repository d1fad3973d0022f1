// The router's top-k selection, one token: shared by the CPU router (kernels/cpu/moe_routing.cc)
// and the CUDA routing kernel (kernels/cuda/moe.cu), so the two choose the same experts by
// construction. Compiled for the host, and for the device where nvcc includes it.
#pragma once

#if defined(__CUDACC__)
#define MOELAB_HOST_DEVICE __host__ __device__
#else
#define MOELAB_HOST_DEVICE
#endif

namespace moelab::cpu {

// One pass of insertion into a sorted list of the k best (value, expert): O(E) when most
// experts fail the first comparison (k = 8 of 256 is cheap). The strict '>' over ascending
// expert indices keeps the lower index ahead on ties; every expert is inserted at most once, so
// the k are distinct even with NaN scores. s [E] the scores, bias [E] or null (added for the
// choice only); writes idx [k] and val [k] (the biased values), best first.
template <typename T>
MOELAB_HOST_DEVICE inline void InsertTopK(const T* s, const T* bias, int E, int k, int* idx,
                                          T* val) {
  int filled = 0;
  for (int e = 0; e < E; ++e) {
    const T v = bias ? s[e] + bias[e] : s[e];
    if (filled == k && !(v > val[k - 1])) continue;
    int j = filled < k ? filled++ : k - 1;
    for (; j > 0 && v > val[j - 1]; --j) {
      val[j] = val[j - 1];
      idx[j] = idx[j - 1];
    }
    val[j] = v;
    idx[j] = e;
  }
}

}  // namespace moelab::cpu

#undef MOELAB_HOST_DEVICE
