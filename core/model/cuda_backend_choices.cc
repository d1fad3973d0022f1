// The CUDA backend's reading of train.kernels and its attention sizes
// (core/model/cuda_backend_choices.h).
#include "core/model/cuda_backend_choices.h"

#if MOELAB_HAVE_CUDA

#include <algorithm>
#include <string>

#include "core/model/attention_dims.h"
#include "core/model/backend.h"
#include "core/model/model.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/flash_attention.h"

namespace moelab {

// The fused attention kernels (LSE kept, no [B,H,S,S] probabilities) in bf16 mode wherever they
// cover the shape; fp32 mode keeps the reference path, the one its CPU twin checks compare.
// train.kernels.attention "reference" forces the reference path (for comparisons), "fused" the
// fused one.
bool ChooseFlash(const RunConfig& c) {
  const std::string& mode = c.train.kernels.attention;
  if (mode == "reference") return false;
  const ModelConfig& m = c.model;
  // q, k and v are column slices of 64-byte aligned arena buffers: 16-byte aligned when their
  // column offsets are multiples of 4 floats.
  const bool aligned = m.attention == "mla"
                           ? (m.heads * m.qk_nope_head_dim) % 4 == 0
                           : (m.heads * m.head_dim_effective()) % 4 == 0 &&
                                 (m.kv_heads_effective() * m.head_dim_effective()) % 4 == 0;
  std::string why = "q/k/v column offsets not 16-byte aligned";
  const bool ok =
      aligned && cuda::FlashAttentionSupported(cuda::AttentionDims(AttentionDimsOf(m)), 4, &why);
  if (mode == "fused" && !ok) {
    throw ConfigError("train.kernels.attention",
                      "'fused': the fused kernels cannot run this model: " + why);
  }
  return ok && (c.train.effective_precision() == "bf16" || mode == "fused");
}

// train.kernels.attention_acts: "fp32" (the default: qkv and att fp32 in bf16 mode, the path
// that ran on a GPU) or "bf16" (AttentionCoreForward below).
bool AttentionActsBf16(const RunConfig& c) { return c.train.kernels.attention_acts == "bf16"; }

// train.kernels as the launchers' process-wide selection (kernels/cuda/device.h).
cuda::KernelSelection KernelSelectionOf(const KernelChoices& k) {
  cuda::KernelSelection s;
  s.attention_mma = k.attention_kernel == "mma" || k.attention_kernel == "mma64";
  s.attention_mma64 = k.attention_kernel == "mma64";
  s.rope_fused = k.rope == "fused";
  s.ffn_fused = k.ffn == "fused";
  s.experts = k.experts == "chunked" ? 1 : k.experts == "cudnn" ? 2 : k.experts == "device" ? 3 : 0;
  s.dispatch_sort = k.dispatch == "sort";
  return s;
}

size_t AttentionSaved(bool flash, const cpu::AttentionDims& a) {
  if (flash) return static_cast<size_t>(a.batch) * a.heads * a.seq;  // log-sum-exp rows
  return ProbabilitiesSaved(a);
}

size_t AttentionScratch(bool flash, const cpu::AttentionDims& a) {
  return flash ? cuda::FlashAttentionScratchSize(cuda::AttentionDims(a))
               : cuda::AttentionScratchSize(cuda::AttentionDims(a));
}

// Elements of the bf16 cast buffers at `rows` tokens (memory plan): the widest GEMM input and
// the widest output gradient. The LM head casts neither its logits nor its dlogits (bf16 from
// its GEMM and its cross-entropy kernel, LmHeadLossChunk), only its input x [rows, d].
size_t CastElements(const ModelConfig& m, size_t rows) {
  const bool mla = m.attention == "mla";
  const size_t H = m.heads;
  const size_t qkv =
      mla ? 0 : H * m.head_dim_effective() + 2 * m.kv_heads_effective() * m.head_dim_effective();
  const size_t dqk = m.qk_nope_head_dim + m.qk_rope_head_dim;
  const size_t in =
      std::max<size_t>({static_cast<size_t>(m.d_model), static_cast<size_t>(m.ffn_hidden),
                        H * m.head_dim_effective(), H * m.v_head_dim,
                        static_cast<size_t>(m.q_lora_rank), static_cast<size_t>(m.kv_lora_rank)});
  const size_t out =
      std::max<size_t>({static_cast<size_t>(m.d_model), static_cast<size_t>(m.ffn_hidden), qkv,
                        static_cast<size_t>(m.q_lora_rank), H * dqk,
                        static_cast<size_t>(m.kv_lora_rank + m.qk_rope_head_dim),
                        H * (m.qk_nope_head_dim + m.v_head_dim)});
  return rows * (in + out);
}

}  // namespace moelab

#endif  // MOELAB_HAVE_CUDA
