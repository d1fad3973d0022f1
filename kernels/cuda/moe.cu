// MoE routing, dispatch/combine, the experts' grouped GEMMs, and the dense SwiGLU FFN.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <stdexcept>
#include <type_traits>
#include <vector>

#include "kernels/cpu/router_token.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/grouped_gemm_device.h"
#include "kernels/cuda/moe_dispatch_kernels.cuh"
#include "kernels/cuda/moe_experts.h"
#include "kernels/cuda/moe_routing.h"
#include "kernels/cuda/moe_rows_kernels.cuh"
#include "kernels/cuda/swiglu.h"

namespace moelab::cuda {

using detail::Blocks;

namespace {
constexpr int kMaxTopK = 32;

// ---------------------------------------------------------------- route

// One thread per token, the CPU's loops in the CPU's order.
template <typename T>
__global__ void MoeRouteKernel(const T* logits, int n, int E, int k, bool sigmoid, const T* bias,
                               double route_scale, T* scores, int* topk, T* gates,
                               unsigned long long* counts) {
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= n) return;
  const T* z = logits + static_cast<long>(t) * E;
  T* s = scores + static_cast<long>(t) * E;
  if (sigmoid) {
    for (int e = 0; e < E; ++e) s[e] = T(1) / (T(1) + expf(-z[e]));
  } else {
    T zmax = z[0];
    for (int e = 1; e < E; ++e) zmax = fmaxf(zmax, z[e]);
    double sum = 0;
    for (int e = 0; e < E; ++e) {
      s[e] = expf(z[e] - zmax);
      sum += s[e];
    }
    const T inv = static_cast<T>(1.0 / sum);
    for (int e = 0; e < E; ++e) s[e] *= inv;
  }
  int idx[kMaxTopK];
  T val[kMaxTopK];
  cpu::InsertTopK(s, bias, E, k, idx, val);  // kernels/cpu/router_token.h, the CPU router's own
  cpu::TopKGates(s, idx, k, route_scale, gates + static_cast<long>(t) * k);
  int* ti = topk + static_cast<long>(t) * k;
  for (int slot = 0; slot < k; ++slot) {
    ti[slot] = idx[slot];
    atomicAdd(counts + idx[slot], 1ull);
  }
}

// One block: per-thread token sums in double, fixed-shape tree (reproducible).
template <typename T>
__global__ void MoeAuxLossKernel(const T* scores, const int64_t* counts, int n, int E, bool sigmoid,
                                 double* out) {
  __shared__ double shared[32];
  double acc = 0;
  for (int t = threadIdx.x; t < n; t += blockDim.x) {
    acc += cpu::AuxLossTokenTerm(scores + static_cast<long>(t) * E, counts, E, sigmoid);
  }
  acc = detail::BlockSum(acc, shared);
  if (threadIdx.x == 0) *out = acc;
}

// Block e: Σ_t s̃_{t,e}, the normalised scores (softmax: the score; sigmoid: s_e/Σ_j s_j, nothing
// where every score underflowed) in double, per-thread token sums then a fixed-shape tree
// (reproducible). The numerators of the Switch aux loss's P_e.
template <typename T>
__global__ void MoeScoreSumsKernel(const T* scores, int n, int E, bool sigmoid, double* sums) {
  __shared__ double shared[32];
  const int e = blockIdx.x;
  double acc = 0;
  for (int t = threadIdx.x; t < n; t += blockDim.x) {
    const T* s = scores + static_cast<long>(t) * E;
    double sum = 1.0;
    if (sigmoid) {
      sum = 0;
      for (int j = 0; j < E; ++j) sum += s[j];
      if (!(sum > 0)) continue;
    }
    acc += static_cast<double>(s[e]) / sum;
  }
  acc = detail::BlockSum(acc, shared);
  if (threadIdx.x == 0) sums[e] = acc;
}

template <typename T>
__global__ void MoeRouteBackwardKernel(const T* scores, const int* topk, const T* dgates,
                                       const int64_t* counts, int n, int E, int k, bool sigmoid,
                                       double route_scale, bool aux, double a_scale, T* dlogits) {
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= n) return;
  const long row = static_cast<long>(t);
  cpu::RouteBackwardToken(scores + row * E, topk + row * k, dgates + row * k, counts, E, k, sigmoid,
                          route_scale, aux, a_scale, dlogits + row * E);
}

// ---------------------------------------------------------------- gather / combine
// The kernels are in moe_rows_kernels.cuh (one body for both widths).

int RowThreads(int d) { return d >= 512 ? 256 : (d >= 128 ? 128 : 32); }

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// Calls launch(width, threads) for rows of d elements, width a std::integral_constant: 8, the
// 16-byte form, with train.kernels.dispatch "sort" when d is a multiple of 8 and every base given
// is 16-byte aligned (cudaMalloc's are; rows of a multiple of 8 elements then are too), else 1, the
// element-per-thread form that ran on the GPU.
template <typename Launch>
void LaunchRows(int d, std::initializer_list<const void*> rows, Launch launch) {
  bool wide = d % 8 == 0 && MoeDispatchInUse() == MoeDispatch::kSort;
  for (const void* p : rows) wide = wide && (p == nullptr || Aligned16(p));
  if (wide) {
    launch(std::integral_constant<int, 8>(), std::min(RowThreads(d), (d / 8 + 31) / 32 * 32));
  } else {
    launch(std::integral_constant<int, 1>(), RowThreads(d));
  }
}

}  // namespace

template <typename T>
void MoeRoute(const T* logits, int n, int experts, int k, bool sigmoid, const T* bias,
              double route_scale, T* scores, int* topk, T* gates, int64_t* counts,
              cudaStream_t stream) {
  if (k > kMaxTopK || k > experts) throw std::invalid_argument("cuda::MoeRoute: k too large");
  MOELAB_CUDA_CHECK(cudaMemsetAsync(counts, 0, sizeof(int64_t) * experts, stream));
  if (n <= 0) return;
  MoeRouteKernel<<<(n + 127) / 128, 128, 0, stream>>>(
      logits, n, experts, k, sigmoid, bias, route_scale, scores, topk, gates,
      reinterpret_cast<unsigned long long*>(counts));
  CheckLaunch("MoeRoute");
}

template <typename T>
double MoeAuxLoss(const T* scores, const int64_t* counts, int n, int experts, int k, bool sigmoid,
                  double coef, cudaStream_t stream) {
  if (n == 0) return 0.0;
  double* dev = static_cast<double*>(ThreadScratch(sizeof(double)));
  MoeAuxLossKernel<<<1, 1024, 0, stream>>>(scores, counts, n, experts, sigmoid, dev);
  CheckLaunch("MoeAuxLoss");
  double acc = 0;
  MOELAB_CUDA_CHECK(cudaMemcpyAsync(&acc, dev, sizeof(double), cudaMemcpyDeviceToHost, stream));
  MOELAB_CUDA_CHECK(cudaStreamSynchronize(stream));
  const double inv_nk = 1.0 / (static_cast<double>(n) * k);
  return coef * experts * inv_nk * acc / n;
}

template <typename T>
void MoeScoreSums(const T* scores, int n, int experts, bool sigmoid, double* host_sums,
                  cudaStream_t stream) {
  if (n == 0) {
    for (int e = 0; e < experts; ++e) host_sums[e] = 0.0;
    return;
  }
  double* dev = static_cast<double*>(ThreadScratch(sizeof(double) * experts));
  MoeScoreSumsKernel<<<experts, 256, 0, stream>>>(scores, n, experts, sigmoid, dev);
  CheckLaunch("MoeScoreSums");
  MOELAB_CUDA_CHECK(
      cudaMemcpyAsync(host_sums, dev, sizeof(double) * experts, cudaMemcpyDeviceToHost, stream));
  MOELAB_CUDA_CHECK(cudaStreamSynchronize(stream));
}

template <typename T>
void MoeRouteBackward(const T* scores, const int* topk, const T* dgates, const int64_t* counts,
                      int n, int experts, int k, bool sigmoid, double route_scale, double aux_coef,
                      T* dlogits, cudaStream_t stream) {
  if (n <= 0) return;
  const bool aux = aux_coef != 0.0;
  const double a_scale = aux ? aux_coef * experts / (static_cast<double>(n) * k * n) : 0.0;
  MoeRouteBackwardKernel<<<(n + 127) / 128, 128, 0, stream>>>(
      scores, topk, dgates, counts, n, experts, k, sigmoid, route_scale, aux, a_scale, dlogits);
  CheckLaunch("MoeRouteBackward");
}

MoeDispatch MoeDispatchInUse() {
  return SelectedKernels().dispatch_sort ? MoeDispatch::kSort : MoeDispatch::kScan;
}

void MoeDispatchPlan(const int* topk, int n, int experts, int k, int64_t* offsets, int* row_token,
                     int* slot_row, MoeDispatch kind, cudaStream_t stream) {
  using namespace dispatch;
  const int chunks = PlanChunks(n, experts, k);
  const long nk = static_cast<long>(n) * k;
  if (kind == MoeDispatch::kScan) {
    CountExpertKernel<<<experts, kScanPlanThreads, 0, stream>>>(topk, nk, offsets);
    ScanOffsetsKernel<<<1, 32, 0, stream>>>(offsets, experts);
    ScatterExpertKernel<<<experts, kScanPlanThreads, 0, stream>>>(topk, nk, k, offsets, row_token,
                                                                  slot_row);
  } else {
    CheckSortExperts(experts);
    const long total = static_cast<long>(experts) * chunks;
    int* counts = static_cast<int*>(ThreadScratch(sizeof(int) * total));
    const size_t per_expert = sizeof(int) * experts;
    ChunkCountKernel<<<chunks, kCountThreads, per_expert, stream>>>(topk, nk, experts, chunks,
                                                                    counts);
    ScanChunkCountsKernel<<<1, kScanThreads, 0, stream>>>(counts, total, experts, chunks, nk,
                                                          offsets);
    ChunkScatterKernel<<<chunks, kScatterThreads, per_expert, stream>>>(
        topk, nk, k, experts, chunks, counts, row_token, slot_row);
  }
  CheckLaunch("MoeDispatchPlan");
}

void MoeDispatchPlan(const int* topk, int n, int experts, int k, int64_t* offsets, int* row_token,
                     int* slot_row, cudaStream_t stream) {
  MoeDispatchPlan(topk, n, experts, k, offsets, row_token, slot_row, MoeDispatchInUse(), stream);
}

void DownloadOffsets(const int64_t* offsets, int experts, int64_t* host_offsets,
                     cudaStream_t stream) {
  MOELAB_CUDA_CHECK(cudaMemcpyAsync(host_offsets, offsets, sizeof(int64_t) * (experts + 1),
                                    cudaMemcpyDeviceToHost, stream));
  MOELAB_CUDA_CHECK(cudaStreamSynchronize(stream));
}

template <typename T>
void MoeGather(const T* x, int d, const int* row_token, int64_t rows, T* xe, cudaStream_t stream) {
  if (rows <= 0) return;
  LaunchRows(d, {x, xe}, [&](auto vec, int threads) {
    moe_rows::GatherKernel<decltype(vec)::value><<<rows, threads, 0, stream>>>(x, d, row_token, xe);
  });
  CheckLaunch("MoeGather");
}

template <typename T>
void MoeGatherChunked(const T* x, int d, const int* row_token, const int64_t* table, int chunks,
                      int rows, T* chunked, cudaStream_t stream) {
  const long n = static_cast<long>(chunks) * rows;
  if (n <= 0) return;
  LaunchRows(d, {x, chunked}, [&](auto vec, int threads) {
    moe_rows::GatherChunkedKernel<decltype(vec)::value>
        <<<n, threads, 0, stream>>>(x, d, row_token, table, chunks, rows, chunked);
  });
  CheckLaunch("MoeGatherChunked");
}

template <typename T>
void MoeChunkRowsOf(const T* compact, const int64_t* table, int chunks, int rows, int d, T* chunked,
                    cudaStream_t stream) {
  MoeGatherChunked<T>(compact, d, nullptr, table, chunks, rows, chunked, stream);
}

template <typename T>
void MoeUnchunkRows(const T* chunked, const int64_t* table, int chunks, int rows, int d, T* compact,
                    cudaStream_t stream) {
  const long n = static_cast<long>(chunks) * rows;
  if (n <= 0) return;
  LaunchRows(d, {chunked, compact}, [&](auto vec, int threads) {
    moe_rows::UnchunkKernel<decltype(vec)::value>
        <<<n, threads, 0, stream>>>(chunked, table, chunks, rows, d, compact);
  });
  CheckLaunch("MoeUnchunkRows");
}

namespace {
// The combine (gates) and the gather's backward (gates null): moe_rows::SumSlotsKernel.
template <typename T, typename TE>
void LaunchSumSlots(const TE* rows, const int* slot_row, const T* gates, int n, int k, int d,
                    T* out, bool accumulate, const char* what, cudaStream_t stream) {
  if (n <= 0) return;
  LaunchRows(d, {rows, out}, [&](auto vec, int threads) {
    moe_rows::SumSlotsKernel<decltype(vec)::value>
        <<<n, threads, 0, stream>>>(rows, slot_row, gates, k, d, out, accumulate);
  });
  CheckLaunch(what);
}

template <typename T, typename TE>
void LaunchCombineBackward(const T* dy, const TE* ye, const int* slot_row, const T* gates, int n,
                           int k, int d, TE* dye, T* dgates, cudaStream_t stream) {
  if (n <= 0) return;
  LaunchRows(d, {dy, ye, dye}, [&](auto vec, int threads) {
    moe_rows::CombineBackwardKernel<decltype(vec)::value>
        <<<n, threads, 0, stream>>>(dy, ye, slot_row, gates, k, d, dye, dgates);
  });
  CheckLaunch("MoeCombineBackward");
}
}  // namespace

template <typename T>
void MoeGatherBackward(const T* dxe, const int* slot_row, int n, int k, int d, T* dx,
                       bool accumulate, cudaStream_t stream) {
  LaunchSumSlots(dxe, slot_row, static_cast<const float*>(nullptr), n, k, d, dx, accumulate,
                 "MoeGatherBackward", stream);
}
void MoeGatherBackward(const bf16* dxe, const int* slot_row, int n, int k, int d, float* dx,
                       bool accumulate, cudaStream_t stream) {
  LaunchSumSlots(dxe, slot_row, static_cast<const float*>(nullptr), n, k, d, dx, accumulate,
                 "MoeGatherBackward", stream);
}

template <typename T>
void MoeCombine(const T* ye, const int* slot_row, const T* gates, int n, int k, int d, T* y,
                bool accumulate, cudaStream_t stream) {
  LaunchSumSlots(ye, slot_row, gates, n, k, d, y, accumulate, "MoeCombine", stream);
}
void MoeCombine(const bf16* ye, const int* slot_row, const float* gates, int n, int k, int d,
                float* y, bool accumulate, cudaStream_t stream) {
  LaunchSumSlots(ye, slot_row, gates, n, k, d, y, accumulate, "MoeCombine", stream);
}

template <typename T>
void MoeCombineBackward(const T* dy, const T* ye, const int* slot_row, const T* gates, int n, int k,
                        int d, T* dye, T* dgates, cudaStream_t stream) {
  LaunchCombineBackward(dy, ye, slot_row, gates, n, k, d, dye, dgates, stream);
}
void MoeCombineBackward(const float* dy, const bf16* ye, const int* slot_row, const float* gates,
                        int n, int k, int d, bf16* dye, float* dgates, cudaStream_t stream) {
  LaunchCombineBackward(dy, ye, slot_row, gates, n, k, d, dye, dgates, stream);
}

template void MoeRoute<float>(const float*, int, int, int, bool, const float*, double, float*, int*,
                              float*, int64_t*, cudaStream_t);
template double MoeAuxLoss<float>(const float*, const int64_t*, int, int, int, bool, double,
                                  cudaStream_t);
template void MoeScoreSums<float>(const float*, int, int, bool, double*, cudaStream_t);
template void MoeRouteBackward<float>(const float*, const int*, const float*, const int64_t*, int,
                                      int, int, bool, double, double, float*, cudaStream_t);
template void MoeGather<float>(const float*, int, const int*, int64_t, float*, cudaStream_t);
template void MoeGather<bf16>(const bf16*, int, const int*, int64_t, bf16*, cudaStream_t);
template void MoeGatherChunked<float>(const float*, int, const int*, const int64_t*, int, int,
                                      float*, cudaStream_t);
template void MoeGatherChunked<bf16>(const bf16*, int, const int*, const int64_t*, int, int, bf16*,
                                     cudaStream_t);
template void MoeChunkRowsOf<float>(const float*, const int64_t*, int, int, int, float*,
                                    cudaStream_t);
template void MoeChunkRowsOf<bf16>(const bf16*, const int64_t*, int, int, int, bf16*, cudaStream_t);
template void MoeUnchunkRows<float>(const float*, const int64_t*, int, int, int, float*,
                                    cudaStream_t);
template void MoeUnchunkRows<bf16>(const bf16*, const int64_t*, int, int, int, bf16*, cudaStream_t);
template void MoeGatherBackward<float>(const float*, const int*, int, int, int, float*, bool,
                                       cudaStream_t);
template void MoeCombine<float>(const float*, const int*, const float*, int, int, int, float*, bool,
                                cudaStream_t);
template void MoeCombineBackward<float>(const float*, const float*, const int*, const float*, int,
                                        int, int, float*, float*, cudaStream_t);

// ---------------------------------------------------------------- dense SwiGLU

template <typename T>
void SwigluForward(const T* x, int n, int d, int hidden, const T* w1, const T* w3, const T* w2,
                   T* h1, T* h3, T* act, T* y, cudaStream_t stream) {
  Gemm(false, true, n, hidden, d, 1.0f, x, d, w1, d, 0.0f, h1, hidden, stream);
  Gemm(false, true, n, hidden, d, 1.0f, x, d, w3, d, 0.0f, h3, hidden, stream);
  SwigluActivation(h1, h3, static_cast<size_t>(n) * hidden, act, stream);
  Gemm(false, true, n, d, hidden, 1.0f, act, hidden, w2, hidden, 0.0f, y, d, stream);
}

template <typename T>
void SwigluBackward(const T* x, int n, int d, int hidden, const T* w1, const T* w3, const T* w2,
                    const T* h1, const T* h3, const T* act, const T* dy, T* dx, T* dw1, T* dw3,
                    T* dw2, T* scratch, bool accumulate_dx, bool accumulate_dw,
                    cudaStream_t stream) {
  T* dact = scratch;  // becomes dh1 in place
  T* dh3 = scratch + static_cast<long>(n) * hidden;
  const float bw = accumulate_dw ? 1.0f : 0.0f;
  Gemm(false, false, n, hidden, d, 1.0f, dy, d, w2, hidden, 0.0f, dact, hidden, stream);
  Gemm(true, false, d, hidden, n, 1.0f, dy, d, act, hidden, bw, dw2, hidden, stream);
  SwigluActivationBackward(h1, h3, dact, static_cast<size_t>(n) * hidden, dact, dh3, stream);
  Gemm(false, false, n, d, hidden, 1.0f, dact, hidden, w1, d, accumulate_dx ? 1.0f : 0.0f, dx, d,
       stream);
  Gemm(true, false, hidden, d, n, 1.0f, dact, hidden, x, d, bw, dw1, d, stream);
  Gemm(false, false, n, d, hidden, 1.0f, dh3, hidden, w3, d, 1.0f, dx, d, stream);
  Gemm(true, false, hidden, d, n, 1.0f, dh3, hidden, x, d, bw, dw3, d, stream);
}

template void SwigluForward<float>(const float*, int, int, int, const float*, const float*,
                                   const float*, float*, float*, float*, float*, cudaStream_t);
template void SwigluBackward<float>(const float*, int, int, int, const float*, const float*,
                                    const float*, const float*, const float*, const float*,
                                    const float*, float*, float*, float*, float*, float*, bool,
                                    bool, cudaStream_t);

// ---------------------------------------------------------------- experts

namespace {
// train.kernels.experts "device" (KernelSelection::experts 3) behind the host-offset entry points:
// the offsets go back to the device for the device-shaped grouped GEMM (grouped_gemm_device.h).
// A caller holding the dispatch plan's device offsets calls MoeExpertsForwardDevice /
// MoeExpertsBackwardDevice directly and needs no host copy at all. Stream-ordered reuse, as
// ThreadScratch: one stream per thread.
struct DeviceExpertsStaging {
  DeviceBuffer<int64_t> offsets;
  DeviceBuffer<unsigned char> workspace;
};
bool DeviceExpertsSelected() { return SelectedKernels().experts == 3; }
DeviceExpertsStaging& StageDeviceOffsets(const int64_t* host_offsets, int experts,
                                         cudaStream_t stream) {
  thread_local DeviceExpertsStaging s;
  if (s.offsets.size() < size_t(experts) + 1) s.offsets.Resize(experts + 1);
  const size_t bytes = DeviceGroupedGemmWorkspaceBytes(experts);
  if (s.workspace.size() < bytes) s.workspace.Resize(bytes);
  MOELAB_CUDA_CHECK(cudaMemcpyAsync(s.offsets.data(), host_offsets, sizeof(int64_t) * (experts + 1),
                                    cudaMemcpyHostToDevice, stream));
  return s;
}
}  // namespace

template <typename T>
void MoeExpertsForward(const T* xe, const int64_t* host_offsets, int experts, int d, int hidden,
                       const T* w1, const T* w3, const T* w2, T* h1, T* h3, T* act, T* ye,
                       cudaStream_t stream) {
  if constexpr (std::is_same_v<T, bf16>) {
    if (DeviceExpertsSelected()) {
      DeviceExpertsStaging& s = StageDeviceOffsets(host_offsets, experts, stream);
      MoeExpertsForwardDevice(xe, s.offsets.data(), experts, d, hidden, w1, w3, w2, h1, h3, act, ye,
                              s.workspace.data(), stream);
      return;
    }
  }
  const long wsize = static_cast<long>(hidden) * d;
  std::vector<GemmGroup<T, T>> g1, g3, g2;
  for (int e = 0; e < experts; ++e) {
    const int64_t r0 = host_offsets[e];
    const int rows = static_cast<int>(host_offsets[e + 1] - r0);
    if (rows == 0) continue;
    g1.push_back({rows, hidden, d, xe + r0 * d, d, w1 + e * wsize, d, h1 + r0 * hidden, hidden});
    g3.push_back({rows, hidden, d, xe + r0 * d, d, w3 + e * wsize, d, h3 + r0 * hidden, hidden});
    g2.push_back(
        {rows, d, hidden, act + r0 * hidden, hidden, w2 + e * wsize, hidden, ye + r0 * d, d});
  }
  const int64_t rows = host_offsets[experts] - host_offsets[0];
  GemmGrouped(false, true, 1.0f, 0.0f, g1, stream);
  GemmGrouped(false, true, 1.0f, 0.0f, g3, stream);
  const int64_t r0 = host_offsets[0];
  SwigluActivation(h1 + r0 * hidden, h3 + r0 * hidden, static_cast<size_t>(rows) * hidden,
                   act + r0 * hidden, stream);
  GemmGrouped(false, true, 1.0f, 0.0f, g2, stream);
}

template <typename T>
void MoeExpertsBackward(const T* xe, const int64_t* host_offsets, int experts, int d, int hidden,
                        const T* w1, const T* w3, const T* w2, const T* h1, const T* h3,
                        const T* act, const T* dye, T* dxe, float* dw1, float* dw3, float* dw2,
                        T* scratch, cudaStream_t stream) {
  if constexpr (std::is_same_v<T, bf16>) {
    if (DeviceExpertsSelected()) {  // scratch then holds dh1|dh3 side by side in each row
      DeviceExpertsStaging& s = StageDeviceOffsets(host_offsets, experts, stream);
      MoeExpertsBackwardDevice(xe, s.offsets.data(), experts, d, hidden, w1, w3, w2, h1, h3, act,
                               dye, dxe, dw1, dw3, dw2, scratch, s.workspace.data(), stream);
      return;
    }
  }
  const long wsize = static_cast<long>(hidden) * d;
  const int64_t rows = host_offsets[experts] - host_offsets[0];
  T* dact = scratch;  // [rows, H], becomes dh1
  T* dh3 = scratch + rows * hidden;
  std::vector<GemmGroup<T, T>> gdact, gdx1, gdx3;
  for (int e = 0; e < experts; ++e) {
    const int64_t r0 = host_offsets[e];
    const int r = static_cast<int>(host_offsets[e + 1] - r0);
    if (r == 0) continue;
    const long o = r0 - host_offsets[0];
    gdact.push_back(
        {r, hidden, d, dye + r0 * d, d, w2 + e * wsize, hidden, dact + o * hidden, hidden});
    gdx1.push_back({r, d, hidden, dact + o * hidden, hidden, w1 + e * wsize, d, dxe + r0 * d, d});
    gdx3.push_back({r, d, hidden, dh3 + o * hidden, hidden, w3 + e * wsize, d, dxe + r0 * d, d});
  }
  const T* h1_0 = h1 + host_offsets[0] * hidden;
  const T* h3_0 = h3 + host_offsets[0] * hidden;
  GemmGrouped(false, false, 1.0f, 0.0f, gdact, stream);
  SwigluActivationBackward(h1_0, h3_0, dact, static_cast<size_t>(rows) * hidden, dact, dh3, stream);
  GemmGrouped(false, false, 1.0f, 0.0f, gdx1, stream);
  GemmGrouped(false, false, 1.0f, 1.0f, gdx3, stream);
  MoeExpertsWeightGrads(xe, host_offsets, experts, d, hidden, act, dye, dact, dh3, dw1, dw3, dw2,
                        stream);
}

template <typename T>
void MoeExpertsWeightGrads(const T* xe, const int64_t* host_offsets, int experts, int d, int hidden,
                           const T* act, const T* dye, const T* dh1, const T* dh3, float* dw1,
                           float* dw3, float* dw2, cudaStream_t stream) {
  const long wsize = static_cast<long>(hidden) * d;
  std::vector<GemmGroup<T, float>> gdw2, gdw1, gdw3;
  for (int e = 0; e < experts; ++e) {
    const int64_t r0 = host_offsets[e];
    const int r = static_cast<int>(host_offsets[e + 1] - r0);
    if (r == 0) {
      // A GEMM with an empty inner dimension is not guaranteed to write C.
      for (float* g : {dw1, dw3, dw2}) {
        MOELAB_CUDA_CHECK(cudaMemsetAsync(g + e * wsize, 0, sizeof(float) * wsize, stream));
      }
      continue;
    }
    const long o = r0 - host_offsets[0];
    gdw2.push_back(
        {d, hidden, r, dye + r0 * d, d, act + r0 * hidden, hidden, dw2 + e * wsize, hidden});
    gdw1.push_back({hidden, d, r, dh1 + o * hidden, hidden, xe + r0 * d, d, dw1 + e * wsize, d});
    gdw3.push_back({hidden, d, r, dh3 + o * hidden, hidden, xe + r0 * d, d, dw3 + e * wsize, d});
  }
  GemmGrouped(true, false, 1.0f, 0.0f, gdw2, stream);
  GemmGrouped(true, false, 1.0f, 0.0f, gdw1, stream);
  GemmGrouped(true, false, 1.0f, 0.0f, gdw3, stream);
}

int MoeChunkRows(int64_t nk, int experts) {
  const int64_t quarter = nk / (4 * static_cast<int64_t>(std::max(experts, 1))) / 8 * 8;
  return static_cast<int>(std::max<int64_t>(8, quarter));
}

int64_t MoeChunkedRows(int64_t nk, int experts) {
  return nk + static_cast<int64_t>(experts) * MoeChunkRows(nk, experts);
}

MoeChunks PlanMoeChunks(const int64_t* host_offsets, int experts, int rows) {
  MoeChunks ch;
  ch.rows = rows;
  std::vector<int64_t> first, end;
  for (int e = 0; e < experts; ++e) {
    int round = 0;
    for (int64_t r = host_offsets[e]; r < host_offsets[e + 1]; r += rows, ++round) {
      ch.expert.push_back(e);
      ch.round.push_back(round);
      first.push_back(r);
      end.push_back(host_offsets[e + 1]);
    }
    ch.rounds = std::max(ch.rounds, round);
  }
  ch.table = first;
  ch.table.insert(ch.table.end(), end.begin(), end.end());
  return ch;
}

namespace {
// Chunk b's block of a chunked buffer of `width` columns (T = const bf16 for an operand).
template <typename T>
std::vector<T*> ChunkBlocks(T* base, const MoeChunks& ch, int width) {
  std::vector<T*> v(ch.count());
  for (int b = 0; b < ch.count(); ++b) v[b] = base + static_cast<int64_t>(b) * ch.rows * width;
  return v;
}
// Each chunk's expert's matrix of `size` elements.
template <typename T>
std::vector<T*> PerExpert(T* base, const MoeChunks& ch, int64_t size) {
  std::vector<T*> v(ch.count());
  for (int b = 0; b < ch.count(); ++b) v[b] = base + ch.expert[b] * size;
  return v;
}
// dW_e = Σ over e's chunks of op(A_chunk)·B_chunk, in rounds: round r takes every expert's r-th
// chunk (beta 0 in round 0, then 1), so each sum runs in chunk order whatever the batch.
void WeightGradRounds(const MoeChunks& ch, int m, int n, const std::vector<const bf16*>& a, int lda,
                      const std::vector<const bf16*>& b, int ldb, float* dw, int64_t size,
                      cudaStream_t stream) {
  for (int r = 0; r < ch.rounds; ++r) {
    std::vector<const bf16*> ra, rb;
    std::vector<float*> rc;
    for (int i = 0; i < ch.count(); ++i) {
      if (ch.round[i] != r) continue;
      ra.push_back(a[i]), rb.push_back(b[i]), rc.push_back(dw + ch.expert[i] * size);
    }
    GemmPointerBatched<bf16, float>(true, false, m, n, ch.rows, 1.0f, ra, lda, rb, ldb,
                                    r > 0 ? 1.0f : 0.0f, rc, n, stream);
  }
}
}  // namespace

void MoeExpertsForwardChunked(const bf16* xc, const MoeChunks& ch, int d, int hidden,
                              const bf16* w1, const bf16* w3, const bf16* w2, bf16* h1, bf16* h3,
                              bf16* act, bf16* yc, cudaStream_t stream) {
  if (ch.count() == 0) return;
  const int64_t w = static_cast<int64_t>(hidden) * d;
  const int R = ch.rows;
  const auto x = ChunkBlocks(xc, ch, d);
  GemmPointerBatched<bf16, bf16>(false, true, R, hidden, d, 1.0f, x, d, PerExpert(w1, ch, w), d,
                                 0.0f, ChunkBlocks(h1, ch, hidden), hidden, stream);
  GemmPointerBatched<bf16, bf16>(false, true, R, hidden, d, 1.0f, x, d, PerExpert(w3, ch, w), d,
                                 0.0f, ChunkBlocks(h3, ch, hidden), hidden, stream);
  SwigluActivation(h1, h3, static_cast<size_t>(ch.count()) * R * hidden, act, stream);
  GemmPointerBatched<bf16, bf16>(
      false, true, R, d, hidden, 1.0f, ChunkBlocks<const bf16>(act, ch, hidden), hidden,
      PerExpert(w2, ch, w), hidden, 0.0f, ChunkBlocks(yc, ch, d), d, stream);
}

void MoeExpertsBackwardChunked(const bf16* xc, const MoeChunks& ch, int experts, int d, int hidden,
                               const bf16* w1, const bf16* w3, const bf16* w2, const bf16* h1,
                               const bf16* h3, const bf16* act, const bf16* dyc, bf16* dxc,
                               float* dw1, float* dw3, float* dw2, bf16* scratch,
                               cudaStream_t stream) {
  const int64_t w = static_cast<int64_t>(hidden) * d;
  // An expert without rows has no chunk: its gradients are zero.
  std::vector<bool> has(experts, false);
  for (int e : ch.expert) has[e] = true;
  for (int e = 0; e < experts; ++e) {
    if (has[e]) continue;
    for (float* g : {dw1, dw3, dw2}) {
      MOELAB_CUDA_CHECK(cudaMemsetAsync(g + e * w, 0, sizeof(float) * w, stream));
    }
  }
  if (ch.count() == 0) return;
  const int R = ch.rows;
  bf16* dact = scratch;  // [B·R, H], becomes dh1
  bf16* dh3 = scratch + static_cast<int64_t>(ch.count()) * R * hidden;
  const auto dy = ChunkBlocks(dyc, ch, d);
  GemmPointerBatched<bf16, bf16>(false, false, R, hidden, d, 1.0f, dy, d, PerExpert(w2, ch, w),
                                 hidden, 0.0f, ChunkBlocks(dact, ch, hidden), hidden, stream);
  WeightGradRounds(ch, d, hidden, dy, d, ChunkBlocks(act, ch, hidden), hidden, dw2, w, stream);
  SwigluActivationBackward(h1, h3, dact, static_cast<size_t>(ch.count()) * R * hidden, dact, dh3,
                           stream);
  GemmPointerBatched<bf16, bf16>(false, false, R, d, hidden, 1.0f,
                                 ChunkBlocks<const bf16>(dact, ch, hidden), hidden,
                                 PerExpert(w1, ch, w), d, 0.0f, ChunkBlocks(dxc, ch, d), d, stream);
  GemmPointerBatched<bf16, bf16>(false, false, R, d, hidden, 1.0f,
                                 ChunkBlocks<const bf16>(dh3, ch, hidden), hidden,
                                 PerExpert(w3, ch, w), d, 1.0f, ChunkBlocks(dxc, ch, d), d, stream);
  const auto x = ChunkBlocks(xc, ch, d);
  WeightGradRounds(ch, hidden, d, ChunkBlocks<const bf16>(dact, ch, hidden), hidden, x, d, dw1, w,
                   stream);
  WeightGradRounds(ch, hidden, d, ChunkBlocks<const bf16>(dh3, ch, hidden), hidden, x, d, dw3, w,
                   stream);
}

template void MoeExpertsForward<float>(const float*, const int64_t*, int, int, int, const float*,
                                       const float*, const float*, float*, float*, float*, float*,
                                       cudaStream_t);
template void MoeExpertsForward<bf16>(const bf16*, const int64_t*, int, int, int, const bf16*,
                                      const bf16*, const bf16*, bf16*, bf16*, bf16*, bf16*,
                                      cudaStream_t);
template void MoeExpertsBackward<float>(const float*, const int64_t*, int, int, int, const float*,
                                        const float*, const float*, const float*, const float*,
                                        const float*, const float*, float*, float*, float*, float*,
                                        float*, cudaStream_t);
template void MoeExpertsWeightGrads<float>(const float*, const int64_t*, int, int, int,
                                           const float*, const float*, const float*, const float*,
                                           float*, float*, float*, cudaStream_t);
template void MoeExpertsWeightGrads<bf16>(const bf16*, const int64_t*, int, int, int, const bf16*,
                                          const bf16*, const bf16*, const bf16*, float*, float*,
                                          float*, cudaStream_t);
template void MoeExpertsBackward<bf16>(const bf16*, const int64_t*, int, int, int, const bf16*,
                                       const bf16*, const bf16*, const bf16*, const bf16*,
                                       const bf16*, const bf16*, bf16*, float*, float*, float*,
                                       bf16*, cudaStream_t);

}  // namespace moelab::cuda
