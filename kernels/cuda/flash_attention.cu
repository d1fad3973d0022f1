#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/flash_attention.h"
#include "kernels/cuda/flash_attention_kernels.cuh"
#include "kernels/cuda/flash_backward_mma.cuh"
#include "kernels/cuda/flash_forward_mma.cuh"

namespace moelab::cuda {
namespace {

using namespace flash;  // NOLINT: the kernels and their constants

__global__ void FillKernel(float* x, long n, float value) {
  const long i = long(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) x[i] = value;
}

// The instantiated (qk_dim, v_dim) pairs; the dispatch below must list the same.
constexpr int kShapes[][2] = {{16, 16}, {32, 32}, {64, 64},  {128, 128},
                              {48, 32}, {96, 64}, {192, 128}};

// Calls f.Run<DQK, DV>() for a's head dims (f: ForwardLaunch or BackwardLaunch below).
template <typename F>
void WithShape(const AttentionDims& a, const F& f) {
  if (a.qk_dim == 16 && a.v_dim == 16) return f.template Run<16, 16>();
  if (a.qk_dim == 32 && a.v_dim == 32) return f.template Run<32, 32>();
  if (a.qk_dim == 64 && a.v_dim == 64) return f.template Run<64, 64>();
  if (a.qk_dim == 128 && a.v_dim == 128) return f.template Run<128, 128>();
  if (a.qk_dim == 48 && a.v_dim == 32) return f.template Run<48, 32>();
  if (a.qk_dim == 96 && a.v_dim == 64) return f.template Run<96, 64>();
  if (a.qk_dim == 192 && a.v_dim == 128) return f.template Run<192, 128>();
  throw std::invalid_argument("flash attention: unsupported head dims " + std::to_string(a.qk_dim) +
                              "/" + std::to_string(a.v_dim));
}

void CheckAligned(const void* ptr, const char* what, const char* who) {
  if (reinterpret_cast<uintptr_t>(ptr) % 16 != 0) {
    throw std::invalid_argument(std::string(who) + ": " + what + " is not 16-byte aligned");
  }
}

void CheckSupported(const AttentionDims& a, size_t elem_bytes, const char* who) {
  ValidateAttentionDims(a, who);
  std::string why;
  if (!FlashAttentionSupported(a, elem_bytes, &why)) {
    throw std::invalid_argument(std::string(who) + ": " + why);
  }
}

template <typename Kernel>
void AllowSmem(Kernel kernel, size_t bytes) {
  MOELAB_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(bytes)));
}

int Tiles(int seq) { return (seq + kTile - 1) / kTile; }

// Shared memory per block of the kernels of a shape (the largest of the forward and backward
// kernels: the wmma ones, except the tuned mma forward's 128-key tiles at head dims ≤ 64).
struct SmemQuery {
  size_t* bytes;
  template <int DQK, int DV>
  void Run() const {
    *bytes = std::max({FwdSmem<DQK, DV>::kBytes, BwdSmem<DQK, DV>::kBytes,
                       FwdMmaSmemOf<DQK, DV, /*kTuned=*/true>::kBytes});
  }
};

// The head-dim pairs the mma.sync forward (flash_forward_mma.cuh) covers: all of them (sm_90
// -Xptxas -v: no spills at 192/128, the largest); the others would run the wmma forward.
constexpr bool MmaForwardCovers(int /*dqk*/, int /*dv*/) { return true; }

// The shapes with RoPE-fusing kernels (flash_rope.cuh): fp32 inputs, qk_dim = v_dim (non-MLA).
template <typename T>
constexpr bool RopeInstantiated(int dqk, int dv) {
  return std::is_same_v<T, float> && dqk == dv;
}

// The mma kernels are the only ones that fuse RoPE; FlashRopeSupported refused the rest.
[[noreturn]] void NoRopeKernel(const char* who) {
  throw std::logic_error(std::string(who) + ": no RoPE-fusing kernel for this shape");
}

template <typename T>
struct ForwardLaunch {
  Params p;
  dim3 grid;
  cudaStream_t stream;
  const T *q, *k, *v;
  T* out;
  float *lse, *pair_max;
  FlashKernel kernel;  // FlashKernelInUse()
  RopeArgs rope;       // null tables: none
  template <int DQK, int DV>
  void Run() const {
    if (rope.cos != nullptr) {
      if constexpr (RopeInstantiated<T>(DQK, DV)) return Mma<DQK, DV, true>();
      NoRopeKernel("cuda::FlashAttentionForward");
    }
    if constexpr (MmaForwardCovers(DQK, DV)) {
      if (kernel != FlashKernel::kWmma) return Mma<DQK, DV, false>();
    }
    auto kernel = FlashForwardKernel<T, DQK, DV>;
    const size_t smem = FwdSmem<DQK, DV>::kBytes;
    AllowSmem(kernel, smem);
    kernel<<<grid, kThreads, smem, stream>>>(p, q, k, v, out, lse, pair_max);
  }
  template <int DQK, int DV, bool kRope>
  void Mma() const {
    if (kernel == FlashKernel::kMma) return Mma<DQK, DV, kRope, true>();
    Mma<DQK, DV, kRope, false>();
  }
  template <int DQK, int DV, bool kRope, bool kTuned>
  void Mma() const {
    auto mma = FlashForwardMmaKernel<T, DQK, DV, kRope, kTuned>;
    const size_t smem = FwdMmaSmemOf<DQK, DV, kTuned>::kBytes;
    constexpr int tile = kTile * MmaRowBlocks(DQK, DV);  // query rows per block
    AllowSmem(mma, smem);
    mma<<<dim3(grid.x, (p.seq + tile - 1) / tile), kThreads, smem, stream>>>(p, q, k, v, out, lse,
                                                                             pair_max, rope);
  }
};

template <typename T>
struct BackwardLaunch {
  Params p;
  const AttentionDims& a;
  cudaStream_t stream;
  const T *q, *k, *v;
  const float *lse, *dvec;
  const T* dout;
  float *dq, *dk, *dv;
  RopeArgs rope;  // null tables: none
  template <int DQK, int DV>
  void Run() const {
    if (rope.cos != nullptr) {
      if constexpr (RopeInstantiated<T>(DQK, DV)) return Mma<DQK, DV, true>();
      NoRopeKernel("cuda::FlashAttentionBackward");
    }
    if constexpr (MmaBackwardCovers<DQK, DV>()) {
      if (FlashKernelInUse() != FlashKernel::kWmma) return Mma<DQK, DV, false>();
    }
    const dim3 kv_grid(a.batch * a.kv_heads, Tiles(a.seq)), q_grid(a.batch * a.heads, Tiles(a.seq));
    const size_t smem = BwdSmem<DQK, DV>::kBytes;
    auto kv = FlashBackwardKvKernel<T, DQK, DV>;
    AllowSmem(kv, smem);
    kv<<<kv_grid, kThreads, smem, stream>>>(p, q, k, v, lse, dvec, dout, dk, dv);
    auto qk = FlashBackwardQKernel<T, DQK, DV>;
    AllowSmem(qk, smem);
    qk<<<q_grid, kThreads, smem, stream>>>(p, q, k, v, lse, dvec, dout, dq);
  }
  template <int DQK, int DV, bool kRope>
  void Mma() const {
    if (FlashKernelInUse() == FlashKernel::kMma) return Mma<DQK, DV, kRope, true>();
    Mma<DQK, DV, kRope, false>();
  }
  template <int DQK, int DV, bool kRope, bool kTuned>
  void Mma() const {
    auto kv = FlashBackwardKvMmaKernel<T, DQK, DV, kRope, kTuned>;
    constexpr size_t kv_smem = BwdMmaKvSmemBytes<DQK, DV, kTuned>();
    AllowSmem(kv, kv_smem);
    kv<<<dim3(a.batch * a.kv_heads, Tiles(a.seq)), kThreads, kv_smem, stream>>>(
        p, q, k, v, lse, dvec, dout, dk, dv, rope);
    auto qk = FlashBackwardQMmaKernel<T, DQK, DV, kRope, kTuned>;
    constexpr size_t q_smem = BwdMmaQSmem<DQK, DV, kTuned>::kBytes;
    AllowSmem(qk, q_smem);
    constexpr int kRows = kDqQueryTile<DQK, DV>;  // its query tile: 64 or 128 rows
    qk<<<dim3(a.batch * a.heads, (a.seq + kRows - 1) / kRows), kThreads, q_smem, stream>>>(
        p, q, k, v, lse, dvec, dout, dq, rope);
  }
};

// The kernels' rope argument from the launcher's, after checking it (throws naming `who`).
RopeArgs CheckedRope(const AttentionDims& a, size_t elem_bytes, const FlashRope* rope,
                     const char* who) {
  if (rope == nullptr) return {};
  std::string why;
  if (!FlashRopeSupported(a, elem_bytes, rope->rot_dim, &why)) {
    throw std::invalid_argument(std::string(who) + ": RoPE cannot be fused: " + why);
  }
  if (rope->cos == nullptr || rope->sin == nullptr) {
    throw std::invalid_argument(std::string(who) + ": RoPE tables are null");
  }
  CheckAligned(rope->cos, "the RoPE cos table", who),
      CheckAligned(rope->sin, "the RoPE sin table", who);
  return {rope->cos, rope->sin};
}

}  // namespace

FlashKernel FlashKernelInUse() {
  const KernelSelection k = SelectedKernels();
  if (!k.attention_mma) return FlashKernel::kWmma;
  return k.attention_mma64 ? FlashKernel::kMma64 : FlashKernel::kMma;
}

bool FlashRopeFused() { return SelectedKernels().rope_fused; }

bool FlashRopeSupported(const AttentionDims& a, size_t elem_bytes, int rot_dim, std::string* why) {
  auto no = [&](const std::string& reason) {
    if (why) *why = reason;
    return false;
  };
  if (elem_bytes != 4) {
    return no("q and k are not fp32 (bf16 tiles are copied by cp.async, never through registers)");
  }
  if (FlashKernelInUse() == FlashKernel::kWmma) {
    return no("the wmma kernels do not fuse RoPE (train.kernels.attention_kernel \"mma\" does)");
  }
  if (rot_dim != a.qk_dim || a.qk_dim != a.v_dim) {
    return no("rotary dims " + std::to_string(rot_dim) + " with head dims qk " +
              std::to_string(a.qk_dim) + " / v " + std::to_string(a.v_dim) +
              ": fused only where the whole head rotates and qk_dim = v_dim (not MLA)");
  }
  return FlashAttentionSupported(a, elem_bytes, why);
}

bool FlashAttentionSupported(const AttentionDims& a, size_t elem_bytes, std::string* why) {
  auto no = [&](const std::string& reason) {
    if (why) *why = reason;
    return false;
  };
  bool shape = false;
  for (const auto& s : kShapes) shape = shape || (s[0] == a.qk_dim && s[1] == a.v_dim);
  if (!shape) {
    return no("head dims qk " + std::to_string(a.qk_dim) + " / v " + std::to_string(a.v_dim) +
              " are not instantiated (16/16, 32/32, 64/64, 128/128, 48/32, 96/64, 192/128)");
  }
  if (a.kv_heads <= 0 || a.heads % a.kv_heads != 0) return no("heads not a multiple of kv_heads");
  if (elem_bytes != 2 && elem_bytes != 4) return no("elements must be bf16 or fp32");
  for (int ld : {a.ldq, a.ldk, a.ldv, a.ldo}) {
    if (ld * elem_bytes % 16 != 0) return no("a row stride is not a multiple of 16 bytes");
  }
  if (Tiles(a.seq) > 65535) return no("sequence longer than 65535 tiles of 64");
  if (static_cast<long>(a.batch) * a.heads > 0x7fffffffL) return no("batch·heads above 2^31");
  int device = 0, optin = 0;
  size_t smem = 0;
  WithShape(a, SmemQuery{&smem});
  if (cudaGetDevice(&device) == cudaSuccess &&
      cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) ==
          cudaSuccess &&
      smem > static_cast<size_t>(optin)) {
    return no("needs " + std::to_string(smem) +
              " bytes of shared memory per block, the device allows " + std::to_string(optin));
  }
  cudaGetLastError();  // no device: the queries above fail harmlessly
  if (why) why->clear();
  return true;
}

size_t FlashAttentionScratchSize(const AttentionDims& a) {
  return static_cast<size_t>(a.batch) * a.heads * a.seq;
}

template <typename T>
void FlashAttentionForward(const AttentionDims& a, const T* q, const T* k, const T* v, T* out,
                           float* lse, float* pair_max, cudaStream_t stream,
                           const FlashRope* rope) {
  const char* who = "cuda::FlashAttentionForward";
  CheckSupported(a, sizeof(T), who);
  const RopeArgs rope_args = CheckedRope(a, sizeof(T), rope, who);
  if (a.batch == 0 || a.seq == 0) return;
  CheckAligned(q, "q", who), CheckAligned(k, "k", who), CheckAligned(v, "v", who);
  const FlashKernel kernel = FlashKernelInUse();
  const bool mma = kernel != FlashKernel::kWmma;
  // The mma forward stores out in pairs (8 bytes for fp32): a misaligned out would fault on the
  // device instead of throwing here. (The wmma forward stores single elements.)
  if (mma || rope_args.cos != nullptr) CheckAligned(out, "out", who);
  const long pairs = long(a.batch) * a.heads;
  FillKernel<<<(pairs + 255) / 256, 256, 0, stream>>>(pair_max, pairs, -INFINITY);
  WithShape(a, ForwardLaunch<T>{MakeParams(a), dim3(pairs, Tiles(a.seq)), stream, q, k, v, out, lse,
                                pair_max, kernel, rope_args});
  CheckLaunch(who);
}

template <typename T>
void FlashAttentionBackward(const AttentionDims& a, const T* q, const T* k, const T* v,
                            const T* out, const float* lse, const T* dout, float* dq, float* dk,
                            float* dv, float* scratch, cudaStream_t stream, const FlashRope* rope) {
  const char* who = "cuda::FlashAttentionBackward";
  CheckSupported(a, sizeof(T), who);
  const RopeArgs rope_args = CheckedRope(a, sizeof(T), rope, who);
  if (a.batch == 0 || a.seq == 0) return;
  CheckAligned(q, "q", who), CheckAligned(k, "k", who), CheckAligned(v, "v", who);
  CheckAligned(dout, "dout", who);
  const Params p = MakeParams(a);
  const long rows = long(a.batch) * a.heads * a.seq;
  RowDotKernel<T><<<(rows * 32 + 255) / 256, 256, 0, stream>>>(p, a.v_dim, out, dout, scratch);
  CheckLaunch("cuda::FlashAttentionBackward D");
  WithShape(a, BackwardLaunch<T>{p, a, stream, q, k, v, lse, scratch, dout, dq, dk, dv, rope_args});
  CheckLaunch(who);
}

template void FlashAttentionForward<float>(const AttentionDims&, const float*, const float*,
                                           const float*, float*, float*, float*, cudaStream_t,
                                           const FlashRope*);
template void FlashAttentionForward<bf16>(const AttentionDims&, const bf16*, const bf16*,
                                          const bf16*, bf16*, float*, float*, cudaStream_t,
                                          const FlashRope*);
template void FlashAttentionBackward<float>(const AttentionDims&, const float*, const float*,
                                            const float*, const float*, const float*, const float*,
                                            float*, float*, float*, float*, cudaStream_t,
                                            const FlashRope*);
template void FlashAttentionBackward<bf16>(const AttentionDims&, const bf16*, const bf16*,
                                           const bf16*, const bf16*, const float*, const bf16*,
                                           float*, float*, float*, float*, cudaStream_t,
                                           const FlashRope*);

}  // namespace moelab::cuda
