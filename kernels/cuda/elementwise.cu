// Row-wise and elementwise kernels: embedding, RMSNorm, RoPE, SwiGLU's activation,
// cross-entropy, and the optimizer arithmetic. One translation unit to keep nvcc time down.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cub/device/device_radix_sort.cuh>
#include <vector>

#include "kernels/cpu/rope.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cross_entropy.h"
#include "kernels/cuda/cross_entropy_kernels.cuh"
#include "kernels/cuda/embedding.h"
#include "kernels/cuda/norm.h"
#include "kernels/cuda/norm_kernels.cuh"
#include "kernels/cuda/optim.h"
#include "kernels/cuda/optim_kernels.cuh"
#include "kernels/cuda/rope.h"
#include "kernels/cuda/rope_kernels.cuh"
#include "kernels/cuda/swiglu.h"
#include "kernels/cuda/swiglu_kernels.cuh"

namespace moelab::cuda {

using detail::Blocks;

namespace {
constexpr int kThreads = 256;

#define MOELAB_GRID_STRIDE(i, n)                                                             \
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < static_cast<size_t>(n); \
       i += size_t(gridDim.x) * blockDim.x)

// ---------------------------------------------------------------- embedding

template <typename T>
__global__ void EmbeddingForwardKernel(const T* table, const int32_t* tokens, int d, T* out) {
  const long row = blockIdx.x;
  const T* src = table + static_cast<long>(tokens[row]) * d;
  T* dst = out + row * d;
  for (int j = threadIdx.x; j < d; j += blockDim.x) dst[j] = src[j];
}

// sorted_tokens/positions: the (token, position) pairs sorted stably by token. Block i handles
// the run of equal tokens that starts at i (other blocks exit), adding the rows in position
// order onto the table row: the CPU's order of additions exactly.
template <typename T>
__global__ void EmbeddingBackwardKernel(const int32_t* sorted_tokens, const int32_t* positions,
                                        const T* dout, int n, int d, T* dtable) {
  const int i = blockIdx.x;
  const int32_t tok = sorted_tokens[i];
  if (i > 0 && sorted_tokens[i - 1] == tok) return;
  int end = i + 1;
  while (end < n && sorted_tokens[end] == tok) ++end;
  T* dst = dtable + static_cast<long>(tok) * d;
  for (int j = threadIdx.x; j < d; j += blockDim.x) {
    T acc = dst[j];
    for (int r = i; r < end; ++r) acc = acc + dout[static_cast<long>(positions[r]) * d + j];
    dst[j] = acc;
  }
}

__global__ void IotaKernel(int32_t* x, int n) {
  MOELAB_GRID_STRIDE(i, n) x[i] = static_cast<int32_t>(i);
}

size_t SortTempBytes(int n) {
  size_t bytes = 0;
  MOELAB_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(
      nullptr, bytes, static_cast<int32_t*>(nullptr), static_cast<int32_t*>(nullptr),
      static_cast<int32_t*>(nullptr), static_cast<int32_t*>(nullptr), n));
  return bytes;
}

size_t Align256(size_t b) { return (b + 255) / 256 * 256; }

}  // namespace

template <typename T>
void EmbeddingForward(const T* table, const int32_t* tokens, int n, int d, T* out,
                      cudaStream_t stream) {
  if (n <= 0) return;
  EmbeddingForwardKernel<<<n, kThreads, 0, stream>>>(table, tokens, d, out);
  CheckLaunch("EmbeddingForward");
}

size_t EmbeddingScratchBytes(int n) {
  return 3 * Align256(sizeof(int32_t) * static_cast<size_t>(n)) + Align256(SortTempBytes(n));
}

template <typename T>
void EmbeddingBackward(const int32_t* tokens, const T* dout, int n, int d, T* dtable, void* scratch,
                       cudaStream_t stream) {
  if (n <= 0) return;
  char* p = static_cast<char*>(scratch);
  const size_t ints = Align256(sizeof(int32_t) * static_cast<size_t>(n));
  int32_t* sorted = reinterpret_cast<int32_t*>(p);
  int32_t* pos_in = reinterpret_cast<int32_t*>(p + ints);
  int32_t* pos_out = reinterpret_cast<int32_t*>(p + 2 * ints);
  void* temp = p + 3 * ints;
  size_t temp_bytes = SortTempBytes(n);
  IotaKernel<<<Blocks(n, kThreads), kThreads, 0, stream>>>(pos_in, n);
  // LSD radix sort is stable: equal tokens keep position order.
  MOELAB_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp, temp_bytes, tokens, sorted, pos_in,
                                                    pos_out, n, 0, 32, stream));
  EmbeddingBackwardKernel<<<n, kThreads, 0, stream>>>(sorted, pos_out, dout, n, d, dtable);
  CheckLaunch("EmbeddingBackward");
}

template void EmbeddingForward<float>(const float*, const int32_t*, int, int, float*, cudaStream_t);
template void EmbeddingBackward<float>(const int32_t*, const float*, int, int, float*, void*,
                                       cudaStream_t);

// ---------------------------------------------------------------- RMSNorm

namespace {

using norm::AddRmsNormKernel;
using norm::NormThreads;
using norm::RmsNormForwardKernel;

// dx = r·(g⊙dy − x·c), c = Σ(dy·g·x)·r²/d. dx may be dy (each thread reads its entries before
// writing them, after the block-wide dot product).
template <typename T>
__global__ void RmsNormBackwardDxKernel(const T* x, int ldx, const T* gain, const T* rstd,
                                        const T* dy, int lddy, T* dx, int lddx, int groups, int d,
                                        bool accumulate) {
  __shared__ float shared[32];
  const long v = blockIdx.x;
  const long i = v / groups, g = v % groups;
  const T* xi = x + i * ldx + g * d;
  const T* dyi = dy + i * lddy + g * d;
  T* dxi = dx + i * lddx + g * d;
  const T r = rstd[v];
  float dot = 0;
  for (int j = threadIdx.x; j < d; j += blockDim.x) dot += dyi[j] * gain[j] * xi[j];
  dot = detail::BlockSum(dot, shared);
  const T c = dot * r * r / d;
  for (int j = threadIdx.x; j < d; j += blockDim.x) {
    const T val = r * (dyi[j] * gain[j] - xi[j] * c);
    dxi[j] = accumulate ? dxi[j] + val : val;
  }
}

constexpr int kChunkVectors = 128;

// partial[chunk, j] = Σ over vectors chunk·128 .. of dy·x·r, in vector order.
template <typename T>
__global__ void RmsNormDgainPartialKernel(const T* x, int ldx, const T* rstd, const T* dy, int lddy,
                                          long vectors, int groups, int d, float* partial) {
  const int j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= d) return;
  const long v0 = static_cast<long>(blockIdx.y) * kChunkVectors;
  const long v1 = min(vectors, v0 + kChunkVectors);
  float acc = 0;
  for (long v = v0; v < v1; ++v) {
    const long i = v / groups, g = v % groups;
    acc += dy[i * lddy + g * d + j] * x[i * ldx + g * d + j] * rstd[v];
  }
  partial[static_cast<long>(blockIdx.y) * d + j] = acc;
}

template <typename T>
__global__ void SumChunksKernel(const float* partial, int chunks, int d, T* out) {
  const int j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= d) return;
  float acc = 0;
  for (int c = 0; c < chunks; ++c) acc += partial[static_cast<long>(c) * d + j];
  out[j] = acc;
}

template <typename T>
void RmsDgain(const T* x, int ldx, const T* rstd, const T* dy, int lddy, long vectors, int groups,
              int d, T* dgain, cudaStream_t stream) {
  const int chunks = static_cast<int>((vectors + kChunkVectors - 1) / kChunkVectors);
  if (chunks == 0) {
    MOELAB_CUDA_CHECK(cudaMemsetAsync(dgain, 0, sizeof(T) * d, stream));
    return;
  }
  float* partial = static_cast<float*>(ThreadScratch(sizeof(float) * size_t(chunks) * d));
  dim3 grid((d + 127) / 128, chunks);
  RmsNormDgainPartialKernel<<<grid, 128, 0, stream>>>(x, ldx, rstd, dy, lddy, vectors, groups, d,
                                                      partial);
  SumChunksKernel<<<(d + 127) / 128, 128, 0, stream>>>(partial, chunks, d, dgain);
  CheckLaunch("RmsNorm dgain");
}

}  // namespace

template <typename T>
void RmsNormForward(const T* x, const T* gain, int n, int d, double eps, T* y, T* rstd,
                    cudaStream_t stream) {
  if (n <= 0) return;
  RmsNormForwardKernel<<<n, NormThreads(d), 0, stream>>>(x, d, y, d, 1, d, gain, eps, rstd);
  CheckLaunch("RmsNormForward");
}

template <typename T>
void AddRmsNormForward(const T* a, const T* b, T* sum, const T* gain, int n, int d, double eps,
                       T* y, T* rstd, cudaStream_t stream) {
  if (n <= 0) return;
  AddRmsNormKernel<<<n, NormThreads(d), 0, stream>>>(a, b, sum, gain, d, eps, y, rstd);
  CheckLaunch("AddRmsNormForward");
}

void RmsNormForwardBf16(const float* x, const float* gain, int n, int d, double eps, float* y,
                        bf16* yb, float* rstd, cudaStream_t stream) {
  if (n <= 0) return;
  RmsNormForwardKernel<<<n, NormThreads(d), 0, stream>>>(x, d, y, d, 1, d, gain, eps, rstd, yb);
  CheckLaunch("RmsNormForwardBf16");
}

void AddRmsNormForwardBf16(const float* a, const float* b, float* sum, const float* gain, int n,
                           int d, double eps, float* y, bf16* yb, float* rstd,
                           cudaStream_t stream) {
  if (n <= 0) return;
  AddRmsNormKernel<<<n, NormThreads(d), 0, stream>>>(a, b, sum, gain, d, eps, y, rstd, yb);
  CheckLaunch("AddRmsNormForwardBf16");
}

template <typename T>
void RmsNormBackward(const T* x, const T* gain, const T* rstd, const T* dy, int n, int d, T* dx,
                     T* dgain, bool accumulate_dx, cudaStream_t stream) {
  RmsDgain(x, d, rstd, dy, d, n, 1, d, dgain, stream);
  if (n <= 0) return;
  RmsNormBackwardDxKernel<<<n, NormThreads(d), 0, stream>>>(x, d, gain, rstd, dy, d, dx, d, 1, d,
                                                            accumulate_dx);
  CheckLaunch("RmsNormBackward");
}

template <typename T>
void RmsNormGroupsForward(const T* x, int ldx, T* y, int ldy, int n, int groups, int d,
                          const T* gain, double eps, T* rstd, cudaStream_t stream) {
  const long vectors = static_cast<long>(n) * groups;
  if (vectors <= 0) return;
  RmsNormForwardKernel<<<vectors, NormThreads(d), 0, stream>>>(x, ldx, y, ldy, groups, d, gain, eps,
                                                               rstd);
  CheckLaunch("RmsNormGroupsForward");
}

template <typename T>
void RmsNormGroupsBackward(const T* x, int ldx, const T* gain, const T* rstd, const T* dy, int lddy,
                           T* dx, int lddx, int n, int groups, int d, T* dgain,
                           cudaStream_t stream) {
  const long vectors = static_cast<long>(n) * groups;
  // dgain first: dx may overwrite dy.
  RmsDgain(x, ldx, rstd, dy, lddy, vectors, groups, d, dgain, stream);
  if (vectors <= 0) return;
  RmsNormBackwardDxKernel<<<vectors, NormThreads(d), 0, stream>>>(x, ldx, gain, rstd, dy, lddy, dx,
                                                                  lddx, groups, d, false);
  CheckLaunch("RmsNormGroupsBackward");
}

template void RmsNormForward<float>(const float*, const float*, int, int, double, float*, float*,
                                    cudaStream_t);
template void AddRmsNormForward<float>(const float*, const float*, float*, const float*, int, int,
                                       double, float*, float*, cudaStream_t);
template void RmsNormBackward<float>(const float*, const float*, const float*, const float*, int,
                                     int, float*, float*, bool, cudaStream_t);
template void RmsNormGroupsForward<float>(const float*, int, float*, int, int, int, int,
                                          const float*, double, float*, cudaStream_t);
template void RmsNormGroupsBackward<float>(const float*, int, const float*, const float*,
                                           const float*, int, float*, int, int, int, int, float*,
                                           cudaStream_t);

// ---------------------------------------------------------------- RoPE

template <typename T>
void RopeTables(int seq, int rot_dim, double theta, T* cos, T* sin, cudaStream_t stream) {
  const size_t count = static_cast<size_t>(seq) * (rot_dim / 2);
  std::vector<T> c(count), s(count);
  cpu::RopeTables(seq, rot_dim, theta, c.data(), s.data());
  MOELAB_CUDA_CHECK(
      cudaMemcpyAsync(cos, c.data(), count * sizeof(T), cudaMemcpyHostToDevice, stream));
  MOELAB_CUDA_CHECK(
      cudaMemcpyAsync(sin, s.data(), count * sizeof(T), cudaMemcpyHostToDevice, stream));
  MOELAB_CUDA_CHECK(cudaStreamSynchronize(stream));
}

template <typename T>
void RopeApplyQk(const cpu::RopeSlice<T>& q, const cpu::RopeSlice<T>& k, int n, int seq,
                 int rot_dim, const float* cos, const float* sin, bool inverse,
                 cudaStream_t stream) {
  const size_t total = static_cast<size_t>(n) * (q.heads + k.heads) * (rot_dim / 2);
  if (!total) return;
  rope::RopeQkKernel<T><<<Blocks(total, kThreads), kThreads, 0, stream>>>(
      q, k, n, seq, rot_dim, cos, sin, inverse ? -1.0f : 1.0f);
  CheckLaunch("RopeApplyQk");
}

template <typename T>
void RopeApply(T* x, int n, int seq, int ld, int heads, int head_stride, int offset, int rot_dim,
               const T* cos, const T* sin, bool inverse, cudaStream_t stream) {
  RopeApplyQk<T>({x, ld, heads, head_stride, offset}, {}, n, seq, rot_dim, cos, sin, inverse,
                 stream);
}

template void RopeTables<float>(int, int, double, float*, float*, cudaStream_t);
template void RopeApply<float>(float*, int, int, int, int, int, int, int, const float*,
                               const float*, bool, cudaStream_t);
template void RopeApplyQk<float>(const cpu::RopeSlice<float>&, const cpu::RopeSlice<float>&, int,
                                 int, int, const float*, const float*, bool, cudaStream_t);
template void RopeApplyQk<bf16>(const cpu::RopeSlice<bf16>&, const cpu::RopeSlice<bf16>&, int, int,
                                int, const float*, const float*, bool, cudaStream_t);

// ---------------------------------------------------------------- SwiGLU activation

template <typename T>
void SwigluActivation(const T* h1, const T* h3, size_t count, T* act, cudaStream_t stream) {
  if (!count) return;
  swiglu::ActKernel<<<Blocks(count, kThreads), kThreads, 0, stream>>>(h1, h3, long(count), act);
  CheckLaunch("SwigluActivation");
}

template <typename T>
void SwigluActivationBackward(const T* h1, const T* h3, const T* dact, size_t count, T* dh1, T* dh3,
                              cudaStream_t stream) {
  if (!count) return;
  swiglu::ActBackwardKernel<<<Blocks(count, kThreads), kThreads, 0, stream>>>(
      h1, h3, dact, long(count), dh1, dh3);
  CheckLaunch("SwigluActivationBackward");
}

void SwigluActivationPaired(const bf16* h13, int rows, int hidden, bf16* act, cudaStream_t stream) {
  if (rows <= 0 || hidden <= 0) return;
  const swiglu::Rows v{rows, hidden, 2L * hidden, hidden};
  swiglu::ActRowsKernel<<<Blocks(rows, 1), kThreads, 0, stream>>>(h13, h13 + hidden, v, act);
  CheckLaunch("SwigluActivationPaired");
}

void SwigluActivationPairedBackward(const bf16* h13, int rows, int hidden, bf16* dh13,
                                    cudaStream_t stream) {
  if (rows <= 0 || hidden <= 0) return;
  const swiglu::Rows v{rows, hidden, 2L * hidden, 2L * hidden};
  swiglu::ActBackwardRowsKernel<<<Blocks(rows, 1), kThreads, 0, stream>>>(h13, h13 + hidden, dh13,
                                                                          v, dh13, dh13 + hidden);
  CheckLaunch("SwigluActivationPairedBackward");
}

template void SwigluActivation<float>(const float*, const float*, size_t, float*, cudaStream_t);
template void SwigluActivation<bf16>(const bf16*, const bf16*, size_t, bf16*, cudaStream_t);
template void SwigluActivationBackward<float>(const float*, const float*, const float*, size_t,
                                              float*, float*, cudaStream_t);
template void SwigluActivationBackward<bf16>(const bf16*, const bf16*, const bf16*, size_t, bf16*,
                                             bf16*, cudaStream_t);

// ---------------------------------------------------------------- cross-entropy

template <typename T>
void CrossEntropyAsync(T* logits, const int32_t* targets, int n, int vocab, double z_coef,
                       bool backward, double* row_scratch, double* result_out,
                       cudaStream_t stream) {
  CrossEntropyAsync(logits, targets, n, vocab, z_coef, backward, 1.0, row_scratch, result_out,
                    stream);
}

template <typename T>
void CrossEntropyAsync(T* logits, const int32_t* targets, int n, int vocab, double z_coef,
                       bool backward, double weight, double* row_scratch, double* result_out,
                       cudaStream_t stream) {
  if (n > 0) {
    ce::CrossEntropyRowKernel<<<n, ce::kCeThreads, 0, stream>>>(
        logits, targets, vocab, z_coef, backward, 1.0f / static_cast<float>(n),
        static_cast<float>(weight), row_scratch, row_scratch + n);
  }
  ce::CrossEntropyReduceKernel<<<1, 1024, 0, stream>>>(row_scratch, row_scratch + n, n, z_coef,
                                                       result_out);
  CheckLaunch("CrossEntropy");
}

template <typename T>
CrossEntropyResult CrossEntropy(T* logits, const int32_t* targets, int n, int vocab, double z_coef,
                                bool backward, double* row_scratch, cudaStream_t stream) {
  return CrossEntropy(logits, targets, n, vocab, z_coef, backward, 1.0, row_scratch, stream);
}

template <typename T>
CrossEntropyResult CrossEntropy(T* logits, const int32_t* targets, int n, int vocab, double z_coef,
                                bool backward, double weight, double* row_scratch,
                                cudaStream_t stream) {
  double* result = row_scratch + 2 * static_cast<size_t>(n);
  CrossEntropyAsync(logits, targets, n, vocab, z_coef, backward, weight, row_scratch, result,
                    stream);
  double host[2];
  MOELAB_CUDA_CHECK(cudaMemcpyAsync(host, result, sizeof(host), cudaMemcpyDeviceToHost, stream));
  MOELAB_CUDA_CHECK(cudaStreamSynchronize(stream));
  return {host[0], host[1]};
}

namespace {
__global__ void AccumulateLossKernel(const double* part, double weight, double* acc) {
  const int i = threadIdx.x;
  if (i < 2) acc[i] = __fma_rn(weight, part[i], acc[i]);  // ComposeLmHeadLoss's std::fma
}
}  // namespace

void AccumulateLoss(const double* part, double weight, double* acc, cudaStream_t stream) {
  AccumulateLossKernel<<<1, 32, 0, stream>>>(part, weight, acc);
  CheckLaunch("AccumulateLoss");
}

template CrossEntropyResult CrossEntropy<float>(float*, const int32_t*, int, int, double, bool,
                                                double*, cudaStream_t);
template void CrossEntropyAsync<float>(float*, const int32_t*, int, int, double, bool, double*,
                                       double*, cudaStream_t);
template CrossEntropyResult CrossEntropy<float>(float*, const int32_t*, int, int, double, bool,
                                                double, double*, cudaStream_t);
template CrossEntropyResult CrossEntropy<bf16>(bf16*, const int32_t*, int, int, double, bool,
                                               double, double*, cudaStream_t);
template void CrossEntropyAsync<float>(float*, const int32_t*, int, int, double, bool, double,
                                       double*, double*, cudaStream_t);
template void CrossEntropyAsync<bf16>(bf16*, const int32_t*, int, int, double, bool, double,
                                      double*, double*, cudaStream_t);

// ---------------------------------------------------------------- optimizer arithmetic

namespace {
using optim::AdamWElement;
using optim::MuonApplyElement;
using optim::MuonMomentumElement;

__global__ void AdamWKernel(float* w, const float* g, float* m, float* v, size_t n,
                            AdamWScalars s) {
  MOELAB_GRID_STRIDE(i, n) AdamWElement(w[i], g[i], m[i], v[i], s, s.decay);
}

template <typename U>
__global__ void MuonMomentumKernel(const float* g, float* m, U* u, size_t n, float mu,
                                   bool nesterov) {
  MOELAB_GRID_STRIDE(i, n) MuonMomentumElement(g[i], m[i], u + i, mu, nesterov);
}

template <typename U>
__global__ void MuonApplyKernel(float* w, const U* o, size_t n, float decay, float step_size) {
  MOELAB_GRID_STRIDE(i, n) w[i] = MuonApplyElement(w[i], o[i], decay, step_size);
}

__global__ void ScaleRowsKernel(const RowScale* spans, int count) {
  const RowScale s = spans[blockIdx.y];
  const size_t n = static_cast<size_t>(s.count) * s.cols;
  float* p = s.w + static_cast<size_t>(s.first) * s.cols;
  MOELAB_GRID_STRIDE(i, n) p[i] *= s.factor;
}

// blockIdx.y: the range.
__global__ void ScaleRangesKernel(const ScaleRange* ranges, float* arena, bf16* copy) {
  const ScaleRange r = ranges[blockIdx.y];
  float* p = arena + r.offset;
  bf16* c = copy ? copy + r.offset : nullptr;
  MOELAB_GRID_STRIDE(i, r.count) {
    p[i] *= r.factor;
    if (c) c[i] = __float2bfloat16(p[i]);
  }
}

constexpr int kSumBlocks = 256;
__global__ void SumSquaresPartialKernel(const float* x, size_t n, double* partial) {
  __shared__ double shared[32];
  double acc = 0;
  MOELAB_GRID_STRIDE(i, n) acc += static_cast<double>(x[i]) * x[i];
  acc = detail::BlockSum(acc, shared);
  if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}
__global__ void SumPartialsKernel(const double* partial, int count, double* out) {
  if (threadIdx.x == 0 && blockIdx.x == 0) {
    double acc = 0;
    for (int i = 0; i < count; ++i) acc += partial[i];
    *out = acc;
  }
}
__global__ void ScaleKernel(float* x, size_t n, float factor) {
  MOELAB_GRID_STRIDE(i, n) x[i] *= factor;
}
}  // namespace

AdamWScalars MakeAdamWScalars(double lr, double beta1, double beta2, double eps,
                              double weight_decay, bool decay, int64_t step) {
  const double c1 = 1.0 - std::pow(beta1, static_cast<double>(step));
  const double c2 = 1.0 - std::pow(beta2, static_cast<double>(step));
  AdamWScalars s;
  s.step_size = static_cast<float>(lr / c1);
  s.inv_sqrt_c2 = static_cast<float>(1.0 / std::sqrt(c2));
  s.eps = static_cast<float>(eps);
  s.b1 = static_cast<float>(beta1);
  s.b2 = static_cast<float>(beta2);
  s.decay = decay ? static_cast<float>(1.0 - lr * weight_decay) : 1.0f;
  return s;
}

void AdamWUpdate(float* w, const float* g, float* m, float* v, size_t n, const AdamWScalars& s,
                 cudaStream_t stream) {
  if (!n) return;
  AdamWKernel<<<Blocks(n, kThreads), kThreads, 0, stream>>>(w, g, m, v, n, s);
  CheckLaunch("AdamWUpdate");
}

void AdamWFused(const AdamWSegment* segments, int num_segments, uint64_t max_size, float* w,
                const float* g, float* m, float* v, bf16* w16, const AdamWScalars& s,
                cudaStream_t stream) {
  if (num_segments <= 0 || max_size == 0) return;
  // Enough blocks per segment for the largest one; smaller segments' extra blocks exit at once.
  const dim3 grid(std::min<unsigned>(Blocks(max_size, kThreads), 4096), num_segments);
  optim::AdamWFusedKernel<<<grid, kThreads, 0, stream>>>(segments, w, g, m, v, w16, s);
  CheckLaunch("AdamWFused");
}

template <typename U>
void MuonMomentumFused(const MuonSegment* segments, int num_segments, uint64_t max_size,
                       const float* g, float* m, U* bank, float mu, bool nesterov,
                       cudaStream_t stream) {
  if (num_segments <= 0 || max_size == 0) return;
  const dim3 grid(std::min<unsigned>(Blocks(max_size, kThreads), 4096), num_segments);
  optim::MuonMomentumFusedKernel<<<grid, kThreads, 0, stream>>>(segments, g, m, bank, mu, nesterov);
  CheckLaunch("MuonMomentumFused");
}
template void MuonMomentumFused<float>(const MuonSegment*, int, uint64_t, const float*, float*,
                                       float*, float, bool, cudaStream_t);
template void MuonMomentumFused<bf16>(const MuonSegment*, int, uint64_t, const float*, float*,
                                      bf16*, float, bool, cudaStream_t);

template <typename U>
void MuonApplyFused(const MuonSegment* segments, int num_segments, uint64_t max_size, float* w,
                    const U* bank, double lr, float decay, bf16* w16, cudaStream_t stream) {
  if (num_segments <= 0 || max_size == 0) return;
  const dim3 grid(std::min<unsigned>(Blocks(max_size, kThreads), 4096), num_segments);
  optim::MuonApplyFusedKernel<<<grid, kThreads, 0, stream>>>(segments, w, bank, lr, decay, w16);
  CheckLaunch("MuonApplyFused");
}
template void MuonApplyFused<float>(const MuonSegment*, int, uint64_t, float*, const float*, double,
                                    float, bf16*, cudaStream_t);
template void MuonApplyFused<bf16>(const MuonSegment*, int, uint64_t, float*, const bf16*, double,
                                   float, bf16*, cudaStream_t);

void MuonMomentum(const float* g, float* m, float* u, size_t n, float mu, bool nesterov,
                  cudaStream_t stream) {
  if (!n) return;
  MuonMomentumKernel<<<Blocks(n, kThreads), kThreads, 0, stream>>>(g, m, u, n, mu, nesterov);
  CheckLaunch("MuonMomentum");
}
void MuonMomentum(const float* g, float* m, bf16* u, size_t n, float mu, bool nesterov,
                  cudaStream_t stream) {
  if (!n) return;
  MuonMomentumKernel<<<Blocks(n, kThreads), kThreads, 0, stream>>>(g, m, u, n, mu, nesterov);
  CheckLaunch("MuonMomentum");
}

void MuonApply(float* w, const float* o, size_t n, float decay, float step_size,
               cudaStream_t stream) {
  if (!n) return;
  MuonApplyKernel<<<Blocks(n, kThreads), kThreads, 0, stream>>>(w, o, n, decay, step_size);
  CheckLaunch("MuonApply");
}
void MuonApply(float* w, const bf16* o, size_t n, float decay, float step_size,
               cudaStream_t stream) {
  if (!n) return;
  MuonApplyKernel<<<Blocks(n, kThreads), kThreads, 0, stream>>>(w, o, n, decay, step_size);
  CheckLaunch("MuonApply");
}

void ScaleRows(const std::vector<RowScale>& spans, cudaStream_t stream) {
  if (spans.empty()) return;
  size_t widest = 0;
  for (const RowScale& s : spans) widest = std::max(widest, static_cast<size_t>(s.count) * s.cols);
  if (!widest) return;
  void* dev = ThreadScratch(spans.size() * sizeof(RowScale));
  MOELAB_CUDA_CHECK(cudaMemcpyAsync(dev, spans.data(), spans.size() * sizeof(RowScale),
                                    cudaMemcpyHostToDevice, stream));
  dim3 grid(std::min(Blocks(widest, kThreads), 1024), static_cast<unsigned>(spans.size()));
  ScaleRowsKernel<<<grid, kThreads, 0, stream>>>(static_cast<const RowScale*>(dev),
                                                 static_cast<int>(spans.size()));
  CheckLaunch("ScaleRows");
}

void ScaleRanges(const std::vector<ScaleRange>& ranges, float* arena, bf16* copy,
                 cudaStream_t stream) {
  uint64_t widest = 0;
  for (const ScaleRange& r : ranges) widest = std::max(widest, r.count);
  if (!widest) return;
  const size_t bytes = ranges.size() * sizeof(ScaleRange);
  void* dev = ThreadScratch(bytes);
  MOELAB_CUDA_CHECK(cudaMemcpyAsync(dev, ranges.data(), bytes, cudaMemcpyHostToDevice, stream));
  const dim3 grid(std::min(Blocks(widest, kThreads), 256), static_cast<unsigned>(ranges.size()));
  ScaleRangesKernel<<<grid, kThreads, 0, stream>>>(static_cast<const ScaleRange*>(dev), arena,
                                                   copy);
  CheckLaunch("ScaleRanges");
}

void SumSquares(const float* x, size_t n, double* out_device, cudaStream_t stream) {
  double* partial = static_cast<double*>(ThreadScratch(kSumBlocks * sizeof(double)));
  SumSquaresPartialKernel<<<kSumBlocks, kThreads, 0, stream>>>(x, n, partial);
  SumPartialsKernel<<<1, 32, 0, stream>>>(partial, kSumBlocks, out_device);
  CheckLaunch("SumSquares");
}

void Scale(float* x, size_t n, float factor, cudaStream_t stream) {
  if (!n) return;
  ScaleKernel<<<Blocks(n, kThreads), kThreads, 0, stream>>>(x, n, factor);
  CheckLaunch("Scale");
}

}  // namespace moelab::cuda
