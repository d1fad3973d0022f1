// CUDA twin of kernels/cpu/embedding.h (fp32).
#pragma once

#include <cstdint>

#include "kernels/cuda/device.h"

namespace moelab::cuda {

// out[i] = table[tokens[i]], out [n, d].
template <typename T>
void EmbeddingForward(const T* table, const int32_t* tokens, int n, int d, T* out,
                      cudaStream_t stream = nullptr);

// dtable[tokens[i]] += dout[i], deterministic: each table row is summed in position order (the
// tokens are sorted by id on the device, one warp per distinct id; no float atomics).
// scratch: EmbeddingScratchBytes(n) bytes of device memory.
size_t EmbeddingScratchBytes(int n);
template <typename T>
void EmbeddingBackward(const int32_t* tokens, const T* dout, int n, int d, T* dtable, void* scratch,
                       cudaStream_t stream = nullptr);

}  // namespace moelab::cuda
