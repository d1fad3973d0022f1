// The device MoE layer of the CUDA backend (core/model/cuda_backend.cc): core/model/moe.cc's Route →
// Dispatch → experts → Combine and back over device buffers. fp32 mode runs every op in fp32
// (the twin of the CPU layer); bf16 mode runs the routed and shared experts as bf16 GEMMs with
// fp32 accumulation on the model's bf16 weight copy, with bf16 expert activations, and writes the
// weight gradients straight into the fp32 master gradients (router, routing, gates and the
// layer's output stay fp32). Only included by CUDA builds.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/config.h"
#include "kernels/cuda/device.h"

namespace moelab::cudamodel {

// One MoE layer's weights (device pointers into the model's arenas). The *b pointers are the same
// offsets in the bf16 compute copy (bf16 mode only, else null); s* are null without shared
// experts.
struct MoeLayerParams {
  const float *router = nullptr, *w1 = nullptr, *w3 = nullptr, *w2 = nullptr;
  const float *s1 = nullptr, *s3 = nullptr, *s2 = nullptr, *bias = nullptr;
  const cuda::bf16 *w1b = nullptr, *w3b = nullptr, *w2b = nullptr;
  const cuda::bf16 *s1b = nullptr, *s3b = nullptr, *s2b = nullptr;
};
// Their fp32 gradients (overwritten by Backward).
struct MoeLayerGrads {
  float *router = nullptr, *w1 = nullptr, *w3 = nullptr, *w2 = nullptr;
  float *s1 = nullptr, *s3 = nullptr, *s2 = nullptr;
};

// Buffers every MoE layer uses only inside its own forward or backward (router logits, then
// their gradient; gate gradients; expert input gradients; the extra shared experts' sums (fp32
// mode); the bf16 casts of the layer input and output gradient (bf16 mode); the SwiGLU backward
// scratch): one set per model, sized for the largest micro-batch.
struct MoeScratch {
  cuda::DeviceBuffer<float> logits, dgates, dxe, sy, scratch;
  cuda::DeviceBuffer<cuda::bf16> dxe16, scratch16, xb16, dyb16;
  int cap = 0;
  // Bytes for `rows` tokens; Reserve and the memory plan (PlanCudaMemory) share this arithmetic.
  static size_t Bytes(const MoEConfig& e, int d, size_t rows, bool bf16);
  void Reserve(const MoEConfig& e, int d, int rows, bool bf16);
};

// The activations a layer keeps for its backward, in the expert precision T (float or bf16).
template <typename T>
struct MoeExpertActs {
  cuda::DeviceBuffer<T> xe, ye, h1, h3, act, sh1, sh3, sact;
  void Resize(size_t nk, size_t n, int d, int hidden, int shared);
};

class DeviceMoe {
 public:
  DeviceMoe(const ModelConfig& m, const MoEConfig& e, bool bf16, MoeScratch* scratch);

  // Bytes one layer keeps for `rows` tokens (Reserve and the memory plan agree).
  static size_t Bytes(const MoEConfig& e, int d, size_t rows, bool bf16);

  // x [rows,d] → y [rows,d] (fp32); counts_out (host, may be null: no copy, no sync). Returns the
  // aux loss.
  double Forward(const MoeLayerParams& p, const float* x, int rows, float* y, int64_t* counts_out);
  // After Forward with the same x: dy → dx (overwritten), gradients overwritten.
  void Backward(const MoeLayerParams& p, const MoeLayerGrads& g, const float* x, const float* dy,
                float* dx);

 private:
  void Reserve(int rows);
  void SharedForwardBf16(const MoeLayerParams& p, const cuda::bf16* xb, float* y);
  void SharedBackwardBf16(const MoeLayerParams& p, const MoeLayerGrads& g, const cuda::bf16* xb,
                          const cuda::bf16* dyb, float* dx);

  int d_, H_, E_, k_, S_;
  bool sigmoid_, aux_loss_, bf16_;
  double aux_coef_, route_scale_;
  int n_ = 0, cap_ = 0;
  MoEConfig cfg_;
  MoeScratch* tmp_;
  cuda::DeviceBuffer<float> scores_, gates_;
  cuda::DeviceBuffer<int> topk_, row_token_, slot_row_;
  cuda::DeviceBuffer<int64_t> counts_, offsets_;
  MoeExpertActs<float> f32_;       // fp32 mode
  MoeExpertActs<cuda::bf16> b16_;  // bf16 mode
  std::vector<int64_t> host_offsets_;
};

}  // namespace moelab::cudamodel
