// Token embedding lookup and its scatter-add backward.
#pragma once

#include <cstdint>

namespace moelab::cpu {

// out[i] = table[tokens[i]], out [n, d].
template <typename T>
void EmbeddingForward(const T* table, const int32_t* tokens, int n, int d, T* out);

// dtable[tokens[i]] += dout[i]. Rows of the table are partitioned over threads by token id and
// each thread adds its rows' contributions in position order: no atomics, and every table row is
// summed in the same order for any thread count.
template <typename T>
void EmbeddingBackward(const int32_t* tokens, const T* dout, int n, int d, T* dtable);

}  // namespace moelab::cpu
