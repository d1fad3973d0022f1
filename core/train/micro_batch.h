// Gradient accumulation (train.micro_batch): one optimizer step over a rank's rows, split into
// micro-batches that each run one forward/backward, on any backend (core/model/backend.h).
//
// The step equals the unsplit one up to float rounding: each micro-batch's mean loss and
// gradient are weighted by its share of the rows, S_max is the maximum over micro-batches, and
// expert counts add up. The Switch aux loss is not linear in the batch (f_i·P_i): StepAuxStats
// below gives every micro-batch the step's statistics.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/config.h"
#include "core/model/backend.h"
#include "core/model/model.h"
#include "core/model/moe.h"
#include "core/step_stats.h"

namespace moelab {

struct MicroBatchPlan {
  int rows = 0;   // the rank's local batch (sequences)
  int micro = 0;  // sequences per forward/backward
  int count() const { return micro > 0 ? (rows + micro - 1) / micro : 0; }
  int begin(int i) const { return i * micro; }
  int size(int i) const { return std::min(micro, rows - i * micro); }
  double weight(int i) const { return static_cast<double>(size(i)) / rows; }
};

// train.micro_batch over a rank's local batch: 0 (or anything larger) = one micro-batch.
MicroBatchPlan PlanMicroBatches(const RunConfig& config, int local_batch);

// Folds one micro-batch's statistics into the step's (the first call overwrites).
void AccumulateStats(const StepStats& part, double weight, bool first, StepStats* step);

// Gradient accumulator in a backend's memory: sum_i w_i·g_i, written back into the model's
// gradient arena by Finish so optimizers see one ordinary gradient. The buffer is allocated on
// first use (none when the batch is not split).
class GradAccumulator {
 public:
  GradAccumulator(Backend<float>& backend, size_t n) : be_(backend), n_(n), buf_(&backend) {}
  // acc = w·g (first) or acc += w·g.
  void Add(const float* g, double w, bool first);
  // g = acc + w·g: the last micro-batch's gradient joins without another pass.
  void Finish(float* g, double w);
  size_t bytes() const { return buf_.size() * sizeof(float); }

 private:
  Backend<float>& be_;
  size_t n_;
  BackendArray<float> buf_;
};

// The Switch aux loss coef·E·Σ_i f_i·P_i is a product of two means over the step's batch, so a
// micro-batch's own statistics would give another objective. With balance "aux_loss" and
// several micro-batches, a forward-only pass over every micro-batch first records each MoE
// layer's top-k counts, score sums and tokens (the MoeBatchStatsHook of core/model/moe.h); their
// sums, passed through `ranks` (the data-parallel all-reduce, core/dist/batch_stats.h; null in
// one process), then replace each micro-batch's own in its forward/backward. It costs one extra
// forward per step, only in that case.
class StepAuxStats {
 public:
  explicit StepAuxStats(MoeBatchStatsHook ranks) : ranks_(std::move(ranks)) {}
  // Clears the sums; then a hook that adds each call's local statistics to them.
  MoeBatchStatsHook Recorder();
  // The sums through `ranks` (once, after the recording pass).
  void Combine();
  // A hook that overwrites a layer's statistics with the step's.
  MoeBatchStatsHook Replayer();
  // What the model's hook was before (restored after the step).
  const MoeBatchStatsHook& ranks() const { return ranks_; }

 private:
  struct Layer {
    std::vector<int64_t> counts;
    std::vector<double> score_sums;
    int64_t tokens = 0;
  };
  std::vector<Layer> layers_;
  MoeBatchStatsHook ranks_;
};

// tokens: the rank's rows [plan.rows, seq_len + 1]. Returns the step's objective; stats gets the
// merged statistics and model.grads() the step's gradient. aux: the step's aux-loss statistics
// (balance "aux_loss"), or null.
double ForwardBackwardMicroBatched(Model<float>& model, const int32_t* tokens, int seq_len,
                                   const MicroBatchPlan& plan, StepStats* stats,
                                   GradAccumulator& acc, StepAuxStats* aux = nullptr);

// Forward only (evaluation), in the same micro-batches.
double ForwardMicroBatched(Model<float>& model, const int32_t* tokens, int seq_len,
                           const MicroBatchPlan& plan, StepStats* stats);

}  // namespace moelab
