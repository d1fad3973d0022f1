// One training run of Train (core/train/trainer.h) as an object: the set-up (device, parallel
// groups, model and optimizer, resume), the step, the evaluation, the checkpoints and the finish
// each in their own member function, sharing the run's state as members. Internal to Train.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/config.h"
#include "core/data/data.h"
#include "core/comm/communicator.h"
#include "core/dist/expert_shard.h"
#include "core/dist/grad_overlap.h"
#include "core/dist/layout.h"
#include "core/comm/nccl_communicator.h"
#include "core/dist/zero.h"
#include "core/metrics.h"
#include "core/model/model.h"
#include "core/optim/optimizer.h"
#include "core/train/micro_batch.h"
#include "core/train/progress.h"
#include "core/train/trainer.h"

namespace moelab {

// What Train computes before anything can fail (outside its error handling).
struct TrainingConstants {
  std::string ckpt_dir;
  std::string hash;         // ConfigHash
  std::string branch_hash;  // BranchHash
  int64_t total = 0;        // the run's steps
  int B = 0, S = 0;         // the global batch, the sequence length
  int64_t tokens_per_step = 0;
  double flops_per_token = 0;
};

class TrainingRun {
 public:
  // sink: already the null sink on ranks other than 0. Results accumulate in *result.
  TrainingRun(const RunConfig& c, MetricsSink* sink, const TrainOptions& options,
              Communicator& comm, const TrainingConstants& k, TrainResult& result);
  ~TrainingRun();

  // Set-up, the steps, the finish; throws what Train reports as a failed run.
  void Run();

 private:
  using Clock = std::chrono::steady_clock;

  void SetUpDevice();
  void SetUpExpertParallel();
  void SetUpModel();
  void SetUpOptimizer();
  void Resume();
  void ReportMemory();
  void PrepareLoop();

  // One step; false when the run diverged (already reported to the sink).
  bool Step();
  bool ShouldStop();
  void ReduceGradients(float* grads, size_t n);
  double GradNorm(const float* grads, size_t n);
  void ReportDivergence(double grad_norm);
  double Update(float* grads, size_t n, double grad_norm);
  void AfterStep();

  double Evaluate();
  std::vector<StateBuffer> CheckpointState(std::vector<std::vector<float>>& storage, bool gather);
  std::string WriteCheckpointTo(const std::string& dir, int64_t at, int keep);
  void Checkpoint(int64_t at);
  bool IsBranchStep(int64_t at) const;
  void Finish();

  const RunConfig& c_;
  MetricsSink* sink_;
  const TrainOptions& options_;
  Communicator* comm_;
  const TrainingConstants& k_;
  TrainResult& result_;
  const bool leader_;

  // Declared in the order the set-up creates them (destroyed in reverse).
  bool on_cuda_ = false;
  DistLayout layout_;
  int local_batch_ = 0;
  MicroBatchPlan micro_;
  std::unique_ptr<NcclCommunicator> nccl_;
  Communicator* grad_comm_ = nullptr;
  bool sharded_ep_ = false;
  std::unique_ptr<Communicator> ep_comm_, dp_comm_, ep_nccl_, dp_nccl_;
  Communicator *ep_grad_ = nullptr, *dp_grad_ = nullptr;
  struct ExpertParallelScope;
  std::unique_ptr<ExpertParallelScope> ep_scope_;
  std::unique_ptr<TokenSource> data_;
  std::unique_ptr<Model<float>> model_;
  Backend<float>* be_ = nullptr;
  bool host_ = false;
  bool zero_ = false;
  bool muon_ = false;
  std::unique_ptr<Optimizer> optimizer_;
  std::unique_ptr<ShardedOptimizer> sharded_;
  std::vector<ArenaRange> norm_ranges_;
  std::unique_ptr<OverlappedGradReduce> overlap_;
  std::unique_ptr<ExpertShardMap> shard_map_;
  std::vector<float> host_params_;
  std::span<float> params_;
  std::span<float> bias_;

  int64_t step_ = 0, tokens_seen_ = 0;
  double flops_ = 0;
  std::vector<StateBuffer> resume_state_;
  bool in_writer_group_ = false;

  std::vector<int32_t> tokens_;
  const int32_t* local_tokens_ = nullptr;
  StepStats stats_;
  std::unique_ptr<GradAccumulator> accumulator_;
  std::unique_ptr<StepAuxStats> step_aux_;
  std::unique_ptr<ProgressBar> bar_;
  int64_t end_ = 0;
  Clock::time_point t_start_, last_heartbeat_;
  bool aux_free_ = false;
  int64_t steps_timed_ = 0;
  double time_in_steps_ = 0;
  int64_t step_comm_bytes_ = 0;  // collectives inside the timed steps (not eval, checkpoints)
  double step_comm_seconds_ = 0;
  int64_t step_ep_bytes_ = 0;  // of which inside the EP group (token all-to-all, expert gather)
  int64_t recent_window_ = 1;  // how many last losses the summary averages
  std::deque<double> recent_losses_;
};

}  // namespace moelab
