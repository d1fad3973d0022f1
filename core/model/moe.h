// Mixture-of-Experts FFN layer (routed top-k SwiGLU experts + always-on shared experts) with a
// hand-written backward pass on CPU. Split into Route / Dispatch / Combine
// (kernels/cpu/moe_routing.h) and ExpertCompute (kernels/cpu/moe_experts.h) so an all-to-all
// can later sit between Dispatch and ExpertCompute and between ExpertCompute and Combine for
// expert parallelism.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "core/config.h"
#include "core/model/expert_exchange.h"

namespace moelab {

class Communicator;

// Expert parallelism (dist.expert_parallel, issue 9): while set, every MoeLayer<float> of this
// process owns only the routed experts of its block (rank r of the P ranks of comm owns experts
// r·E/P … (r+1)·E/P − 1). Forward sends each dispatched row to its expert's owner by all-to-all
// between Dispatch and ExpertCompute and brings the outputs back before Combine; Backward does
// the reverse exchanges. The gradients of experts this rank does not own come out zero. Every
// rank of comm must run the same Forward/Backward calls in the same order. Null: off (the
// trainer sets it for a run and clears it at the end). Per thread (the thread that calls the
// layers).
void SetMoeExpertParallel(Communicator* comm);
// The calling thread's expert-parallel communicator (null: off); the device MoE layer reads it.
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

// A MoE layer's shape and routing settings, read from the config and checked once for both
// layers (this CPU one and the device one of core/model/cuda_moe.h).
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

template <typename T>
class MoeLayer {
 public:
  MoeLayer(const ModelConfig& model, const MoEConfig& moe);

  // x [n,d] normalised input; y [n,d] overwritten (routed + shared). bias [E]: selection bias
  // (aux-loss-free balancing; affects selection only; may be null = zeros). counts [E]
  // overwritten with top-k assignment counts (may be null). Returns the aux loss (coefficient
  // included; 0 unless balance=="aux_loss").
  // Keeps what backward needs (one MoeLayer object per model layer); allocates for n on first
  // use (re-allocates only when n grows; no allocations per step otherwise).
  double Forward(const MoeWeights<T>& w, const T* bias, const T* x, int n, T* y, int64_t* counts);

  // dy [n,d] -> dx [n,d] overwritten; grads written (overwritten) through g; includes the aux
  // loss gradient (d objective / d aux = 1). Must follow Forward with the same w, x and n, once
  // (it overwrites saved expert outputs with their gradients).
  void Backward(const MoeWeights<T>& w, const MoeWeights<T>& g, const T* x, const T* dy, int n,
                T* dx);
  // Sharded expert parallelism (issue 23): the weights and gradients passed to Forward/Backward
  // hold only routed experts first … first+count−1 (w1/w3/w2 are [count, …]). Must equal this
  // rank's block of the expert-parallel communicator while one is set; without one only the
  // whole set (first 0, count E) is valid.
  void SetExpertShard(int first, int count);
  // Global-batch statistics for the aux loss (see MoeBatchStatsHook); moe_layer is passed to
  // the hook. Only consulted when balance == "aux_loss".
  void SetBatchStatsHook(MoeBatchStatsHook hook, int moe_layer) {
    batch_hook_ = std::move(hook);
    moe_layer_ = moe_layer;
  }
  // Bytes of the dispatch and activation buffers (sized by the largest n seen so far).
  size_t workspace_bytes() const;

 private:
  friend class MoeLayerTestPeer;  // tests and benchmarks switch the expert-loop strategy

  void Reserve(int n);
  // The Switch aux loss from the batch statistics (local, or the hook's); fills batch_counts_
  // and batch_tokens_ for Backward.
  double AuxLoss(int n);
  void ExpertForward(const MoeWeights<T>& w, const T* x, T* y);
  void ExpertBackward(const MoeWeights<T>& w, const MoeWeights<T>& g, const T* x, const T* dy,
                      T* dx);
  // Expert parallelism (see SetMoeExpertParallel): plans the exchange and sizes the owned rows.
  void EpPlan(Communicator& ep);

  // The routed experts the weights hold (all unless sharded), and a check that they are the
  // ones whose rows this rank computes.
  void CheckShard(const Communicator* ep) const;

  MoeShape shape_;
  int expert_first_ = 0, expert_count_ = 0;
  // true (measured faster, and bit-identical for any thread count): one dynamic OpenMP loop over
  // shared-expert row chunks, routed experts and the router gradient, single-threaded BLAS
  // inside; false: experts one after another, BLAS threading inside each GEMM.
  bool expert_parallel_ = true;

  int n_ = 0;                    // tokens of the last Forward
  int capacity_ = 0;             // tokens the buffers are sized for
  std::vector<T> logits_;        // [n, E] router logits, reused for their gradient dz
  std::vector<T> scores_;        // [n, E] softmax/sigmoid scores (unbiased)
  std::vector<int> topk_;        // [n, k] chosen experts, slot order = descending biased score
  std::vector<T> gates_;         // [n, k]
  std::vector<int64_t> counts_;  // [E] local top-k assignment counts
  std::vector<int64_t> batch_counts_;  // [E] the aux loss's counts (the batch's, via the hook)
  std::vector<double> score_sums_;     // [E] Σ_t s̃_{t,i} (the batch's, via the hook)
  int64_t batch_tokens_ = 0;           // the aux loss's token count N
  MoeBatchStatsHook batch_hook_;
  int moe_layer_ = 0;
  std::vector<int64_t> offsets_;     // [E+1] expert-contiguous row offsets
  std::vector<int> row_token_;       // [n*k] dispatched row -> token
  std::vector<int> slot_row_;        // [n*k] token*k + slot -> dispatched row
  std::vector<T> xe_;                // [n*k, d] gathered inputs
  std::vector<T> ye_;                // [n*k, d] expert outputs (un-gated), reused as their grads
  std::vector<T> h1_, h3_, act_;     // [n*k, H] routed expert activations
  std::vector<T> sh1_, sh3_, sact_;  // [S, n, H] shared expert activations
  std::vector<T> sy_;                // [S-1, n, d] outputs (then dx) of shared experts 1..S-1
  std::vector<T> dxe_;               // [n*k, d]
  std::vector<T> scratch_;           // [n*k + S*n, 2H] backward scratch, disjoint per task
  std::vector<T> dgates_;            // [n, k]
  std::vector<T> shared_partial_;    // [S, chunks, 3, H*d] per-row-chunk shared weight grads
  // Expert parallelism: the exchange, and the rows received for the owned experts
  // (expert-contiguous; see core/model/expert_exchange.h).
  ExpertExchange exchange_;
  std::vector<int64_t> ep_offsets_;  // [E+1] offsets of the owned rows (0 rows: other experts)
  std::vector<T> xr_, yr_, dxr_;     // [R, d] owned rows: inputs, outputs, input grads
  bool ep_active_ = false;           // the last Forward ran expert-parallel
};

// Aux-loss-free balancing update from the step's global counts:
// b_i += rate * sign(mean(counts) - counts_i).
template <typename T>
void UpdateSelectionBias(T* bias, const int64_t* counts, int experts, double rate);

}  // namespace moelab
