#include "core/train/training_run.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <deque>
#include <limits>
#include <stdexcept>

#include "core/dist/batch_stats.h"
#include "core/dist/expert_parallel.h"
#include "core/model/backend.h"
#include "core/model/moe.h"
#include "core/model/norm_gain_rms.h"
#include "core/optimizer_traits.h"
#include "core/optim/qk_clip_plan.h"
#include "core/train/checkpoint.h"
#include "core/train/device_check.h"

namespace moelab {

namespace {

double Seconds(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// Sums gradients over the data-parallel ranks in buckets of about bucket_mb MiB and averages.
// On a device the communicator is NCCL, which orders itself after the backward's kernels.
void AllReduceGradients(Communicator& comm, Backend<float>& be, float* g, size_t n,
                        double bucket_mb) {
  const size_t bucket =
      std::max<size_t>(1024, static_cast<size_t>(bucket_mb * (1 << 20) / sizeof(float)));
  for (size_t off = 0; off < n; off += bucket)
    comm.AllReduceSum(g + off, std::min(bucket, n - off));
  be.Scale(g, n, 1.0f / comm.world_size());
}

// What checkpoints are read into: this rank's parameters and optimizer buffers, or, under
// sharded expert parallelism (Allocate with a map), whole-model buffers that Scatter then cuts
// into this rank's (transiently full size on every rank, only while resuming).
struct WholeModelBuffers {
  WholeModelBuffers(std::span<float> local_params, const std::vector<StateBuffer>& local_state)
      : params(local_params), state(local_state) {}
  void Allocate(const ExpertShardMap* map) {
    if (!map || !full_params.empty()) return;
    full_params.resize(map->full_size("params"));
    params = full_params;
    storage.reserve(state.size());
    for (StateBuffer& sb : state) {
      storage.emplace_back(map->full_size(sb.name));
      sb.data = &storage.back();
    }
  }
  void Scatter(const ExpertShardMap* map, std::span<float> local_params,
               const std::vector<StateBuffer>& local_state) const {
    if (!map) return;
    map->Scatter("params", params.data(), local_params.data());
    for (size_t i = 0; i < state.size(); ++i) {
      map->Scatter(state[i].name, state[i].data->data(), local_state[i].data->data());
    }
  }
  std::span<float> params;
  std::vector<StateBuffer> state;
  std::vector<float> full_params;
  std::vector<std::vector<float>> storage;
};

}  // namespace

// The MoE layers' expert-parallel group for the run's lifetime (core/model/moe.h).
struct TrainingRun::ExpertParallelScope {
  explicit ExpertParallelScope(Communicator* ep) { SetMoeExpertParallel(ep); }
  ~ExpertParallelScope() { SetMoeExpertParallel(nullptr); }
};

TrainingRun::TrainingRun(const RunConfig& c, MetricsSink* sink, const TrainOptions& options,
                         Communicator& comm, const TrainingConstants& k, TrainResult& result)
    : c_(c),
      sink_(sink),
      options_(options),
      comm_(&comm),
      k_(k),
      result_(result),
      leader_(comm.rank() == 0) {}

TrainingRun::~TrainingRun() = default;

void TrainingRun::Run() {
  SetUpDevice();
  SetUpExpertParallel();
  SetUpModel();
  SetUpOptimizer();
  Resume();
  ReportMemory();
  result_.start_step = step_;
  // The checkpoint it resumed from ("" for none), read and verified by Resume().
  if (options_.on_start) options_.on_start(step_, result_.checkpoint);
  PrepareLoop();
  while (step_ < end_) {
    if (ShouldStop()) break;
    if (!Step()) return;  // diverged
  }
  Finish();
}

void TrainingRun::SetUpDevice() {
  on_cuda_ = TrainsOnCuda(c_);
  RequireTrainDevice(c_);
  layout_ = MakeDistLayout(c_, comm_->world_size(), comm_->rank());
  local_batch_ = layout_.local_batch;
  // Gradient accumulation over train.micro_batch sequences (one buffer, only when it splits).
  micro_ = PlanMicroBatches(c_, local_batch_);
  // Several ranks on GPUs reduce their device gradients through NCCL, bootstrapped over the
  // job's MPI world; host-side collectives (statistics, checkpoints, stop) stay on `comm`.
  grad_comm_ = comm_;
  CheckDevice(c_, layout_);
  if (on_cuda_ && layout_.world > 1) {
    if (comm_->kind() != "nccl") {
      nccl_ = NcclCommunicator::Create();
      grad_comm_ = nccl_.get();
    }
  }
}

void TrainingRun::SetUpExpertParallel() {
  // Expert parallelism: consecutive groups of EP ranks split each MoE layer's experts; tokens
  // travel to their expert's owner by all-to-all inside the group (core/model/moe.h). A rank
  // holds only its experts (parameters, gradients, optimizer state: the model is built with
  // its ExpertShard); their gradients are summed over the DP group of same-expert owners only
  // (core/dist/expert_parallel.h); checkpoints gather the whole model inside the EP group of
  // rank 0 and keep the unsharded format (core/dist/expert_shard.h).
  // ep_comm / dp_comm are host-side (checkpoint gathers); the tokens and gradients travel over
  // ep_grad / dp_grad: the same groups split from grad_comm (NCCL on GPUs, where they live).
  sharded_ep_ = layout_.ep > 1;
  if (sharded_ep_) {
    ep_comm_ = comm_->Split(layout_.rank / layout_.ep, layout_.rank % layout_.ep);
    dp_comm_ = comm_->Split(layout_.rank % layout_.ep, layout_.rank / layout_.ep);
    ep_grad_ = ep_comm_.get();
    dp_grad_ = dp_comm_.get();
    if (grad_comm_ != comm_) {
      ep_nccl_ = grad_comm_->Split(layout_.rank / layout_.ep, layout_.rank % layout_.ep);
      dp_nccl_ = grad_comm_->Split(layout_.rank % layout_.ep, layout_.rank / layout_.ep);
      ep_grad_ = ep_nccl_.get();
      dp_grad_ = dp_nccl_.get();
    }
  }
  ep_scope_ = std::make_unique<ExpertParallelScope>(ep_grad_);
}

void TrainingRun::SetUpModel() {
  data_ = OpenTokenSource(c_.data, c_.model.vocab_size);
  CheckDeviceMemory(c_, layout_);
  const int held = c_.moe.experts_total / layout_.ep;
  model_ = std::make_unique<Model<float>>(
      c_, sharded_ep_ ? ExpertShard{(layout_.rank % layout_.ep) * held, held} : ExpertShard{});
  model_->Init(c_.train.seed);
  be_ = &model_->backend();
  host_ = be_->is_host();
  // Global-batch balancing: every rank holds other rows of the global batch, so the Switch aux
  // loss takes its f_i and P_i from the statistics summed over all ranks (the objective of one
  // process; core/dist/batch_stats.h). The aux-loss-free bias already uses the summed counts.
  if (layout_.world > 1 && c_.moe.enabled() && c_.moe.balance == "aux_loss") {
    model_->SetMoeBatchStatsHook(AllReduceBatchStatsHook(*comm_));
  }
}

void TrainingRun::SetUpOptimizer() {
  Model<float>& model = *model_;
  // ZeRO-1 (with distributed Muon): a sharded optimizer; otherwise every rank steps all.
  zero_ = c_.dist.zero1 && layout_.world > 1;
  muon_ = TraitsOf(c_.optimizer).muon;
  if (zero_) {  // over the ranks holding the same parameters
    sharded_ = std::make_unique<ShardedOptimizer>(c_, model.param_infos(), model.num_params(),
                                                  sharded_ep_ ? *dp_grad_ : *grad_comm_, *be_);
  } else {
    optimizer_ = MakeOptimizer(c_.optimizer, model.param_infos(), be_->optimizer_ops());
    optimizer_->WriteWeightCopy(be_->weight_copy());  // CUDA bf16: written in the update pass
  }
  // The grad norm is summed over the same ranges with and without ZeRO-1 (identical bits).
  norm_ranges_ = layout_.world > 1
                     ? PartitionArena(model.param_infos(), model.num_params(), layout_.world, muon_)
                     : std::vector<ArenaRange>{};
  // Plain data parallelism reduces each gradient bucket as soon as the backward has finished
  // it (core/dist/grad_overlap.h), with the bits of the reduction after the backward. Not with
  // micro-batches: their gradients are final only after the accumulator's last pass.
  if (layout_.world > 1 && !zero_ && !sharded_ep_ && c_.dist.overlap && host_ &&
      micro_.count() == 1) {
    overlap_ = std::make_unique<OverlappedGradReduce>(*comm_, model.grads(), model.num_params(),
                                                      c_.dist.bucket_mb);
    model.SetGradReadyHook([o = overlap_.get()](size_t b, size_t e) { o->Ready(b, e); });
  }
  if (sharded_ep_) {  // this rank's arena <-> the checkpoint format
    size_t full_n = 0;
    const std::vector<ParamInfo> full = Model<float>::FullLayout(c_, &full_n);
    shard_map_ = std::make_unique<ExpertShardMap>(model.param_infos(), model.num_params(), full,
                                                  full_n, muon_);
  }
  // The parameters as checkpoints read and write them: the arena itself on the CPU, a host
  // copy of a device arena (ReadParams / WriteParams around each checkpoint).
  host_params_.resize(host_ ? 0 : model.num_params());
  params_ =
      host_ ? std::span<float>(model.params(), model.num_params()) : std::span<float>(host_params_);
  bias_ = std::span<float>(model.router_bias().data(), model.router_bias().size());
}

// Optimizer buffers in this rank's arena layout (not ZeRO-sharded); with ZeRO-1 gathered
// into storage. Without expert parallelism that is the checkpoint layout.
std::vector<StateBuffer> TrainingRun::CheckpointState(std::vector<std::vector<float>>& storage,
                                                      bool gather) {
  if (!zero_) return optimizer_->state();
  if (gather) {
    storage = sharded_->GatherFullState();
  } else {
    storage.clear();
    for (const auto& [name, size] : sharded_->full_layout()) storage.emplace_back(size);
  }
  std::vector<StateBuffer> out;
  for (size_t i = 0; i < storage.size(); ++i) {
    out.push_back({sharded_->full_layout()[i].first, &storage[i]});
  }
  return out;
}

void TrainingRun::Resume() {
  // Rank 0 reads the checkpoint (falling back past corrupt ones) and broadcasts what it read,
  // so every rank agrees on the state and a checkpoint written at N ranks resumes at M.
  std::string from, read_error;
  CheckpointHeader h;
  std::vector<std::vector<float>> resume_storage;
  resume_state_ = CheckpointState(resume_storage, false);
  // Sharded expert parallelism reads and broadcasts the whole model (the checkpoint format);
  // every rank then takes its block (ckpt.Scatter below).
  WholeModelBuffers ckpt(params_, resume_state_);
  if (leader_ && (options_.resume || !options_.init_from.empty())) {
    ckpt.Allocate(shard_map_.get());
  }
  if (leader_) {
    try {
      if (options_.resume) {
        from = ReadNewestValidCheckpoint(
            ResumeCandidates(k_.ckpt_dir, ResumeIdentityOf(options_, k_.hash), WarnResume), k_.hash,
            ckpt.params, bias_, ckpt.state, &h, WarnResume);
      }
      if (from.empty() && !options_.init_from.empty()) {
        from = options_.init_from;
        h = ReadCheckpoint(from, k_.branch_hash, ckpt.params, bias_, ckpt.state, true);
      }
      if (!from.empty() && h.step > k_.total) {
        throw std::runtime_error(
            fmt::format("{} is at step {}, beyond this run's {} steps", from, h.step, k_.total));
      }
    } catch (const std::exception& e) {
      read_error = e.what();
    }
  }
  if (layout_.world > 1) {
    // One flag first: 0 fresh start, 1 resumed, 2 failed (every rank throws).
    float flag = !read_error.empty() ? 2.0f : from.empty() ? 0.0f : 1.0f;
    comm_->Broadcast(&flag, 1, 0);
    if (flag == 2.0f && !leader_) throw std::runtime_error("rank 0 could not read the checkpoint");
    if (flag == 1.0f) {
      int64_t hdr[2] = {h.step, h.tokens};
      comm_->BroadcastBytes(hdr, sizeof hdr, 0);
      comm_->BroadcastBytes(&h.flops, sizeof h.flops, 0);
      h.step = hdr[0];
      h.tokens = hdr[1];
      ckpt.Allocate(shard_map_.get());
      comm_->Broadcast(ckpt.params.data(), ckpt.params.size(), 0);
      comm_->Broadcast(bias_.data(), bias_.size(), 0);
      for (const StateBuffer& sb : ckpt.state) {
        comm_->Broadcast(sb.data->data(), sb.data->size(), 0);
      }
      if (!leader_) from = "(broadcast from rank 0)";
    }
  }
  if (!read_error.empty()) throw std::runtime_error(read_error);
  if (!from.empty()) ckpt.Scatter(shard_map_.get(), params_, resume_state_);
  ckpt = WholeModelBuffers(params_, resume_state_);
  if (zero_ && !from.empty()) sharded_->LoadFullState(resume_storage);
  resume_storage = {};
  if (!from.empty() && !host_) {
    model_->WriteParams(host_params_.data());
    if (optimizer_) optimizer_->SyncToDevice();  // ZeRO-1's LoadFullState did its own
  }
  if (!from.empty()) {
    step_ = h.step;
    tokens_seen_ = h.tokens;
    flops_ = h.flops;
    result_.checkpoint = from;
  }
}

void TrainingRun::ReportMemory() {
  if (layout_.world <= 1) return;
  // Optimizer-state memory per rank (the ZeRO-1 saving), printed by rank 0.
  std::vector<int64_t> bytes(layout_.world, 0);
  size_t full = 0;
  if (zero_) {
    result_.optimizer_state_bytes = sharded_->local_state_bytes();
    full = sharded_->full_state_bytes();
  } else {
    for (const StateBuffer& sb : optimizer_->state()) full += sb.data->size() * sizeof(float);
    result_.optimizer_state_bytes = full;
  }
  // Parameters + gradients held here (the expert-parallel saving), and the unsharded sizes.
  result_.param_bytes = 2 * model_->num_params() * sizeof(float);
  size_t full_params = result_.param_bytes;
  if (shard_map_) {
    full_params = 2 * shard_map_->full_size("params") * sizeof(float);
    full = 0;
    for (const StateBuffer& sb : resume_state_) full += shard_map_->full_size(sb.name) * 4;
  }
  bytes[layout_.rank] = static_cast<int64_t>(result_.optimizer_state_bytes);
  std::vector<int64_t> param_bytes(layout_.world, 0);
  param_bytes[layout_.rank] = static_cast<int64_t>(result_.param_bytes);
  comm_->AllReduceSum(bytes.data(), bytes.size());
  comm_->AllReduceSum(param_bytes.data(), param_bytes.size());
  if (leader_) {
    fmt::print(stderr, "moelab train: {} ({} communicator)\n", layout_.describe(), comm_->kind());
    fmt::print(stderr,
               "moelab train: parameters + gradients per rank: {:.3f} MiB max, {:.3f} MiB min "
               "({}; unsharded {:.3f} MiB)\n",
               *std::max_element(param_bytes.begin(), param_bytes.end()) / 1048576.0,
               *std::min_element(param_bytes.begin(), param_bytes.end()) / 1048576.0,
               sharded_ep_ ? fmt::format("experts sharded over EP {}", layout_.ep) : "replicated",
               full_params / 1048576.0);
    fmt::print(stderr,
               "moelab train: optimizer state per rank: {:.3f} MiB max, {:.3f} MiB min ({}; "
               "unsharded {:.3f} MiB)\n",
               *std::max_element(bytes.begin(), bytes.end()) / 1048576.0,
               *std::min_element(bytes.begin(), bytes.end()) / 1048576.0,
               zero_         ? fmt::format("ZeRO-1 over {} ranks", layout_.dp)
               : sharded_ep_ ? fmt::format("experts sharded over EP {}", layout_.ep)
                             : "replicated",
               full / 1048576.0);
  }
  comm_->ResetStats();
}

void TrainingRun::PrepareLoop() {
  // Collective with ZeRO-1 (the state is gathered over the DP ranks) and with sharded expert
  // parallelism (the whole model is gathered inside rank 0's EP group); only rank 0 writes.
  in_writer_group_ = sharded_ep_ && layout_.rank < layout_.ep;
  tokens_.resize(static_cast<size_t>(k_.B) * (k_.S + 1));
  // This rank's rows of the global batch: the batch is a pure function of (seed, step), so the
  // trajectory does not depend on how many ranks share it.
  local_tokens_ = tokens_.data() + static_cast<size_t>(comm_->rank()) * local_batch_ * (k_.S + 1);
  // allocated only when the batch splits
  accumulator_ = std::make_unique<GradAccumulator>(*be_, model_->num_params());
  // The Switch aux loss over micro-batches takes the step's statistics (one extra forward).
  if (micro_.count() > 1 && c_.moe.enabled() && c_.moe.balance == "aux_loss") {
    step_aux_ = std::make_unique<StepAuxStats>(layout_.world > 1 ? AllReduceBatchStatsHook(*comm_)
                                                                 : MoeBatchStatsHook{});
  }
  bar_ = std::make_unique<ProgressBar>("train", k_.total, options_.progress && leader_);
  end_ = options_.stop_at_step >= 0 ? std::min(k_.total, options_.stop_at_step) : k_.total;
  t_start_ = Clock::now();
  last_heartbeat_ = t_start_;
  sink_->OnHeartbeat();
  aux_free_ = c_.moe.enabled() && c_.moe.balance == "aux_free";
  // The last losses, for the summary (TrainResult::recent_loss): one batch's loss is noisy.
  recent_window_ = std::clamp<int64_t>((end_ - step_) / 10, 1, 100);
}

bool TrainingRun::ShouldStop() {
  bool stop = options_.stop_flag && options_.stop_flag->load();
  if (layout_.world > 1) {
    // A signal may reach the ranks at different steps: stop together.
    float f = stop ? 1.0f : 0.0f;
    comm_->AllReduceMax(&f, 1);
    stop = f > 0;
  }
  return stop;
}

bool TrainingRun::Step() {
  const auto t0 = Clock::now();
  const CommStats comm_before = comm_->stats();
  const CommStats nccl_before = nccl_ ? nccl_->stats() : CommStats{};
  const CommStats ep_before = ep_grad_ ? ep_grad_->stats() : CommStats{};
  const CommStats dp_before = dp_grad_ ? dp_grad_->stats() : CommStats{};
  data_->TrainBatch(c_.train.seed, step_, 0, k_.B, k_.S, tokens_.data());
  ForwardBackwardMicroBatched(*model_, local_tokens_, k_.S, micro_, &stats_, *accumulator_,
                              step_aux_.get());
  const size_t n = model_->num_params();
  float* grads = model_->grads();
  if (layout_.world > 1) ReduceGradients(grads, n);
  ++step_;
  const double grad_norm = GradNorm(grads, n);
  if (!std::isfinite(stats_.loss) || !std::isfinite(grad_norm)) {
    ReportDivergence(grad_norm);
    return false;
  }
  const double lr = Update(grads, n, grad_norm);

  tokens_seen_ += k_.tokens_per_step;
  flops_ += k_.flops_per_token * static_cast<double>(k_.tokens_per_step);
  const auto t1 = Clock::now();
  const double dt = Seconds(t0, t1);
  step_comm_bytes_ += comm_->stats().bytes - comm_before.bytes;
  step_comm_seconds_ += comm_->stats().seconds - comm_before.seconds;
  if (nccl_) {
    step_comm_bytes_ += nccl_->stats().bytes - nccl_before.bytes;
    step_comm_seconds_ += nccl_->stats().seconds - nccl_before.seconds;
  }
  if (ep_grad_) {
    step_comm_bytes_ += ep_grad_->stats().bytes - ep_before.bytes;
    step_comm_seconds_ += ep_grad_->stats().seconds - ep_before.seconds;
    step_comm_bytes_ += dp_grad_->stats().bytes - dp_before.bytes;
    step_comm_seconds_ += dp_grad_->stats().seconds - dp_before.seconds;
    step_ep_bytes_ += ep_grad_->stats().bytes - ep_before.bytes;
  }
  ++steps_timed_;
  time_in_steps_ += dt;
  StepRecord r;
  r.step = step_;
  r.loss = stats_.loss;
  r.aux_loss = stats_.aux_loss;
  r.lr = lr;
  r.grad_norm = grad_norm;
  r.tokens = tokens_seen_;
  r.flops = flops_;
  r.step_time_s = dt;
  r.tokens_per_s = static_cast<double>(k_.tokens_per_step) / dt;
  r.norm_gain_rms = AttentionNormGainRms(*model_);
  sink_->OnStep(r, stats_);
  result_.last_loss = stats_.loss;
  recent_losses_.push_back(stats_.loss);
  if (static_cast<int64_t>(recent_losses_.size()) > recent_window_) recent_losses_.pop_front();
  AfterStep();
  return true;
}

// The data-parallel (and expert-parallel) reduction of the step's gradients and statistics.
void TrainingRun::ReduceGradients(float* grads, size_t n) {
  if (zero_ && sharded_ep_) {
    // Replicated tensors: summed in the EP group, then the DP reduce-scatter completes the
    // world sum; experts over the DP group only.
    SumNonExpertOverExpertGroup(*ep_grad_, model_->param_infos(), grads, n, c_.dist.bucket_mb);
    sharded_->ReduceScatterGradients(grads, c_.dist.bucket_mb, layout_.world);
  } else if (zero_) {
    sharded_->ReduceScatterGradients(grads, c_.dist.bucket_mb);
  } else if (overlap_) {
    overlap_->Finish();
  } else if (sharded_ep_) {
    ReduceExpertParallelGradients(*grad_comm_, *dp_grad_, *be_, model_->param_infos(), grads, n,
                                  c_.dist.bucket_mb);
  } else {
    AllReduceGradients(*grad_comm_, *be_, grads, n, c_.dist.bucket_mb);
  }
  // S_max with MAX so every rank computes the same QK-Clip γ and clips identically.
  comm_->AllReduceMax(stats_.max_logit.data(), stats_.max_logit.size());
  comm_->AllReduceMax(stats_.max_logit_raw.data(), stats_.max_logit_raw.size());
  comm_->AllReduceSum(stats_.expert_counts.data(), stats_.expert_counts.size());
  double l[3] = {stats_.loss, stats_.aux_loss, stats_.z_loss};
  comm_->AllReduceSum(l, 3);
  stats_.loss = l[0] / layout_.world;
  stats_.aux_loss = l[1] / layout_.world;
  stats_.z_loss = l[2] / layout_.world;
}

double TrainingRun::GradNorm(const float* grads, size_t n) {
  if (sharded_ep_) {
    return ExpertParallelGradNorm(*ep_grad_, zero_ ? dp_grad_ : nullptr, *be_,
                                  model_->param_infos(), grads, n,
                                  zero_ ? sharded_->mine() : ArenaRange{0, n});
  } else if (zero_) {
    return sharded_->GradNorm(grads);
  } else if (layout_.world > 1) {
    double sq = 0;
    for (const ArenaRange& r : norm_ranges_) sq += be_->SumSquares(grads + r.begin, r.size());
    return std::sqrt(sq);
  }
  return be_->L2Norm(grads, n);
}

void TrainingRun::ReportDivergence(double grad_norm) {
  result_.status = RunStatus::kDiverged;
  result_.steps_done = step_;
  result_.error =
      fmt::format("loss became {} at step {} (grad norm {})", stats_.loss, step_, grad_norm);
  StepRecord r;
  r.step = step_;
  r.loss = stats_.loss;
  r.grad_norm = grad_norm;
  sink_->OnStep(r, stats_);
  bar_->Finish("diverged", step_);
  sink_->OnEnd(result_.status, result_.error);
}

// Clip, optimizer step, QK-Clip, router bias; returns the step's learning rate.
double TrainingRun::Update(float* grads, size_t n, double grad_norm) {
  if (c_.optimizer.grad_clip > 0 && grad_norm > c_.optimizer.grad_clip) {
    const float s = static_cast<float>(c_.optimizer.grad_clip / grad_norm);
    if (zero_) {
      be_->Scale(grads + sharded_->mine().begin, sharded_->mine().size(), s);
    } else {
      be_->Scale(grads, n, s);
    }
  }
  const double lr = ScheduledLr(c_.schedule, c_.optimizer.lr, step_, k_.total);
  if (zero_) {
    sharded_->Step(model_->params(), grads, lr, step_, c_.dist.bucket_mb);
  } else {
    optimizer_->Step(model_->params(), grads, lr, step_);
  }
  if (c_.optimizer.qk_clip_tau > 0) {
    // After the update, from this step's forward statistics (the step itself is unchanged).
    const QkClipPlan clip = PlanQkClip(c_, model_->param_infos(), stats_.max_logit_raw, step_);
    be_->ScaleRows(clip.scales, model_->params());
    if (!clip.events.empty()) sink_->OnClip(clip.events);
  }
  model_->ParamsChanged();
  if (aux_free_) model_->UpdateRouterBias(stats_.expert_counts, c_.moe.bias_update_rate);
  return lr;
}

// Evaluation, checkpoints, heartbeat and progress after a step.
void TrainingRun::AfterStep() {
  if ((c_.eval.every > 0 && step_ % c_.eval.every == 0) || step_ == k_.total) {
    result_.last_val_loss = Evaluate();
    sink_->OnEval(step_, tokens_seen_, flops_, result_.last_val_loss);
  }
  if ((c_.checkpoint.every > 0 && step_ % c_.checkpoint.every == 0) || step_ == k_.total) {
    Checkpoint(step_);
  }
  if (IsBranchStep(step_)) {
    WriteCheckpointTo(BranchCheckpointDir(k_.ckpt_dir), step_, std::numeric_limits<int>::max());
  }
  if (Seconds(last_heartbeat_, Clock::now()) >= 1.0) {
    sink_->OnHeartbeat();
    last_heartbeat_ = Clock::now();
  }
  result_.tokens_per_s = steps_timed_ * static_cast<double>(k_.tokens_per_step) / time_in_steps_;
  bar_->Update(step_, fmt::format("loss {:.4f}{} | {} tok/s", stats_.loss,
                                  std::isnan(result_.last_val_loss)
                                      ? ""
                                      : fmt::format(" val {:.4f}", result_.last_val_loss),
                                  ProgressBar::FormatCount(result_.tokens_per_s)));
}

// Mean validation loss over eval.batches batches of the global batch size; with several
// data-parallel ranks each evaluates its slice of every batch and the means are averaged.
double TrainingRun::Evaluate() {
  double sum = 0;
  StepStats stats;
  const size_t row = static_cast<size_t>(c_.model.seq_len) + 1;
  for (int b = 0; b < c_.eval.batches; ++b) {
    data_->ValBatch(b, c_.train.batch_size, c_.model.seq_len, tokens_.data());
    ForwardMicroBatched(
        *model_, tokens_.data() + static_cast<size_t>(layout_.rank) * layout_.local_batch * row,
        c_.model.seq_len, PlanMicroBatches(c_, layout_.local_batch), &stats);
    sum += stats.loss;
  }
  if (layout_.world > 1) comm_->AllReduceSum(&sum, 1);
  return sum / (static_cast<double>(c_.eval.batches) * layout_.world);
}

// Collective with ZeRO-1 and sharded expert parallelism (see in_writer_group_); returns the
// path rank 0 wrote ("" elsewhere).
std::string TrainingRun::WriteCheckpointTo(const std::string& dir, int64_t at, int keep) {
  if (!leader_ && !zero_ && !in_writer_group_) return "";
  if (!host_) {
    model_->ReadParams(host_params_.data());
    if (optimizer_) optimizer_->SyncToHost();  // ZeRO-1's GatherFullState does its own
  }
  std::vector<std::vector<float>> storage;
  std::vector<StateBuffer> state = CheckpointState(storage, true);
  std::span<const float> out_params = params_;
  std::vector<float> full_params;
  std::vector<std::vector<float>> full_state;
  if (sharded_ep_) {
    if (!in_writer_group_) return "";
    full_params.resize(shard_map_->full_size("params"));
    shard_map_->Gather(*ep_comm_, "params", params_.data(), full_params.data());
    out_params = full_params;
    full_state.reserve(state.size());
    for (StateBuffer& sb : state) {
      full_state.emplace_back(shard_map_->full_size(sb.name));
      shard_map_->Gather(*ep_comm_, sb.name, sb.data->data(), full_state.back().data());
      sb.data = &full_state.back();
    }
  }
  if (!leader_) return "";
  CheckpointHeader h{k_.hash, k_.branch_hash, at, tokens_seen_, flops_, options_.run_uuid};
  return WriteCheckpoint(dir, h, out_params, bias_, state, keep);
}

void TrainingRun::Checkpoint(int64_t at) {
  const std::string path = WriteCheckpointTo(k_.ckpt_dir, at, c_.checkpoint.keep);
  if (!leader_) return;
  result_.checkpoint = path;
  sink_->OnCheckpoint(at, result_.checkpoint);
}

bool TrainingRun::IsBranchStep(int64_t at) const {
  return std::find(options_.branch_steps.begin(), options_.branch_steps.end(), at) !=
         options_.branch_steps.end();
}

void TrainingRun::Finish() {
  result_.steps_done = step_;
  result_.train_seconds = time_in_steps_;
  if (!recent_losses_.empty()) {
    double sum = 0;
    for (const double l : recent_losses_) sum += l;
    result_.recent_loss = sum / static_cast<double>(recent_losses_.size());
    result_.recent_loss_steps = static_cast<int64_t>(recent_losses_.size());
  }
  if (layout_.world > 1 && steps_timed_ > 0) {
    result_.comm_bytes_per_step = static_cast<double>(step_comm_bytes_) / steps_timed_;
    result_.comm_time_share = time_in_steps_ > 0 ? step_comm_seconds_ / time_in_steps_ : 0;
    if (leader_) {
      fmt::print(stderr,
                 "moelab train: communication: {:.3f} MiB sent per step by rank 0, {:.1f}% of "
                 "step time in collectives\n",
                 result_.comm_bytes_per_step / 1048576.0, 100 * result_.comm_time_share);
      if (ep_comm_) {
        fmt::print(stderr,
                   "moelab train: expert parallel: {:.3f} MiB per step inside the EP group "
                   "(token all-to-all)\n",
                   static_cast<double>(step_ep_bytes_) / steps_timed_ / 1048576.0);
      }
    }
  }
  if (step_ < k_.total) {
    // Stopped early (signal or stop_at_step): leave a checkpoint so the run can resume.
    // Rank 0 decides (it alone sees the folder); with ZeRO-1 every rank joins the gather.
    float need = leader_ && CheckpointStepOf(result_.checkpoint) != step_ ? 1.0f : 0.0f;
    if (layout_.world > 1) comm_->Broadcast(&need, 1, 0);
    if (need > 0) Checkpoint(step_);
    result_.status = RunStatus::kStopped;
    bar_->Finish(fmt::format("stopped at step {}", step_), step_);
  } else {
    result_.status = RunStatus::kDone;
    bar_->Finish(fmt::format("loss {:.4f} val {:.4f} | {} tok/s", result_.last_loss,
                             result_.last_val_loss,
                             ProgressBar::FormatCount(result_.tokens_per_s)));
  }
  sink_->OnEnd(result_.status, "");
}

}  // namespace moelab
