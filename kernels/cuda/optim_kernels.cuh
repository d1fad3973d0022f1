// Device code of the optimizer's elementwise kernels (kernels/cuda/optim.h): AdamW over a table
// of segments and Muon's momentum and update over a table of tensors, one launch each, the
// updates writing the bf16 compute copy of the weights in the same pass when given one. Every
// operation is the CPU loop's (core/optim/adamw.cc, muon.cc) with round-to-nearest intrinsics,
// so nvcc cannot contract them into FMAs: the fp32 results are bit-equal to the CPU's.
//
// Internal header, included by elementwise.cu and by tests/cuda_kernels/optim_emulation_test.cc,
// which runs these very kernels on the CPU under tests/cuda_kernels/emulation/cuda_emulation.h.
// The kernels are static: the emulation test also links the library that compiles them for the
// GPU, and the two versions must not meet at link time.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/optim.h"

namespace moelab::cuda::optim {

// The element loop of a table kernel: blockIdx.y is the row of the table, the x blocks stride
// over its `size` elements.
#define MOELAB_TABLE_STRIDE(i, size)                                             \
  for (uint64_t i = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x; i < (size); \
       i += uint64_t(gridDim.x) * blockDim.x)

__device__ __forceinline__ float Widen(float x) { return x; }
__device__ __forceinline__ float Widen(bf16 x) { return __bfloat162float(x); }
__device__ __forceinline__ void Narrow(float x, float* out) { *out = x; }
__device__ __forceinline__ void Narrow(float x, bf16* out) { *out = __float2bfloat16(x); }

// One element of AdamW: the loop of core/optim/adamw.cc operation for operation.
__device__ __forceinline__ void AdamWElement(float& w, float gi, float& m, float& v,
                                             const AdamWScalars& s, float decay) {
  const float mi = __fadd_rn(__fmul_rn(s.b1, m), __fmul_rn(1.0f - s.b1, gi));
  const float vi = __fadd_rn(__fmul_rn(s.b2, v), __fmul_rn(__fmul_rn(1.0f - s.b2, gi), gi));
  m = mi;
  v = vi;
  const float denom = __fadd_rn(__fmul_rn(sqrtf(vi), s.inv_sqrt_c2), s.eps);
  w = __fsub_rn(__fmul_rn(w, decay), __fdiv_rn(__fmul_rn(s.step_size, mi), denom));
}

// blockIdx.y = segment; w16 (null: none) gets the rounding of the updated fp32 weight.
static __global__ void AdamWFusedKernel(const AdamWSegment* segs, float* w_all, const float* g_all,
                                        float* m_all, float* v_all, bf16* w16_all, AdamWScalars s) {
  const AdamWSegment seg = segs[blockIdx.y];
  float* w = w_all + seg.offset;
  const float* g = g_all + seg.offset;
  float* m = m_all + seg.state_offset;
  float* v = v_all + seg.state_offset;
  bf16* w16 = w16_all ? w16_all + seg.offset : nullptr;
  const float decay = seg.decay ? s.decay : 1.0f;
  MOELAB_TABLE_STRIDE(i, seg.size) {
    float wi = w[i], mi = m[i], vi = v[i];
    AdamWElement(wi, g[i], mi, vi, s, decay);
    w[i] = wi, m[i] = mi, v[i] = vi;
    if (w16) w16[i] = __float2bfloat16(wi);
  }
}

// Muon's momentum m = μ·m + g and the Newton–Schulz input g + μ·m (Nesterov) or m written to the
// tensor's bank slot (fp32 or bf16).
template <typename U>
__device__ __forceinline__ void MuonMomentumElement(float g, float& m, U* u, float mu,
                                                    bool nesterov) {
  const float mi = __fadd_rn(__fmul_rn(mu, m), g);
  m = mi;
  Narrow(nesterov ? __fadd_rn(g, __fmul_rn(mu, mi)) : mi, u);
}

template <typename U>
static __global__ void MuonMomentumFusedKernel(const MuonSegment* ts, const float* g_all,
                                               float* m_all, U* bank, float mu, bool nesterov) {
  const MuonSegment t = ts[blockIdx.y];
  const float* g = g_all + t.offset;
  float* m = m_all + t.momentum_offset;
  U* u = bank + t.bank_offset;
  MOELAB_TABLE_STRIDE(i, t.size) MuonMomentumElement(g[i], m[i], u + i, mu, nesterov);
}

// W ← W·decay − step_size·O.
template <typename U>
__device__ __forceinline__ float MuonApplyElement(float w, U o, float decay, float step_size) {
  return __fsub_rn(__fmul_rn(w, decay), __fmul_rn(step_size, Widen(o)));
}

// The step size lr·s is formed in double and rounded once, as core/optim/muon.cc does; w16 (null:
// none) gets the rounding of the updated weight.
template <typename U>
static __global__ void MuonApplyFusedKernel(const MuonSegment* ts, float* w_all, const U* bank,
                                            double lr, float decay, bf16* w16_all) {
  const MuonSegment t = ts[blockIdx.y];
  float* w = w_all + t.offset;
  const U* o = bank + t.bank_offset;
  bf16* w16 = w16_all ? w16_all + t.offset : nullptr;
  const float step_size = static_cast<float>(lr * static_cast<double>(t.scale));
  MOELAB_TABLE_STRIDE(i, t.size) {
    const float wi = MuonApplyElement(w[i], o[i], decay, step_size);
    w[i] = wi;
    if (w16) w16[i] = __float2bfloat16(wi);
  }
}

#undef MOELAB_TABLE_STRIDE

}  // namespace moelab::cuda::optim
