// The routed experts in bf16 with every product whose rows are grouped by expert on cuDNN's MoE
// grouped matmul (kernels/cuda/cudnn_grouped_matmul.h): h1, h3, the output, and the input
// gradients read each expert's first row from the device, so a layer's forward needs none of the
// routing's row counts on the host (MOELAB_MOE_EXPERTS=cudnn; issue 25, item 2). The weight
// gradients, whose inner dimension is an expert's row count, stay on cuBLAS's grouped GEMMs with
// host offsets: the layer copies them to pinned memory after its forward's dispatch plan and
// waits for that copy only in its backward, long after it landed (no stall).
//
// Same layouts and contracts as MoeExpertsForward / MoeExpertsBackward<bf16>
// (kernels/cuda/moe_experts.h) on the compact rows: dispatched rows 0 … rows, expert by expert.
// Not yet run on a GPU.
#pragma once

#include <cstdint>
#include <memory>

#include "kernels/cuda/cudnn_grouped_matmul.h"
#include "kernels/cuda/device.h"

namespace moelab::cuda {

// first_row [E] int32 (device) = offsets[e] of the dispatch plan's int64 offsets [E+1].
void MoeFirstRows(const int64_t* offsets, int experts, int32_t* first_row,
                  cudaStream_t stream = nullptr);
// sum[i] = bf16(float(sum[i]) + float(add[i])) for i < n.
void AddBf16(const bf16* add, bf16* sum, size_t n, cudaStream_t stream = nullptr);

class MoeExpertsCudnn {
 public:
  // rows: the dispatched rows (n·k) every call has; d, hidden: the model's and an expert's width.
  MoeExpertsCudnn(int experts, int64_t rows, int d, int hidden);

  // xe [rows, d] → ye [rows, d]; h1, h3, act [rows, H] kept for the backward.
  void Forward(const bf16* xe, const int32_t* first_row, const bf16* w1, const bf16* w3,
               const bf16* w2, bf16* h1, bf16* h3, bf16* act, bf16* ye,
               cudaStream_t stream = nullptr);
  // dye [rows, d] is read, then used as scratch; dxe [rows, d] overwritten; dw1, dw3 [E,H,d],
  // dw2 [E,d,H] (fp32) overwritten, zero for an expert without rows; scratch [rows, 2H].
  // host_offsets [E+1]: the same offsets on the host.
  void Backward(const bf16* xe, const int32_t* first_row, const int64_t* host_offsets,
                const bf16* w1, const bf16* w3, const bf16* w2, const bf16* h1, const bf16* h3,
                const bf16* act, bf16* dye, bf16* dxe, float* dw1, float* dw3, float* dw2,
                bf16* scratch, cudaStream_t stream = nullptr);
  int64_t rows() const { return rows_; }

 private:
  int experts_;
  int64_t rows_;
  int d_, hidden_;
  // x·Wᵀ products (weights stored [E, out, in]) and dy·W products (the input gradients).
  CudnnGroupedMatmul up_, down_, back_up_, back_down_;
};

}  // namespace moelab::cuda
