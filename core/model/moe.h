// The pieces every MoE layer shares (core/model/moe_layer.h, over a backend's ops of
// core/model/moe_experts.h): the layer's shape and routing settings, its weights, the Switch aux
// loss and its global-batch statistics hook, the expert-parallel switch, and the aux-loss-free
// bias update.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "core/config.h"

namespace moelab {

class Communicator;

// Expert parallelism (dist.expert_parallel, issue 9): while set, every MoeLayer of this
// process owns only the routed experts of its block (rank r of the P ranks of comm owns experts
// r·E/P … (r+1)·E/P − 1). Forward sends each dispatched row to its expert's owner by all-to-all
// between Dispatch and ExpertCompute and brings the outputs back before Combine; Backward does
// the reverse exchanges. The gradients of experts this rank does not own come out zero. Every
// rank of comm must run the same Forward/Backward calls in the same order. Null: off (the
// trainer sets it for a run and clears it at the end). Per thread (the thread that calls the
// layers).
void SetMoeExpertParallel(Communicator* comm);
// The calling thread's expert-parallel communicator (null: off).
Communicator* MoeExpertParallel();

// Global-batch balancing (issue 23). A layer sees only this process's tokens (one rank's rows of
// the global batch, or one micro-batch of them), but the Switch aux loss coef·E·Σ_i f_i·P_i is
// defined on the whole batch: f_i = C_i/(N·k) from the batch's top-k assignment counts C_i and
// P_i = Σ_t s̃_{t,i}/N from the batch's normalised router scores, N its tokens. A hook turns the
// layer's local statistics into the batch's, in place, before the aux loss is formed:
//   counts [E]      top-k assignments of the local tokens   -> of the batch
//   score_sums [E]  Σ_t s̃_{t,i} over the local tokens       -> over the batch
//   tokens          local tokens                            -> the batch's tokens N
// The trainer's hook all-reduces them over the data-parallel ranks (E+E+1 numbers per layer);
// a micro-batching loop can instead supply the step's counts (and score sums) gathered
// beforehand. The gradient is then that of the batch objective averaged over its N/n equal
// pieces: each piece's backward uses the batch's f_i, scaled by n/N, so averaging the pieces'
// gradients (the data-parallel mean) gives the one-process gradient. The expert counts the layer
// reports to StepStats stay local (the trainer sums them). Called once per MoE layer per
// Forward, on every rank, in layer order (for double models too); null: the local batch.
struct MoeBatchStats {
  int experts;         // E
  int64_t* counts;     // [E]
  double* score_sums;  // [E]
  int64_t* tokens;
};
using MoeBatchStatsHook = std::function<void(int moe_layer, MoeBatchStats& stats)>;

// A MoE layer's shape and routing settings, read from the config and checked once.
struct MoeShape {
  // Throws std::invalid_argument naming what is wrong.
  MoeShape(const ModelConfig& model, const MoEConfig& moe);
  int d, hidden, experts, top_k, shared;
  bool sigmoid;     // moe.router "sigmoid" (else softmax)
  bool aux_loss;    // moe.balance "aux_loss"
  double aux_coef;  // moe.aux_loss_coef
  double route_scale;
};

// The Switch aux loss of a batch's statistics (MoeBatchStats): coef·E·Σ_i f_i·P_i with
// f_i = counts_i/(N·k), P_i = score_sums_i/N; 0 for N = 0.
double SwitchAuxLoss(const MoeShape& shape, const int64_t* counts, const double* score_sums,
                     int64_t tokens);
// What a piece of n of the batch's N tokens passes as the aux coefficient to its route backward
// (which forms coef·E·f_i/n from the counts and n): coef·n/N, so that the data-parallel mean of
// the pieces' gradients is the batch objective's gradient (see MoeLayer::Backward). 0 for N = 0.
double PieceAuxCoef(const MoeShape& shape, int n, int64_t tokens);

template <typename T>
struct MoeWeights {  // pointers into the param arena (or grad arena)
  T* router;         // [E, d]
  T* w1;             // [E, H, d]   (H = moe.expert_hidden)
  T* w3;             // [E, H, d]
  T* w2;             // [E, d, H]
  T* shared_w1;      // [S, H, d]   (null when moe.shared_experts == 0)
  T* shared_w3;      // [S, H, d]
  T* shared_w2;      // [S, d, H]
};

// Aux-loss-free balancing update from the step's global counts:
// b_i += rate * sign(mean(counts) - counts_i).
template <typename T>
void UpdateSelectionBias(T* bias, const int64_t* counts, int experts, double rate);

}  // namespace moelab
