// The one Mixture-of-Experts FFN layer (routed top-k SwiGLU experts + always-on shared experts),
// forward and hand-written backward, written once over a backend's MoE ops
// (core/model/moe_experts.h: the CPU's core/model/cpu_moe.h, CUDA's core/model/cuda_moe.h):
// Route → aux loss (with the batch's statistics) → Dispatch → [all-to-all to the experts'
// owners] → experts → [all-to-all back] → Combine, and the reverse. The order, the aux loss and
// its statistics hook, the expert shard and the expert-parallel exchange live here; what runs
// where and in which precision lives in the ops.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "core/config.h"
#include "core/model/backend_memory.h"
#include "core/model/expert_exchange.h"
#include "core/model/moe.h"
#include "core/model/moe_experts.h"

namespace moelab {

class Communicator;

template <typename T>
class MoeLayer {
 public:
  // experts: the backend's ops for this layer; memory: the backend's (the exchange's buffers).
  // The layer holds routed experts expert_first … expert_first + expert_count − 1 (−1: all);
  // see SetExpertShard.
  MoeLayer(const ModelConfig& model, const MoEConfig& moe, std::unique_ptr<MoeExperts<T>> experts,
           BackendMemory* memory, int expert_first = 0, int expert_count = -1);

  // x [n,d] normalised input; y [n,d] overwritten (routed + shared). bias [E]: selection bias
  // (aux-loss-free balancing; affects selection only; may be null = zeros). counts [E] (host)
  // overwritten with top-k assignment counts (may be null). Returns the aux loss (coefficient
  // included; 0 unless balance=="aux_loss"). Keeps what backward needs (one MoeLayer object per
  // model layer). Under expert parallelism (SetMoeExpertParallel) collective over its group.
  double Forward(const MoeWeights<T>& w, const T* bias, const T* x, int n, T* y, int64_t* counts);

  // dy [n,d] -> dx [n,d] overwritten; grads written (overwritten) through g; includes the aux
  // loss gradient (d objective / d aux = 1). Must follow Forward with the same w, x and n, once
  // (the ops overwrite saved expert outputs with their gradients).
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
  // Bytes of the ops' buffers and (host memory) the exchange's; a device backend counts its own
  // in its memory plan.
  size_t workspace_bytes() const;
  // The ops (tests and benchmarks reach the CPU ops' schedule through them).
  MoeExperts<T>& experts() { return *experts_; }

 private:
  // The Switch aux loss from the batch statistics (local, or the hook's); hands the route
  // backward its counts.
  double AuxLoss(int n);
  // The expert-parallel group of this call (null: none), checked against the held experts.
  Communicator* ExpertGroup() const;
  // Every gradient zero (no tokens).
  void ZeroGrads(const MoeWeights<T>& g);

  MoeShape shape_;
  std::unique_ptr<MoeExperts<T>> experts_;
  BackendMemory* memory_;
  int expert_first_ = 0, expert_count_ = 0;
  int n_ = 0;  // tokens of the last Forward
  MoeBatchStatsHook batch_hook_;
  int moe_layer_ = 0;
  std::vector<int64_t> batch_counts_;  // [E] the aux loss's counts (the batch's, via the hook)
  std::vector<double> score_sums_;     // [E] Σ_t s̃_{t,i} (the batch's, via the hook)
  int64_t batch_tokens_ = 0;           // the aux loss's token count N
  // Expert parallelism: the exchange, and the rows the last Forward ran its routed experts on.
  ExpertExchange exchange_;
  MoeRoutedRows rows_;
  bool ep_active_ = false;  // the last Forward ran expert-parallel
};

}  // namespace moelab
