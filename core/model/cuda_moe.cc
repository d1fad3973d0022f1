// The device MoE layer (core/model/cuda_moe.h): core/model/moe.cc's Forward/Backward over device
// buffers, fp32 or with bf16 experts. See docs/cuda.md (Precision).
#if MOELAB_HAVE_CUDA

#include "core/model/cuda_moe.h"

#include <algorithm>
#include <stdexcept>

#include "core/model/cuda_backend_kernels.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/moe_experts.h"
#include "kernels/cuda/moe_routing.h"
#include "kernels/cuda/swiglu.h"

namespace moelab::cudamodel {

using cuda::bf16;

size_t MoeScratch::Bytes(const MoEConfig& e, int d, size_t rows, bool bf16) {
  const size_t nk = rows * e.experts_active, H = e.expert_hidden, S = e.shared_experts;
  const size_t swiglu = std::max(nk, rows) * 2 * H;
  const size_t f32 = rows * e.experts_total + nk;  // logits, dgates
  if (bf16) return 4 * f32 + 2 * (nk * d + swiglu + 2 * rows * d);
  return 4 * (f32 + nk * d + (S > 1 ? (S - 1) * rows * d : 0) + swiglu);
}

void MoeScratch::Reserve(const MoEConfig& e, int d, int rows, bool bf16) {
  if (rows <= cap) return;
  const size_t nn = rows, nk = nn * e.experts_active, H = e.expert_hidden, S = e.shared_experts;
  const size_t swiglu = std::max(nk, nn) * 2 * H;
  logits.Resize(nn * e.experts_total);
  dgates.Resize(nk);
  if (bf16) {
    dxe16.Resize(nk * d);
    scratch16.Resize(swiglu);
    xb16.Resize(nn * d);
    dyb16.Resize(nn * d);
  } else {
    dxe.Resize(nk * d);
    sy.Resize(S > 1 ? (S - 1) * nn * d : 0);
    scratch.Resize(swiglu);
  }
  cap = rows;
}

template <typename T>
void MoeExpertActs<T>::Resize(size_t nk, size_t n, int d, int hidden, int shared) {
  xe.Resize(nk * d);
  ye.Resize(nk * d);
  h1.Resize(nk * hidden);
  h3.Resize(nk * hidden);
  act.Resize(nk * hidden);
  sh1.Resize(shared * n * hidden);
  sh3.Resize(shared * n * hidden);
  sact.Resize(shared * n * hidden);
}

DeviceMoe::DeviceMoe(const ModelConfig& m, const MoEConfig& e, bool bf16, MoeScratch* scratch)
    : d_(m.d_model),
      H_(e.expert_hidden),
      E_(e.experts_total),
      k_(e.experts_active),
      S_(e.shared_experts),
      sigmoid_(e.router == "sigmoid"),
      aux_loss_(e.balance == "aux_loss"),
      bf16_(bf16),
      aux_coef_(e.aux_loss_coef),
      route_scale_(e.route_scale),
      cfg_(e),
      tmp_(scratch) {
  if (k_ > 32) throw std::invalid_argument("cuda: moe.experts_active must be <= 32");
  counts_.Resize(E_);
  offsets_.Resize(E_ + 1);
  host_offsets_.assign(E_ + 1, 0);
}

size_t DeviceMoe::Bytes(const MoEConfig& e, int d, size_t rows, bool bf16) {
  const size_t nk = rows * e.experts_active, H = e.expert_hidden, S = e.shared_experts;
  const size_t f32 = rows * e.experts_total + nk;  // scores, gates
  const size_t acts = 2 * nk * d + 3 * nk * H + 3 * S * rows * H;
  const size_t ints = 3 * nk;  // topk, row_token, slot_row
  return 4 * f32 + (bf16 ? 2 : 4) * acts + 4 * ints + 8 * (2 * e.experts_total + 1);
}

void DeviceMoe::Reserve(int rows) {
  tmp_->Reserve(cfg_, d_, rows, bf16_);
  if (rows <= cap_) return;
  const size_t nn = rows, nk = nn * k_;
  scores_.Resize(nn * E_);
  gates_.Resize(nk);
  topk_.Resize(nk);
  row_token_.Resize(nk);
  slot_row_.Resize(nk);
  if (bf16_) {
    b16_.Resize(nk, nn, d_, H_, S_);
  } else {
    f32_.Resize(nk, nn, d_, H_, S_);
  }
  cap_ = rows;
}

double DeviceMoe::Forward(const MoeLayerParams& p, const float* x, int rows, float* y,
                          int64_t* counts_out) {
  Reserve(rows);
  n_ = rows;
  const int n = n_, d = d_, H = H_, E = E_, k = k_, S = S_;
  const size_t nd = static_cast<size_t>(n) * d;
  const int64_t nk = static_cast<int64_t>(n) * k;
  // Routing stays fp32 in both modes (the expert choice is discrete: bf16 logits would flip it).
  cuda::Gemm(false, true, n, E, d, 1.0f, x, d, p.router, d, 0.0f, tmp_->logits.data(), E);
  cuda::MoeRoute(tmp_->logits.data(), n, E, k, sigmoid_, p.bias, route_scale_, scores_.data(),
                 topk_.data(), gates_.data(), counts_.data());
  const double aux =
      aux_loss_ ? cuda::MoeAuxLoss(scores_.data(), counts_.data(), n, E, k, sigmoid_, aux_coef_)
                : 0.0;
  if (counts_out) {
    MOELAB_CUDA_CHECK(
        cudaMemcpy(counts_out, counts_.data(), sizeof(int64_t) * E, cudaMemcpyDeviceToHost));
  }
  cuda::MoeDispatchPlan(topk_.data(), n, E, k, offsets_.data(), row_token_.data(),
                        slot_row_.data());
  cuda::DownloadOffsets(offsets_.data(), E, host_offsets_.data());
  if (bf16_) {
    MoeExpertActs<bf16>& a = b16_;
    bf16* xb = tmp_->xb16.data();
    cuda::CastToBf16(x, xb, nd);
    cuda::MoeGather(xb, d, row_token_.data(), nk, a.xe.data());
    cuda::MoeExpertsForward<bf16>(a.xe.data(), host_offsets_.data(), E, d, H, p.w1b, p.w3b, p.w2b,
                                  a.h1.data(), a.h3.data(), a.act.data(), a.ye.data());
    SharedForwardBf16(p, xb, y);
    cuda::MoeCombine(a.ye.data(), slot_row_.data(), gates_.data(), n, k, d, y, S > 0);
    return aux;
  }
  MoeExpertActs<float>& a = f32_;
  const size_t wsize = static_cast<size_t>(H) * d, snh = static_cast<size_t>(n) * H;
  cuda::MoeGather(x, d, row_token_.data(), nk, a.xe.data());
  cuda::MoeExpertsForward<float>(a.xe.data(), host_offsets_.data(), E, d, H, p.w1, p.w3, p.w2,
                                 a.h1.data(), a.h3.data(), a.act.data(), a.ye.data());
  for (int s = 0; s < S; ++s) {
    float* out = s == 0 ? y : tmp_->sy.data() + (s - 1) * nd;
    cuda::SwigluForward(x, n, d, H, p.s1 + s * wsize, p.s3 + s * wsize, p.s2 + s * wsize,
                        a.sh1.data() + s * snh, a.sh3.data() + s * snh, a.sact.data() + s * snh,
                        out);
  }
  for (int s = 1; s < S; ++s) Add(y, tmp_->sy.data() + (s - 1) * nd, y, nd);
  cuda::MoeCombine(a.ye.data(), slot_row_.data(), gates_.data(), n, k, d, y, S > 0);
  return aux;
}

// Shared expert s in bf16: h1, h3 = xb·W1ᵀ, xb·W3ᵀ (bf16), act = silu(h1)·h3 (bf16), and
// y (=, then +=) act·W2ᵀ in fp32, so the shared experts' sum never passes through bf16.
void DeviceMoe::SharedForwardBf16(const MoeLayerParams& p, const bf16* xb, float* y) {
  const int n = n_, d = d_, H = H_;
  const size_t wsize = static_cast<size_t>(H) * d, snh = static_cast<size_t>(n) * H;
  MoeExpertActs<bf16>& a = b16_;
  for (int s = 0; s < S_; ++s) {
    bf16* h1 = a.sh1.data() + s * snh;
    bf16* h3 = a.sh3.data() + s * snh;
    bf16* act = a.sact.data() + s * snh;
    cuda::Gemm(false, true, n, H, d, 1.0f, xb, d, p.s1b + s * wsize, d, 0.0f, h1, H);
    cuda::Gemm(false, true, n, H, d, 1.0f, xb, d, p.s3b + s * wsize, d, 0.0f, h3, H);
    cuda::SwigluActivation(h1, h3, snh, act);
    cuda::Gemm(false, true, n, d, H, 1.0f, act, H, p.s2b + s * wsize, H, s > 0 ? 1.0f : 0.0f, y, d);
  }
}

void DeviceMoe::Backward(const MoeLayerParams& p, const MoeLayerGrads& g, const float* x,
                         const float* dy, float* dx) {
  const int n = n_, d = d_, H = H_, E = E_, k = k_, S = S_;
  const size_t nd = static_cast<size_t>(n) * d;
  if (bf16_) {
    MoeExpertActs<bf16>& a = b16_;
    // dye (bf16) overwrites ye, which the gate gradients have read first.
    cuda::MoeCombineBackward(dy, a.ye.data(), slot_row_.data(), gates_.data(), n, k, d, a.ye.data(),
                             tmp_->dgates.data());
    cuda::MoeRouteBackward(scores_.data(), topk_.data(), tmp_->dgates.data(), counts_.data(), n, E,
                           k, sigmoid_, route_scale_, aux_loss_ ? aux_coef_ : 0.0,
                           tmp_->logits.data());
    cuda::MoeExpertsBackward<bf16>(a.xe.data(), host_offsets_.data(), E, d, H, p.w1b, p.w3b, p.w2b,
                                   a.h1.data(), a.h3.data(), a.act.data(), a.ye.data(),
                                   tmp_->dxe16.data(), g.w1, g.w3, g.w2, tmp_->scratch16.data());
    if (S > 0) {
      // The forward's bf16 cast of x was scratch (another layer has used it since): cast again.
      cuda::CastToBf16(x, tmp_->xb16.data(), nd);
      cuda::CastToBf16(dy, tmp_->dyb16.data(), nd);
      SharedBackwardBf16(p, g, tmp_->xb16.data(), tmp_->dyb16.data(), dx);
    }
    cuda::Gemm(true, false, E, d, n, 1.0f, tmp_->logits.data(), E, x, d, 0.0f, g.router, d);
    cuda::MoeGatherBackward(tmp_->dxe16.data(), slot_row_.data(), n, k, d, dx, S > 0);
    cuda::Gemm(false, false, n, d, E, 1.0f, tmp_->logits.data(), E, p.router, d, 1.0f, dx, d);
    return;
  }
  MoeExpertActs<float>& a = f32_;
  const size_t wsize = static_cast<size_t>(H) * d, snh = static_cast<size_t>(n) * H;
  cuda::MoeCombineBackward(dy, a.ye.data(), slot_row_.data(), gates_.data(), n, k, d, a.ye.data(),
                           tmp_->dgates.data());
  cuda::MoeRouteBackward(scores_.data(), topk_.data(), tmp_->dgates.data(), counts_.data(), n, E, k,
                         sigmoid_, route_scale_, aux_loss_ ? aux_coef_ : 0.0, tmp_->logits.data());
  cuda::MoeExpertsBackward<float>(a.xe.data(), host_offsets_.data(), E, d, H, p.w1, p.w3, p.w2,
                                  a.h1.data(), a.h3.data(), a.act.data(), a.ye.data(),
                                  tmp_->dxe.data(), g.w1, g.w3, g.w2, tmp_->scratch.data());
  for (int s = 0; s < S; ++s) {
    cuda::SwigluBackward(x, n, d, H, p.s1 + s * wsize, p.s3 + s * wsize, p.s2 + s * wsize,
                         a.sh1.data() + s * snh, a.sh3.data() + s * snh, a.sact.data() + s * snh,
                         dy, s == 0 ? dx : tmp_->sy.data() + (s - 1) * nd, g.s1 + s * wsize,
                         g.s3 + s * wsize, g.s2 + s * wsize, tmp_->scratch.data());
  }
  cuda::Gemm(true, false, E, d, n, 1.0f, tmp_->logits.data(), E, x, d, 0.0f, g.router, d);
  for (int s = 1; s < S; ++s) Add(dx, tmp_->sy.data() + (s - 1) * nd, dx, nd);
  cuda::MoeGatherBackward(tmp_->dxe.data(), slot_row_.data(), n, k, d, dx, S > 0);
  cuda::Gemm(false, false, n, d, E, 1.0f, tmp_->logits.data(), E, p.router, d, 1.0f, dx, d);
}

// The twin of cuda::SwigluBackward with bf16 operands: dact = dy·W2 and dh1, dh3 in bf16 (the
// SwiGLU backward reads bf16 h1, h3), the weight gradients and dx (= for s = 0, then +=) in fp32.
void DeviceMoe::SharedBackwardBf16(const MoeLayerParams& p, const MoeLayerGrads& g, const bf16* xb,
                                   const bf16* dyb, float* dx) {
  const int n = n_, d = d_, H = H_;
  const size_t wsize = static_cast<size_t>(H) * d, snh = static_cast<size_t>(n) * H;
  MoeExpertActs<bf16>& a = b16_;
  bf16* dact = tmp_->scratch16.data();  // [n,H], becomes dh1 in place
  bf16* dh3 = dact + snh;
  for (int s = 0; s < S_; ++s) {
    const size_t w = s * wsize;
    cuda::Gemm(false, false, n, H, d, 1.0f, dyb, d, p.s2b + w, H, 0.0f, dact, H);
    cuda::Gemm(true, false, d, H, n, 1.0f, dyb, d, a.sact.data() + s * snh, H, 0.0f, g.s2 + w, H);
    cuda::SwigluActivationBackward(a.sh1.data() + s * snh, a.sh3.data() + s * snh, dact, snh, dact,
                                   dh3);
    cuda::Gemm(false, false, n, d, H, 1.0f, dact, H, p.s1b + w, d, s > 0 ? 1.0f : 0.0f, dx, d);
    cuda::Gemm(true, false, H, d, n, 1.0f, dact, H, xb, d, 0.0f, g.s1 + w, d);
    cuda::Gemm(false, false, n, d, H, 1.0f, dh3, H, p.s3b + w, d, 1.0f, dx, d);
    cuda::Gemm(true, false, H, d, n, 1.0f, dh3, H, xb, d, 0.0f, g.s3 + w, d);
  }
}

template struct MoeExpertActs<float>;
template struct MoeExpertActs<bf16>;

}  // namespace moelab::cudamodel

#endif  // MOELAB_HAVE_CUDA
