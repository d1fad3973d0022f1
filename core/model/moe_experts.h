// The backend's MoE ops for one layer (routing, dispatch, grouped expert products, combine, aux
// statistics): what the one MoE layer (core/model/moe_layer.h) calls, in its order, on a
// backend. The CPU ops are core/model/cpu_moe.h (kernels/cpu), the CUDA ones
// core/model/cuda_moe.h (kernels/cuda); the layer keeps the order, the aux loss and its batch
// statistics, and the expert-parallel exchange, written once.
//
// An ops object belongs to one layer and keeps, between a Forward and its Backward, what they
// share (router scores, top-k, gates, the dispatch plan, expert activations) in the buffers and
// the precision its backend chooses (CUDA: bf16 expert activations in bf16 mode). Every T pointer
// is memory of the backend; counts and score sums are host memory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/model/moe.h"

namespace moelab {

// A layer's dispatched rows as bytes, for the expert-parallel exchange
// (core/model/expert_exchange.h): inputs, outputs (then output gradients) and input gradients,
// each row row_bytes long, in the backend's memory and expert precision.
struct MoeRowBuffers {
  void *x = nullptr, *y = nullptr, *dx = nullptr;
  size_t row_bytes = 0;
};

// Which rows the routed experts run on: this rank's dispatched rows (owned false) or, under
// expert parallelism, the rows received for the experts it owns (owned true). offsets: the
// experts' row offsets (host), count + 1 of them starting at the first expert held; total: all
// rows of the buffer (offsets of the whole layer's last).
struct MoeRoutedRows {
  const int64_t* offsets = nullptr;
  int count = 0;
  int64_t total = 0;
  bool owned = false;
};

template <typename T>
class MoeExperts {
 public:
  virtual ~MoeExperts() = default;

  // Buffers for n tokens (grow only). expert_parallel: the routed experts will run on owned
  // rows (OwnedRows), so the local rows need not keep their activations.
  virtual void Reserve(int n, bool expert_parallel) = 0;

  // Router logits x·routerᵀ, scores, top-k by the biased scores (bias [E] may be null), gates and
  // the top-k counts; counts_out [E] (host, may be null) gets the counts.
  virtual void Route(const T* router, const T* bias, const T* x, int n, int64_t* counts_out) = 0;
  // The local aux statistics (host): the top-k counts [E] and Σ_t s̃_{t,i} [E] (normalised scores
  // summed in token order).
  virtual void AuxStatistics(int64_t* counts, double* score_sums) = 0;
  // The Switch aux loss of the local tokens (core/model/moe.h SwitchAuxLoss). A backend may
  // compute it where its scores live (CUDA: on the device).
  virtual double LocalAuxLoss(const MoeShape& shape, int n) {
    counts_.assign(shape.experts, 0);
    sums_.assign(shape.experts, 0.0);
    AuxStatistics(counts_.data(), sums_.data());
    return SwitchAuxLoss(shape, counts_.data(), sums_.data(), n);
  }
  // The counts the route backward's aux-loss gradient uses: the batch's [E] (host; kept until
  // the next Forward), or null: the local ones.
  virtual void SetAuxCounts(const int64_t* batch_counts) = 0;

  // The dispatch plan (expert-contiguous rows) and the gather of x into the dispatched rows.
  // Returns the experts' row offsets [E+1] on the host, or null where the backend keeps them on
  // the device (only without expert parallelism: CUDA's cuDNN experts).
  virtual const int64_t* Dispatch(const T* x) = 0;
  // The dispatched rows, and (expert parallelism) the owned rows grown to `rows`.
  virtual MoeRowBuffers LocalRows() = 0;
  virtual MoeRowBuffers OwnedRows(int64_t rows) = 0;
  // The routed experts on `rows` (outputs into their y rows) and the shared experts on x into
  // y [n, d] (overwritten with their sum; untouched without shared experts, Combine then
  // overwrites it).
  virtual void ExpertsForward(const MoeWeights<T>& w, const T* x, const MoeRoutedRows& rows,
                              T* y) = 0;
  // y (+)= Σ_slot gate·(expert output): accumulates over the shared experts' sum when there are
  // any, else overwrites.
  virtual void Combine(T* y) = 0;

  // dy → the expert-output gradients (over the dispatched rows' y) and the gate gradients.
  virtual void CombineBackward(const T* dy) = 0;
  // Gates and aux loss → router-logit gradients, with the aux coefficient of this piece
  // (PieceAuxCoef).
  virtual void RouteBackward(double aux_coef) = 0;
  // The routed experts' backward on `rows` (input gradients into their dx rows), the shared
  // experts' into dx [n, d] (overwritten) and the router weight gradient into g.router: every
  // weight gradient overwritten.
  virtual void ExpertsBackward(const MoeWeights<T>& w, const MoeWeights<T>& g, const T* x,
                               const T* dy, const MoeRoutedRows& rows, T* dx) = 0;
  // dx += each token's dispatched input gradients (in slot order; = when there are no shared
  // experts), then dx += dlogits·router.
  virtual void DispatchBackward(const T* router, T* dx) = 0;

  // Bytes of the buffers (0 where the backend's memory plan counts them: CUDA).
  virtual size_t workspace_bytes() const = 0;

 private:
  std::vector<int64_t> counts_;
  std::vector<double> sums_;
};

}  // namespace moelab
