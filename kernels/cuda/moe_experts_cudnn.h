// The routed experts' forward in bf16 with its grouped products on cuDNN's MoE grouped matmul
// (kernels/cuda/cudnn_grouped_matmul.h): h1, h3 and the output read each expert's first row from
// the device, so a layer's forward needs none of the routing's row counts on the host
// (train.kernels.experts "cudnn"; issue 25, item 2). The backward is MoeExpertsBackward<bf16>'s
// (kernels/cuda/moe_experts.h) on cuBLAS's grouped GEMMs with host offsets: cuDNN 9.19 has no
// engine for the input gradients' products (their weights have n contiguous) nor a weight-gradient
// operation. The layer copies the offsets to pinned memory after its forward's dispatch plan and
// waits for that copy only in its backward, long after it landed (no stall).
//
// Same layouts and contracts as MoeExpertsForward<bf16> on the compact rows: dispatched rows
// 0 … rows, expert by expert. Not yet run on a GPU.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/cuda/cudnn_grouped_matmul.h"
#include "kernels/cuda/device.h"

namespace moelab::cuda {

// first_row [E] int32 (device) = offsets[e] of the dispatch plan's int64 offsets [E+1].
void MoeFirstRows(const int64_t* offsets, int experts, int32_t* first_row,
                  cudaStream_t stream = nullptr);

class MoeExpertsCudnn {
 public:
  // rows: the dispatched rows (n·k) every call has; d, hidden: the model's and an expert's width.
  MoeExpertsCudnn(int experts, int64_t rows, int d, int hidden);

  // xe [rows, d] → ye [rows, d]; h1, h3, act [rows, H] kept for the backward.
  void Forward(const bf16* xe, const int32_t* first_row, const bf16* w1, const bf16* w3,
               const bf16* w2, bf16* h1, bf16* h3, bf16* act, bf16* ye,
               cudaStream_t stream = nullptr);
  int64_t rows() const { return rows_; }
  // The grouped products Forward runs (h1 and h3 share the first).
  std::vector<const CudnnGroupedMatmul*> Products() const { return {&up_, &down_}; }

 private:
  int64_t rows_;
  int hidden_;
  CudnnGroupedMatmul up_, down_;  // x·Wᵀ products (weights stored [E, out, in])
};

}  // namespace moelab::cuda
