// The CPU backend's MoE ops (core/model/moe_experts.h) over kernels/cpu: routing and dispatch
// (kernels/cpu/moe_routing.h), the routed experts (kernels/cpu/moe_experts.h) and the shared
// ones (kernels/cpu/swiglu.h) on host memory, float for training and double for the
// finite-difference checks.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "core/config.h"
#include "core/model/moe_experts.h"
#include "core/model/moe_layer.h"

namespace moelab {

template <typename T>
class CpuMoeExperts final : public MoeExperts<T> {
 public:
  CpuMoeExperts(const ModelConfig& model, const MoEConfig& moe);

  void Reserve(int n, bool expert_parallel) override;
  void Route(const T* router, const T* bias, const T* x, int n, int64_t* counts_out) override;
  void AuxStatistics(int64_t* counts, double* score_sums) override;
  void SetAuxCounts(const int64_t* batch_counts) override;
  const int64_t* Dispatch(const T* x) override;
  MoeRowBuffers LocalRows() override;
  MoeRowBuffers OwnedRows(int64_t rows) override;
  void ExpertsForward(const MoeWeights<T>& w, const T* x, const MoeRoutedRows& rows, T* y) override;
  void Combine(T* y) override;
  void CombineBackward(const T* dy) override;
  void RouteBackward(double aux_coef) override;
  void ExpertsBackward(const MoeWeights<T>& w, const MoeWeights<T>& g, const T* x, const T* dy,
                       const MoeRoutedRows& rows, T* dx) override;
  void DispatchBackward(const T* router, T* dx) override;
  size_t workspace_bytes() const override;

  // The expert loop's schedule. true (the default; measured faster, and bit-identical for any
  // thread count): one dynamic OpenMP loop over shared-expert row chunks, routed experts and the
  // router gradient, single-threaded BLAS inside; false: experts one after another, BLAS
  // threading inside each GEMM. Tests and benchmarks compare the two.
  void set_task_parallel(bool on) { task_parallel_ = on; }
  // The last Forward's chosen experts [n, k] (slot order = descending biased score).
  std::vector<int> topk() const {
    return {topk_.begin(), topk_.begin() + static_cast<long>(n_) * shape_.top_k};
  }

 private:
  // The rows the routed experts run on: the dispatched ones, or the owned ones (EP).
  struct Rows {
    T *x, *y, *dx;
    const int64_t* offsets;  // of the first expert held
    int count;
    int64_t total;
  };
  Rows RowsOf(const MoeRoutedRows& rows);

  MoeShape shape_;
  bool task_parallel_ = true;

  int n_ = 0;                        // tokens of the last Forward
  int capacity_ = 0;                 // tokens the buffers are sized for
  std::vector<T> logits_;            // [n, E] router logits, reused for their gradient dz
  std::vector<T> scores_;            // [n, E] softmax/sigmoid scores (unbiased)
  std::vector<int> topk_;            // [n, k] chosen experts, slot order = descending biased score
  std::vector<T> gates_;             // [n, k]
  std::vector<int64_t> counts_;      // [E] local top-k assignment counts
  std::vector<int64_t> aux_counts_;  // [E] the batch's counts for the route backward
  bool batch_counts_ = false;        // aux_counts_ holds them (else counts_)
  std::vector<int64_t> offsets_;     // [E+1] expert-contiguous row offsets
  std::vector<int> row_token_;       // [n*k] dispatched row -> token
  std::vector<int> slot_row_;        // [n*k] token*k + slot -> dispatched row
  std::vector<T> xe_;                // [n*k, d] gathered inputs
  std::vector<T> ye_;                // [n*k, d] expert outputs (un-gated), reused as their grads
  std::vector<T> h1_, h3_, act_;     // [rows, H] routed expert activations (local or owned)
  std::vector<T> sh1_, sh3_, sact_;  // [S, n, H] shared expert activations
  std::vector<T> sy_;                // [S-1, n, d] outputs (then dx) of shared experts 1..S-1
  std::vector<T> dxe_;               // [n*k, d]
  std::vector<T> scratch_;           // [rows + S*n, 2H] backward scratch, disjoint per task
  std::vector<T> dgates_;            // [n, k]
  std::vector<T> shared_partial_;    // [S, chunks, 3, H*d] per-row-chunk shared weight grads
  std::vector<T> xr_, yr_, dxr_;     // [R, d] owned rows (EP): inputs, outputs, input grads
};

// A MoE layer on the CPU ops over host memory (tests, benchmarks).
template <typename T>
class CpuMoeLayer : public MoeLayer<T> {
 public:
  CpuMoeLayer(const ModelConfig& model, const MoEConfig& moe)
      : MoeLayer<T>(model, moe, std::make_unique<CpuMoeExperts<T>>(model, moe), &Host()) {}
  CpuMoeExperts<T>& cpu_experts() { return static_cast<CpuMoeExperts<T>&>(this->experts()); }
};

}  // namespace moelab
