// The token-side pieces of an MoE layer, as separate functions so that an expert-parallel
// all-to-all can later go between Dispatch and ExpertCompute and between ExpertCompute and
// Combine:
//   Route     logits -> scores, top-k, gates, counts            (MoeRoute, MoeAuxLoss)
//   Dispatch  token rows -> expert-contiguous rows              (MoeDispatchPlan, MoeGather)
//   Combine   expert rows -> gate-weighted sum in token order   (MoeCombine)
// and their backward passes. Every loop is either serial or a static loop over independent
// tokens/rows, so results do not depend on the thread schedule.
#pragma once

#include <cstdint>

namespace moelab::cpu {

// logits [n,E] -> scores [n,E] (softmax or sigmoid of the logits, unbiased); topk [n,k] the k
// experts with the largest score + bias (bias [E] may be null; ties go to the lower index;
// slot order = descending biased score); gates [n,k] = route_scale · the chosen unbiased scores
// renormalised to sum 1 over the k chosen; counts [E] = number of (token, slot) assignments.
template <typename T>
void MoeRoute(const T* logits, int n, int experts, int k, bool sigmoid, const T* bias,
              double route_scale, T* scores, int* topk, T* gates, int64_t* counts);

// Switch-style load-balancing loss coef·E·Σ_i f_i·P_i with f_i = counts_i/(n·k) and P_i the mean
// over tokens of the normalised score (softmax: the score; sigmoid: s_i/Σ_j s_j).
template <typename T>
double MoeAuxLoss(const T* scores, const int64_t* counts, int n, int experts, int k, bool sigmoid,
                  double coef);

// Backward of MoeRoute (through the gates) plus, when aux_coef != 0, of MoeAuxLoss (through P;
// f carries no gradient): dgates [n,k] -> dlogits [n,E] (overwritten). The bias gets no gradient.
template <typename T>
void MoeRouteBackward(const T* scores, const int* topk, const T* dgates, const int64_t* counts,
                      int n, int experts, int k, bool sigmoid, double route_scale, double aux_coef,
                      T* dlogits);

// Counting sort of the (token, slot) assignments by expert, stable by token then slot:
// offsets [E+1] (expert e owns rows offsets[e] .. offsets[e+1]), row_token [n·k] (row -> token),
// slot_row [n·k] (token·k + slot -> row).
void MoeDispatchPlan(const int* topk, int n, int experts, int k, int64_t* offsets, int* row_token,
                     int* slot_row);

// xe[r] = x[row_token[r]] for r < rows; x [n,d], xe [rows,d].
template <typename T>
void MoeGather(const T* x, int d, const int* row_token, int64_t rows, T* xe);

// Backward of MoeGather: dx[t] (= or +=) Σ_slot dxe[slot_row[t·k+slot]], summed in slot order
// per token so that the result does not depend on the thread schedule.
template <typename T>
void MoeGatherBackward(const T* dxe, const int* slot_row, int n, int k, int d, T* dx,
                       bool accumulate);

// y[t] (= or +=) Σ_slot gates[t,slot]·ye[slot_row[t·k+slot]], in slot order.
template <typename T>
void MoeCombine(const T* ye, const int* slot_row, const T* gates, int n, int k, int d, T* y,
                bool accumulate);

// Backward of MoeCombine: dgates[t,slot] = dy[t]·ye[row]; dye[row] = gates[t,slot]·dy[t].
// dye may alias ye (each row is read before it is written, by the same iteration).
template <typename T>
void MoeCombineBackward(const T* dy, const T* ye, const int* slot_row, const T* gates, int n, int k,
                        int d, T* dye, T* dgates);

}  // namespace moelab::cpu
