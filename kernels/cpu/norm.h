// RMSNorm: y = x / sqrt(mean(x²) + eps) ⊙ gain, row by row over [n, d].
#pragma once

namespace moelab::cpu {

// x [n,d], gain [d] -> y [n,d]; rstd [n] = 1/sqrt(mean(x²)+eps) kept for backward.
template <typename T>
void RmsNormForward(const T* x, const T* gain, int n, int d, double eps, T* y, T* rstd);

// The residual add at a layer boundary fused with the next norm: sum = a + b (sum may alias a or
// b), then y = RMSNorm(sum) with rstd. The add, then RmsNormForward: bit for bit those two (the
// CUDA twin does both in one pass over the row).
template <typename T>
void AddRmsNormForward(const T* a, const T* b, T* sum, const T* gain, int n, int d, double eps,
                       T* y, T* rstd);

// dy [n,d] -> dx [n,d] (overwritten, or added to when accumulate_dx: the residual stream's
// gradient flows straight into it) and dgain [d] (overwritten). dgain is reduced column-block by
// column-block over rows in row order, so it is bit-identical for any thread count.
template <typename T>
void RmsNormBackward(const T* x, const T* gain, const T* rstd, const T* dy, int n, int d, T* dx,
                     T* dgain, bool accumulate_dx);

// Grouped RMSNorm on strided rows, for per-head QK-norm and MLA latents: row r holds `groups`
// consecutive vectors of length d starting at x + r·ldx (y at y + r·ldy), each normalised on its
// own with the shared gain [d]. rstd [n·groups].
template <typename T>
void RmsNormGroupsForward(const T* x, int ldx, T* y, int ldy, int n, int groups, int d,
                          const T* gain, double eps, T* rstd);

// dy (row stride lddy) -> dx (row stride lddx, overwritten; may be dy itself when the strides
// match, since each vector is read fully before it is written) and dgain [d] (overwritten,
// summed over rows then groups in order).
template <typename T>
void RmsNormGroupsBackward(const T* x, int ldx, const T* gain, const T* rstd, const T* dy, int lddy,
                           T* dx, int lddx, int n, int groups, int d, T* dgain);

}  // namespace moelab::cpu
