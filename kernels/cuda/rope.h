// CUDA twin of kernels/cpu/rope.h (fp32), rotate-half convention.
#pragma once

#include "kernels/cpu/rope.h"
#include "kernels/cuda/device.h"

namespace moelab::cuda {

// cos, sin: [seq, rot_dim/2] device buffers, computed in double then rounded to T (bitwise the
// CPU tables: they are computed on the host with the CPU function and uploaded; synchronises).
template <typename T>
void RopeTables(int seq, int rot_dim, double theta, T* cos, T* sin, cudaStream_t stream = nullptr);

template <typename T>
void RopeApply(T* x, int n, int seq, int ld, int heads, int head_stride, int offset, int rot_dim,
               const T* cos, const T* sin, bool inverse, cudaStream_t stream = nullptr);

// RopeApply on q's heads and k's heads (cpu::RopeSlice, device pointers) in one launch, with the
// fp32 tables. T = float, or bf16 heads (a bf16 q | k | v activation): each pair widened, rotated
// in fp32 with the same arithmetic, rounded once to bf16.
template <typename T>
void RopeApplyQk(const cpu::RopeSlice<T>& q, const cpu::RopeSlice<T>& k, int n, int seq,
                 int rot_dim, const float* cos, const float* sin, bool inverse,
                 cudaStream_t stream = nullptr);

}  // namespace moelab::cuda
