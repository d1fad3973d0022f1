// Fused causal attention (FlashAttention-2 style) on bf16 tensor cores, with the raw pre-soft-cap
// max logit (S_max) emitted from the kernel's own scores and the log-sum-exp kept instead of the
// probabilities. Same layout and AttentionDims as kernels/cuda/attention.h (and its CPU twin
// kernels/cpu/attention.h): q [B·S, ldq] with head h in columns h·qk_dim.., k and v with kv head
// g = h / (heads / kv_heads) in columns g·qk_dim.. and g·v_dim.., out [B·S, ldo].
//
// Forward: one block per (batch·head, 64-query tile); each of its 4 warps owns 16 query rows and
// walks the 64-key tiles up to the diagonal only (causal tile skipping), with an fp32 online
// softmax. Scores and P·V run on nvcuda::wmma 16×16×16 bf16 fragments with fp32 accumulation;
// fp32 inputs are rounded to bf16 as the tiles are loaded into shared memory. A second
// implementation of forward and backward keeps every elementwise step in registers on mma.sync
// fragments (flash_forward_mma.cuh, flash_backward_mma.cuh; FlashKernelInUse below).
//
// Backward (deterministic, no float atomics): D = rowsum(dO ∘ O) first; then one kernel per
// 64-key tile of a kv head computes dK and dV, looping over the query heads of its group in head
// order and over the query tiles from the diagonal on; a second kernel per 64-query tile computes
// dQ looping over the key tiles up to the diagonal. Both recompute P = exp(s' − LSE) from the
// scores (7 tile products instead of FlashAttention-2's 5: the price of no atomics on dQ).
//
// Covered shapes (FlashAttentionSupported): (qk_dim, v_dim) ∈ {(16,16), (32,32), (64,64),
// (128,128), (48,32) (MLA's default 32+16 / 32), (96,64), (192,128) (DeepSeek's MLA 128+64 / 128)},
// any heads / kv_heads ratio (MHA, GQA, MQA), any seq ≥ 1, soft-cap or not; row strides and base
// pointers 16-byte aligned. Anything else: use kernels/cuda/attention.h (the reference path).
//
// RoPE fused (optional FlashRope argument, mma kernels and fp32 q/k only): q and k are given
// un-rotated and each tile is rotated as it is loaded (rotate-half over the whole qk head,
// position of row i of a sequence = i, the rope kernel's fp32 arithmetic, then the bf16
// rounding), and the backward's dq and dk are returned through the inverse rotation: the results
// are those of RopeApplyQk before (and its inverse after) the plain kernels, bit for bit, without
// the two passes over q and k. Non-MLA shapes only (qk_dim = v_dim = rot_dim).
#pragma once

#include <cstddef>
#include <string>

#include "kernels/cuda/attention.h"
#include "kernels/cuda/device.h"

namespace moelab::cuda {

// True when the fused kernels cover a (head dims, strides of elements of elem_bytes, and — when a
// device is present — its opt-in shared memory per block). Otherwise false, with the reason in
// *why. Pointer alignment is checked by the launchers (they throw).
bool FlashAttentionSupported(const AttentionDims& a, size_t elem_bytes, std::string* why = nullptr);

// T = float or bf16 for q, k, v and out (fp32 inputs are rounded to bf16 on load).
// lse [B·H·S] (fp32, index (b·heads + h)·seq + i) receives log Σ_j exp(s'_ij) of the (soft-capped)
// logits s' the softmax used. pair_max [B·H] receives each (batch, head)'s max raw logit
// scale·q·k over unmasked j ≤ i, before any soft-cap (reduced inside the kernel with an atomic max
// on the float's bits: order-independent, so deterministic).
// RoPE tables for the fused rotation: cos, sin [seq, rot_dim/2] fp32 device arrays (16-byte
// aligned; RopeTables' layout), rot_dim the rotated dims of a head.
struct FlashRope {
  const float* cos = nullptr;
  const float* sin = nullptr;
  int rot_dim = 0;
};

template <typename T>
void FlashAttentionForward(const AttentionDims& a, const T* q, const T* k, const T* v, T* out,
                           float* lse, float* pair_max, cudaStream_t stream = nullptr,
                           const FlashRope* rope = nullptr);

// Which implementation of the fused kernels runs. kWmma: the first version (nvcuda::wmma, every
// elementwise step through shared memory), the default: it is the one that has run on a GPU.
// kMma: `mma.sync` fragments kept in registers (kernels/cuda/mma.cuh), tuned: 128-key tiles at
// head dims ≤ 64, the softmax scale folded into exp2's multiplier, cp.async double buffering of
// the K/V (forward, dQ) and Q/dO (dK/dV) tiles, ldmatrix.trans instead of transposed tile copies
// in the backward. kMma64: the first mma version (64-key tiles, scale then exp2, synchronous
// backward loads with transposed copies), kept to compare. Both checked under the CPU emulation
// only so far; opt in with train.kernels.attention_kernel "mma" or "mma64" (SelectedKernels,
// kernels/cuda/device.h, read at every launch).
enum class FlashKernel { kMma, kMma64, kWmma };
FlashKernel FlashKernelInUse();

// Whether the model hands RoPE to these kernels (FlashRope) or runs RopeApplyQk around them:
// train.kernels.rope "fused" | "separate" (SelectedKernels, read at every call). Opt-in: checked
// under the CPU emulation only.
bool FlashRopeFused();

// True when FlashAttentionForward / Backward<T> take a FlashRope of rot_dim for a: fp32 inputs
// (elem_bytes 4), the mma kernels in use (FlashKernelInUse), rot_dim = qk_dim = v_dim, a shape
// the kernels cover (FlashAttentionSupported). Otherwise false, with the reason in *why.
bool FlashRopeSupported(const AttentionDims& a, size_t elem_bytes, int rot_dim,
                        std::string* why = nullptr);

// Floats of device scratch FlashAttentionBackward needs: B·H·S (the rows of D).
size_t FlashAttentionScratchSize(const AttentionDims& a);

// out and lse from the forward; dout in out's layout. dq, dk, dv (fp32, in q's, k's and v's
// layouts: head columns overwritten, other columns untouched). Bitwise reproducible. With rope
// (the forward's): q, k un-rotated as given to the forward, dq and dk w.r.t. them.
template <typename T>
void FlashAttentionBackward(const AttentionDims& a, const T* q, const T* k, const T* v,
                            const T* out, const float* lse, const T* dout, float* dq, float* dk,
                            float* dv, float* scratch, cudaStream_t stream = nullptr,
                            const FlashRope* rope = nullptr);

}  // namespace moelab::cuda
