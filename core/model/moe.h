// Mixture-of-Experts FFN layer (routed top-k SwiGLU experts + always-on shared experts) with a
// hand-written backward pass on CPU. Split into Route / Dispatch / Combine
// (kernels/cpu/moe_routing.h) and ExpertCompute (kernels/cpu/moe_experts.h) so an all-to-all
// can later sit between Dispatch and ExpertCompute and between ExpertCompute and Combine for
// expert parallelism.
#pragma once

#include <cstdint>
#include <vector>

#include "core/config.h"

namespace moelab {

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
  // Bytes of the dispatch and activation buffers (sized by the largest n seen so far).
  size_t workspace_bytes() const;

 private:
  friend class MoeLayerTestPeer;  // tests and benchmarks switch the expert-loop strategy

  void Reserve(int n);
  void ExpertForward(const MoeWeights<T>& w, const T* x, T* y);
  void ExpertBackward(const MoeWeights<T>& w, const MoeWeights<T>& g, const T* x, const T* dy,
                      T* dx);

  int d_, hidden_, experts_, top_k_, shared_;
  bool sigmoid_;
  bool aux_loss_;
  double aux_coef_;
  double route_scale_;
  // true (measured faster, and bit-identical for any thread count): one dynamic OpenMP loop over
  // shared-expert row chunks, routed experts and the router gradient, single-threaded BLAS
  // inside; false: experts one after another, BLAS threading inside each GEMM.
  bool expert_parallel_ = true;

  int n_ = 0;                        // tokens of the last Forward
  int capacity_ = 0;                 // tokens the buffers are sized for
  std::vector<T> logits_;            // [n, E] router logits, reused for their gradient dz
  std::vector<T> scores_;            // [n, E] softmax/sigmoid scores (unbiased)
  std::vector<int> topk_;            // [n, k] chosen experts, slot order = descending biased score
  std::vector<T> gates_;             // [n, k]
  std::vector<int64_t> counts_;      // [E]
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
};

// Aux-loss-free balancing update from the step's global counts:
// b_i += rate * sign(mean(counts) - counts_i).
template <typename T>
void UpdateSelectionBias(T* bias, const int64_t* counts, int experts, double rate);

}  // namespace moelab
