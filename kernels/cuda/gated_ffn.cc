// The bf16 mode's gated FFN with gate and up projections fused (kernels/cuda/swiglu.h): cuBLAS
// GEMMs around the paired SwiGLU activation. Host code only (the kernels are in elementwise.cu).
#include "kernels/cuda/device.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/swiglu.h"

namespace moelab::cuda {

bool GatedFfnWanted() { return SelectedKernels().ffn_fused; }

void GatedFfnForwardBf16(const bf16* xb, int n, int d, int hidden, const bf16* w1, const bf16* w3,
                         const bf16* w2, bf16* h13, bf16* act, float* y, bool accumulate,
                         cudaStream_t stream) {
  const int H = hidden, H2 = 2 * hidden;
  if (w3 == w1 + static_cast<size_t>(H) * d) {
    Gemm(false, true, n, H2, d, 1.0f, xb, d, w1, d, 0.0f, h13, H2, stream);
  } else {
    Gemm(false, true, n, H, d, 1.0f, xb, d, w1, d, 0.0f, h13, H2, stream);
    Gemm(false, true, n, H, d, 1.0f, xb, d, w3, d, 0.0f, h13 + H, H2, stream);
  }
  SwigluActivationPaired(h13, n, H, act, stream);
  Gemm(false, true, n, d, H, 1.0f, act, H, w2, H, accumulate ? 1.0f : 0.0f, y, d, stream);
}

void GatedFfnBackwardBf16(const bf16* xb, const bf16* dyb, int n, int d, int hidden, const bf16* w1,
                          const bf16* w3, const bf16* w2, const bf16* h13, const bf16* act,
                          bf16* dh13, float* dx, bool accumulate_dx, float* dw1, float* dw3,
                          float* dw2, cudaStream_t stream) {
  const int H = hidden, H2 = 2 * hidden;
  const size_t wsize = static_cast<size_t>(H) * d;
  // dact = dyb·W2 (W2 [d, H]) into the h1 columns of dh13; dW2 = dybᵀ·act.
  Gemm(false, false, n, H, d, 1.0f, dyb, d, w2, H, 0.0f, dh13, H2, stream);
  Gemm(true, false, d, H, n, 1.0f, dyb, d, act, H, 0.0f, dw2, H, stream);
  SwigluActivationPairedBackward(h13, n, H, dh13, stream);
  const float beta = accumulate_dx ? 1.0f : 0.0f;
  if (w3 == w1 + wsize) {
    Gemm(false, false, n, d, H2, 1.0f, dh13, H2, w1, d, beta, dx, d, stream);
  } else {
    Gemm(false, false, n, d, H, 1.0f, dh13, H2, w1, d, beta, dx, d, stream);
    Gemm(false, false, n, d, H, 1.0f, dh13 + H, H2, w3, d, 1.0f, dx, d, stream);
  }
  if (dw3 == dw1 + wsize) {
    Gemm(true, false, H2, d, n, 1.0f, dh13, H2, xb, d, 0.0f, dw1, d, stream);
  } else {
    Gemm(true, false, H, d, n, 1.0f, dh13, H2, xb, d, 0.0f, dw1, d, stream);
    Gemm(true, false, H, d, n, 1.0f, dh13 + H, H2, xb, d, 0.0f, dw3, d, stream);
  }
}

}  // namespace moelab::cuda
