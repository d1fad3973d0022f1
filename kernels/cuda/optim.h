// Optimizer arithmetic on the device, bit-for-bit the loops of core/optim/adamw.cc and
// core/optim/muon.cc (same float operations in the same order; the step constants are formed on
// the host exactly as the CPU does), and QK-Clip's row scaling. The kernel bodies are in
// optim_kernels.cuh (also run on the CPU by tests/cuda_kernels/optim_emulation_test.cc).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "kernels/cuda/device.h"

namespace moelab::cuda {

// The per-step constants of AdamW, computed on the host like core/optim/adamw.cc.
struct AdamWScalars {
  float step_size = 0;    // lr / (1 − β1^t)
  float inv_sqrt_c2 = 0;  // 1 / sqrt(1 − β2^t)
  float eps = 0, b1 = 0, b2 = 0;
  float decay = 1;  // 1 − lr·λ for decayed tensors, 1 otherwise
};
AdamWScalars MakeAdamWScalars(double lr, double beta1, double beta2, double eps,
                              double weight_decay, bool decay, int64_t step);

// m = b1·m + (1−b1)·g; v = b2·v + (1−b2)·g²; w = w·decay − step_size·m/(sqrt(v)·inv_sqrt_c2+eps).
void AdamWUpdate(float* w, const float* g, float* m, float* v, size_t n, const AdamWScalars& s,
                 cudaStream_t stream = nullptr);

// Multi-tensor AdamW in one launch that also refreshes the bf16 weight copy (bf16 mode's GEMM
// operand) from the updated fp32 masters in the same pass, instead of a separate cast over the
// whole arena after the step. Same arithmetic as AdamWUpdate (bit-equal to the CPU AdamW).
struct AdamWSegment {
  uint64_t offset = 0;        // into w, g and w16
  uint64_t size = 0;          // elements
  uint64_t state_offset = 0;  // into m and v
  int decay = 0;              // 1: weight decay applies (s.decay), 0: not
};
// segments: a device array of num_segments entries; max_size: the largest segment's size. w16
// may be null (fp32 mode: no copy). s: MakeAdamWScalars(..., decay = true, step).
void AdamWFused(const AdamWSegment* segments, int num_segments, uint64_t max_size, float* w,
                const float* g, float* m, float* v, bf16* w16, const AdamWScalars& s,
                cudaStream_t stream = nullptr);

// Muon over a table of tensors, one launch per phase (the optimizer's step): tensor t's
// gradient and weight at `offset`, its momentum at `momentum_offset`, its Newton–Schulz input
// and output at `bank_offset` of the bank (fp32 or bf16).
struct MuonSegment {
  uint64_t offset = 0;           // into w, g and w16
  uint64_t size = 0;             // elements
  uint64_t momentum_offset = 0;  // into m
  uint64_t bank_offset = 0;      // into the bank
  float scale = 1;               // the update scale s (core/optim/muon.h MuonUpdateScale)
};
// m = μ·m + g; bank slot = g + μ·m (nesterov) or m. U = float or bf16. segments: a device array.
template <typename U>
void MuonMomentumFused(const MuonSegment* segments, int num_segments, uint64_t max_size,
                       const float* g, float* m, U* bank, float mu, bool nesterov,
                       cudaStream_t stream = nullptr);
// w = w·decay − float(lr·s)·o with o the bank slot, and w16 (null: none) = bf16(w) in the same
// pass. lr in double: the step size is rounded once, as the CPU Muon rounds it.
template <typename U>
void MuonApplyFused(const MuonSegment* segments, int num_segments, uint64_t max_size, float* w,
                    const U* bank, double lr, float decay, bf16* w16,
                    cudaStream_t stream = nullptr);

// Muon momentum: m = μ·m + g; u = g + μ·m (nesterov) or m. u may be a bank slot.
void MuonMomentum(const float* g, float* m, float* u, size_t n, float mu, bool nesterov,
                  cudaStream_t stream = nullptr);
// Same, writing the NS input u as bf16 (for the bf16 NS bank).
void MuonMomentum(const float* g, float* m, bf16* u, size_t n, float mu, bool nesterov,
                  cudaStream_t stream = nullptr);

// w = w·decay − step_size·o (Muon's decoupled update with the orthogonalised o).
void MuonApply(float* w, const float* o, size_t n, float decay, float step_size,
               cudaStream_t stream = nullptr);
void MuonApply(float* w, const bf16* o, size_t n, float decay, float step_size,
               cudaStream_t stream = nullptr);

// QK-Clip: rows [first, first + count) of a row-major [*, cols] device tensor ×factor.
struct RowScale {
  float* w = nullptr;
  int first = 0, count = 0, cols = 0;
  float factor = 1;
};
// All spans in one launch (the list is copied to the device; spans must not overlap).
void ScaleRows(const std::vector<RowScale>& spans, cudaStream_t stream = nullptr);

// QK-Clip on a whole arena: arena[offset .. offset + count) ×factor for each range, and copy
// (null: none), the arena's bf16 copy, re-rounded there from the new fp32 values. One launch; the
// table travels in the thread's stream-ordered scratch, so no host synchronisation.
struct ScaleRange {
  uint64_t offset = 0;
  uint64_t count = 0;
  float factor = 1;
};
void ScaleRanges(const std::vector<ScaleRange>& ranges, float* arena, bf16* copy,
                 cudaStream_t stream = nullptr);

// Sum of squares of x (n floats) into *out_device (double), for gradient-norm clipping.
void SumSquares(const float* x, size_t n, double* out_device, cudaStream_t stream = nullptr);
// x[i] *= factor.
void Scale(float* x, size_t n, float factor, cudaStream_t stream = nullptr);

}  // namespace moelab::cuda
