// ExpertCompute of an MoE layer: each expert's SwiGLU on its contiguous block of dispatched rows
// (one set of real GEMMs per expert, never a loop over tokens).
#pragma once

#include <cstdint>

namespace moelab::cpu {

// How the per-expert GEMMs use the threads.
enum class MoeExpertSchedule {
  kExpertParallel,  // OpenMP loop over experts; OpenBLAS runs single-threaded inside it
  kBlasParallel,    // experts one after another, each GEMM threaded inside OpenBLAS
};

// xe [rows,d] grouped by expert (expert e owns rows offsets[e] .. offsets[e+1]); w1, w3
// [E,H,d]; w2 [E,d,H]. Saves h1, h3, act [rows,H] for backward; ye [rows,d] overwritten.
template <typename T>
void MoeExpertsForward(const T* xe, const int64_t* offsets, int experts, int d, int hidden,
                       const T* w1, const T* w3, const T* w2, T* h1, T* h3, T* act, T* ye,
                       MoeExpertSchedule schedule);

// dye [rows,d] -> dxe [rows,d] and dw1, dw3 [E,H,d], dw2 [E,d,H], all overwritten (an expert
// with no rows gets zero gradients). scratch: [rows, 2H].
template <typename T>
void MoeExpertsBackward(const T* xe, const int64_t* offsets, int experts, int d, int hidden,
                        const T* w1, const T* w3, const T* w2, const T* h1, const T* h3,
                        const T* act, const T* dye, T* dxe, T* dw1, T* dw3, T* dw2, T* scratch,
                        MoeExpertSchedule schedule);

// Expert e's part of MoeExpertsForward / MoeExpertsBackward (same arguments), for callers that
// schedule experts together with other work in one parallel loop.
template <typename T>
void MoeExpertForward(int e, const T* xe, const int64_t* offsets, int d, int hidden, const T* w1,
                      const T* w3, const T* w2, T* h1, T* h3, T* act, T* ye);
template <typename T>
void MoeExpertBackward(int e, const T* xe, const int64_t* offsets, int d, int hidden, const T* w1,
                       const T* w3, const T* w2, const T* h1, const T* h3, const T* act,
                       const T* dye, T* dxe, T* dw1, T* dw3, T* dw2, T* scratch);

}  // namespace moelab::cpu
