// The CUDA backend's glue kernels (core/model/cuda_backend_kernels.cu): residual adds, MLA's
// per-head assembly and its scatter, gradient accumulation, on device pointers.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

namespace moelab::cudamodel {

// out[i] = a[i] + b[i] (out may alias a or b).
void Add(const float* a, const float* b, float* out, size_t n, cudaStream_t stream = nullptr);
// For rows r < n and heads h < heads, columns j < width:
//   dst[r·ldd + h·dst_stride + dst_off + j] (= or +=) src[r·lds + h·src_stride + src_off + j].
void CopyHeads(const float* src, int lds, int src_stride, int src_off, float* dst, int ldd,
               int dst_stride, int dst_off, int n, int heads, int width, bool accumulate,
               cudaStream_t stream = nullptr);
// dst[r·ldd + j] = Σ_h src[r·lds + h·src_stride + src_off + j], summed in head order.
void SumHeads(const float* src, int lds, int src_stride, int src_off, float* dst, int ldd, int n,
              int heads, int width, cudaStream_t stream = nullptr);

// Gradient accumulation over micro-batches: acc = w·g (first) or acc += w·g; FinishAxpy writes
// g = acc + w·g (the last micro-batch joins without another pass).
void Axpy(const float* g, float w, bool first, float* acc, size_t n, cudaStream_t stream = nullptr);
void FinishAxpy(const float* acc, float w, float* g, size_t n, cudaStream_t stream = nullptr);

}  // namespace moelab::cudamodel
