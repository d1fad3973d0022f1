// Rotary position embedding, rotate-half (GPT-NeoX / Llama) convention: in each head the
// rotated slice of rot_dim values is split into halves a = x[0:h], b = x[h:2h] (h = rot_dim/2)
// and pair i is rotated by angle pos·theta^(-2i/rot_dim):
//   a'ᵢ = aᵢ·cos − bᵢ·sin,   b'ᵢ = bᵢ·cos + aᵢ·sin.
// The position of row r of a [B·S, ...] buffer is r mod seq.
#pragma once

namespace moelab::cpu {

// cos, sin: [seq, rot_dim/2], computed in double then rounded to T.
template <typename T>
void RopeTables(int seq, int rot_dim, double theta, T* cos, T* sin);

// In place on x rows [n, ld]: for every head h < heads, the rot_dim values starting at
// h·head_stride + offset are rotated. inverse rotates by −angle, which is the backward pass
// (the rotation is orthogonal, so its transpose is its inverse).
template <typename T>
void RopeApply(T* x, int n, int seq, int ld, int heads, int head_stride, int offset, int rot_dim,
               const T* cos, const T* sin, bool inverse);

}  // namespace moelab::cpu
