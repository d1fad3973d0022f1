// Rotary position embedding, rotate-half (GPT-NeoX / Llama) convention: in each head the
// rotated slice of rot_dim values is split into halves a = x[0:h], b = x[h:2h] (h = rot_dim/2)
// and pair i is rotated by angle pos·theta^(-2i/rot_dim):
//   a'ᵢ = aᵢ·cos − bᵢ·sin,   b'ᵢ = bᵢ·cos + aᵢ·sin.
// The position of row r of a [B·S, ...] buffer is r mod seq.
#pragma once

namespace moelab::cpu {

// The rotary part of one tensor for a RoPE over two tensors at once (the q heads and the k heads
// of an attention): rows of stride ld from x; `heads` heads every head_stride values; in each,
// rot_dim values from offset. heads 0: nothing.
template <typename T>
struct RopeSlice {
  T* x = nullptr;
  int ld = 0, heads = 0, head_stride = 0, offset = 0;
};

// cos, sin: [seq, rot_dim/2], computed in double then rounded to T.
template <typename T>
void RopeTables(int seq, int rot_dim, double theta, T* cos, T* sin);

// In place on x rows [n, ld]: for every head h < heads, the rot_dim values starting at
// h·head_stride + offset are rotated. inverse rotates by −angle, which is the backward pass
// (the rotation is orthogonal, so its transpose is its inverse).
template <typename T>
void RopeApply(T* x, int n, int seq, int ld, int heads, int head_stride, int offset, int rot_dim,
               const T* cos, const T* sin, bool inverse);

// RopeApply on q's heads and on k's heads (n rows each, the same positions and tables): one
// call where the CUDA twin runs one launch. Each value is rotated on its own, so the result is
// that of the two calls in either order, bit for bit.
template <typename T>
void RopeApplyQk(const RopeSlice<T>& q, const RopeSlice<T>& k, int n, int seq, int rot_dim,
                 const T* cos, const T* sin, bool inverse);

}  // namespace moelab::cpu
