#include "core/train/trainer.h"

#include <cblas.h>
#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <deque>
#include <limits>
#include <vector>

#include "core/data/data.h"
#include "core/device.h"
#include "core/dist/batch_stats.h"
#include "core/dist/expert_parallel.h"
#include "core/dist/expert_shard.h"
#include "core/dist/grad_overlap.h"
#include "core/dist/layout.h"
#include "core/dist/nccl_communicator.h"
#include "core/dist/zero.h"
#include "core/flops.h"
#include "core/model/backend.h"
#include "core/model/cuda_backend.h"
#include "core/model/model.h"
#include "core/model/moe.h"
#include "core/model/norm_gain_rms.h"
#include "core/optim/optimizer.h"
#include "core/optim/qk_clip_plan.h"
#include "core/train/checkpoint.h"
#include "core/train/micro_batch.h"
#include "core/train/progress.h"

namespace moelab {

namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// Mean validation loss over eval.batches batches of the global batch size; with several
// data-parallel ranks each evaluates its slice of every batch and the means are averaged.
double Evaluate(Model<float>& model, TokenSource& data, const RunConfig& c,
                std::vector<int32_t>& tokens, Communicator& comm, const DistLayout& layout) {
  double sum = 0;
  StepStats stats;
  const size_t row = static_cast<size_t>(c.model.seq_len) + 1;
  for (int b = 0; b < c.eval.batches; ++b) {
    data.ValBatch(b, c.train.batch_size, c.model.seq_len, tokens.data());
    ForwardMicroBatched(model,
                        tokens.data() + static_cast<size_t>(layout.rank) * layout.local_batch * row,
                        c.model.seq_len, PlanMicroBatches(c, layout.local_batch), &stats);
    sum += stats.loss;
  }
  if (layout.world > 1) comm.AllReduceSum(&sum, 1);
  return sum / (static_cast<double>(c.eval.batches) * layout.world);
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

std::string DefaultCheckpointDir(const RunConfig& config, const std::string& run_uuid) {
  const std::string base = config.checkpoint.dir + "/" + ConfigHash(config).substr(0, 16);
  return run_uuid.empty() ? base : base + "/" + run_uuid;
}

ResumeIdentity ResumeIdentityOf(const TrainOptions& options, const std::string& config_hash) {
  return {options.run_uuid, config_hash, options.legacy_checkpoint, options.max_resume_step};
}

void WarnResume(const std::string& w) { fmt::print(stderr, "moelab train: warning: {}\n", w); }

std::string BranchCheckpointDir(const std::string& checkpoint_dir) {
  return checkpoint_dir + "/branches";
}

TrainResult Train(const RunConfig& c, MetricsSink* sink, const TrainOptions& options) {
  TrainResult result;
  result.last_val_loss = std::numeric_limits<double>::quiet_NaN();
  SingleProcessCommunicator single;
  Communicator* comm = options.comm ? options.comm : &single;
  // Only rank 0 records (one run row per distributed run) and writes checkpoints.
  NullSink null_sink;
  const bool leader = comm->rank() == 0;
  if (!leader) sink = &null_sink;
  const std::string ckpt_dir = options.checkpoint_dir.empty()
                                   ? DefaultCheckpointDir(c, options.run_uuid)
                                   : options.checkpoint_dir;
  const std::string hash = ConfigHash(c);
  const std::string branch_hash = BranchHash(c);
  const int64_t total = c.total_steps();
  const int B = c.train.batch_size, S = c.model.seq_len;  // B: the global batch
  const int64_t tokens_per_step = TokensPerStep(c);
  const double flops_per_token = ForwardFlopsPerToken(c).training();

  omp_set_num_threads(c.train.threads);
  openblas_set_num_threads(c.train.threads);

  try {
    const bool on_cuda = c.train.device == "cuda";
    if (on_cuda) {
      try {
        RequireDevice(c.train);
      } catch (const DeviceError& e) {
        throw DeviceError(std::string("train.device: ") + e.what());
      }
    }
    const DistLayout layout = MakeDistLayout(c, comm->world_size(), comm->rank());
    const int local_batch = layout.local_batch;
    // Gradient accumulation over train.micro_batch sequences (one buffer, only when it splits).
    const MicroBatchPlan micro = PlanMicroBatches(c, local_batch);
    // Several ranks on GPUs reduce their device gradients through NCCL, bootstrapped over the
    // job's MPI world; host-side collectives (statistics, checkpoints, stop) stay on `comm`.
    std::unique_ptr<NcclCommunicator> nccl;
    Communicator* grad_comm = comm;
    if (on_cuda) {
      RequireCudaSupports(c, layout.world, layout.ep);
    }
    if (on_cuda && layout.world > 1) {
      if (comm->kind() != "nccl") {
        nccl = NcclCommunicator::Create();
        grad_comm = nccl.get();
      }
    }
    // Expert parallelism: consecutive groups of EP ranks split each MoE layer's experts; tokens
    // travel to their expert's owner by all-to-all inside the group (core/model/moe.h). A rank
    // holds only its experts (parameters, gradients, optimizer state: the model is built with
    // its ExpertShard); their gradients are summed over the DP group of same-expert owners only
    // (core/dist/expert_parallel.h); checkpoints gather the whole model inside the EP group of
    // rank 0 and keep the unsharded format (core/dist/expert_shard.h).
    // ep_comm / dp_comm are host-side (checkpoint gathers); the tokens and gradients travel over
    // ep_grad / dp_grad: the same groups split from grad_comm (NCCL on GPUs, where they live).
    const bool sharded_ep = layout.ep > 1;
    std::unique_ptr<Communicator> ep_comm, dp_comm, ep_nccl, dp_nccl;
    Communicator *ep_grad = nullptr, *dp_grad = nullptr;
    if (sharded_ep) {
      ep_comm = comm->Split(layout.rank / layout.ep, layout.rank % layout.ep);
      dp_comm = comm->Split(layout.rank % layout.ep, layout.rank / layout.ep);
      ep_grad = ep_comm.get();
      dp_grad = dp_comm.get();
      if (grad_comm != comm) {
        ep_nccl = grad_comm->Split(layout.rank / layout.ep, layout.rank % layout.ep);
        dp_nccl = grad_comm->Split(layout.rank % layout.ep, layout.rank / layout.ep);
        ep_grad = ep_nccl.get();
        dp_grad = dp_nccl.get();
      }
    }
    struct ExpertParallelScope {
      explicit ExpertParallelScope(Communicator* ep) { SetMoeExpertParallel(ep); }
      ~ExpertParallelScope() { SetMoeExpertParallel(nullptr); }
    } ep_scope(ep_grad);
    std::unique_ptr<TokenSource> data = OpenTokenSource(c.data, c.model.vocab_size);
    if (on_cuda) RequireCudaMemory(c, local_batch, false);  // the CLI printed the plan
    const int held = c.moe.experts_total / layout.ep;
    Model<float> model(
        c, sharded_ep ? ExpertShard{(layout.rank % layout.ep) * held, held} : ExpertShard{});
    model.Init(c.train.seed);
    Backend<float>& be = model.backend();
    const bool host = be.is_host();
    // Global-batch balancing: every rank holds other rows of the global batch, so the Switch aux
    // loss takes its f_i and P_i from the statistics summed over all ranks (the objective of one
    // process; core/dist/batch_stats.h). The aux-loss-free bias already uses the summed counts.
    if (layout.world > 1 && c.moe.enabled() && c.moe.balance == "aux_loss") {
      model.SetMoeBatchStatsHook(AllReduceBatchStatsHook(*comm));
    }
    // ZeRO-1 (with distributed Muon): a sharded optimizer; otherwise every rank steps all.
    const bool zero = c.dist.zero1 && layout.world > 1;
    const bool muon = c.optimizer.name == "muon" || c.optimizer.name == "muonclip";
    std::unique_ptr<Optimizer> optimizer;
    std::unique_ptr<ShardedOptimizer> sharded;
    if (zero) {  // over the ranks holding the same parameters
      sharded = std::make_unique<ShardedOptimizer>(c, model.param_infos(), model.num_params(),
                                                   sharded_ep ? *dp_grad : *grad_comm, be);
    } else {
      optimizer = MakeOptimizer(c, model.param_infos());
      optimizer->WriteWeightCopy(be.weight_copy());  // CUDA bf16: written in the update pass
    }
    // The grad norm is summed over the same ranges with and without ZeRO-1 (identical bits).
    const std::vector<ArenaRange> norm_ranges =
        layout.world > 1
            ? PartitionArena(model.param_infos(), model.num_params(), layout.world, muon)
            : std::vector<ArenaRange>{};
    // Plain data parallelism reduces each gradient bucket as soon as the backward has finished
    // it (core/dist/grad_overlap.h), with the bits of the reduction after the backward. Not with
    // micro-batches: their gradients are final only after the accumulator's last pass.
    std::unique_ptr<OverlappedGradReduce> overlap;
    if (layout.world > 1 && !zero && !sharded_ep && c.dist.overlap && host && micro.count() == 1) {
      overlap = std::make_unique<OverlappedGradReduce>(*comm, model.grads(), model.num_params(),
                                                       c.dist.bucket_mb);
      model.SetGradReadyHook([o = overlap.get()](size_t b, size_t e) { o->Ready(b, e); });
    }
    std::unique_ptr<ExpertShardMap> shard_map;  // this rank's arena <-> the checkpoint format
    if (sharded_ep) {
      size_t full_n = 0;
      const std::vector<ParamInfo> full = Model<float>::FullLayout(c, &full_n);
      shard_map = std::make_unique<ExpertShardMap>(model.param_infos(), model.num_params(), full,
                                                   full_n, muon);
    }
    // Optimizer buffers in this rank's arena layout (not ZeRO-sharded); with ZeRO-1 gathered
    // into storage. Without expert parallelism that is the checkpoint layout.
    auto checkpoint_state = [&](std::vector<std::vector<float>>& storage, bool gather) {
      if (!zero) return optimizer->state();
      if (gather) {
        storage = sharded->GatherFullState();
      } else {
        storage.clear();
        for (const auto& [name, size] : sharded->full_layout()) storage.emplace_back(size);
      }
      std::vector<StateBuffer> out;
      for (size_t i = 0; i < storage.size(); ++i) {
        out.push_back({sharded->full_layout()[i].first, &storage[i]});
      }
      return out;
    };
    // The parameters as checkpoints read and write them: the arena itself on the CPU, a host
    // copy of a device arena (ReadParams / WriteParams around each checkpoint).
    std::vector<float> host_params(host ? 0 : model.num_params());
    std::span<float> params =
        host ? std::span<float>(model.params(), model.num_params()) : std::span<float>(host_params);
    std::span<float> bias(model.router_bias().data(), model.router_bias().size());

    int64_t step = 0, tokens_seen = 0;
    double flops = 0;
    // Rank 0 reads the checkpoint (falling back past corrupt ones) and broadcasts what it read,
    // so every rank agrees on the state and a checkpoint written at N ranks resumes at M.
    std::string from, read_error;
    CheckpointHeader h;
    std::vector<std::vector<float>> resume_storage;
    const std::vector<StateBuffer> resume_state = checkpoint_state(resume_storage, false);
    // Sharded expert parallelism reads and broadcasts the whole model (the checkpoint format);
    // every rank then takes its block (ckpt.Scatter below).
    WholeModelBuffers ckpt(params, resume_state);
    if (leader && (options.resume || !options.init_from.empty())) ckpt.Allocate(shard_map.get());
    if (leader) {
      try {
        if (options.resume) {
          from = ReadNewestValidCheckpoint(
              ResumeCandidates(ckpt_dir, ResumeIdentityOf(options, hash), WarnResume), hash,
              ckpt.params, bias, ckpt.state, &h, WarnResume);
        }
        if (from.empty() && !options.init_from.empty()) {
          from = options.init_from;
          h = ReadCheckpoint(from, branch_hash, ckpt.params, bias, ckpt.state, true);
        }
        if (!from.empty() && h.step > total) {
          throw std::runtime_error(
              fmt::format("{} is at step {}, beyond this run's {} steps", from, h.step, total));
        }
      } catch (const std::exception& e) {
        read_error = e.what();
      }
    }
    if (layout.world > 1) {
      // One flag first: 0 fresh start, 1 resumed, 2 failed (every rank throws).
      float flag = !read_error.empty() ? 2.0f : from.empty() ? 0.0f : 1.0f;
      comm->Broadcast(&flag, 1, 0);
      if (flag == 2.0f && !leader) throw std::runtime_error("rank 0 could not read the checkpoint");
      if (flag == 1.0f) {
        int64_t hdr[2] = {h.step, h.tokens};
        comm->BroadcastBytes(hdr, sizeof hdr, 0);
        comm->BroadcastBytes(&h.flops, sizeof h.flops, 0);
        h.step = hdr[0];
        h.tokens = hdr[1];
        ckpt.Allocate(shard_map.get());
        comm->Broadcast(ckpt.params.data(), ckpt.params.size(), 0);
        comm->Broadcast(bias.data(), bias.size(), 0);
        for (const StateBuffer& sb : ckpt.state) {
          comm->Broadcast(sb.data->data(), sb.data->size(), 0);
        }
        if (!leader) from = "(broadcast from rank 0)";
      }
    }
    if (!read_error.empty()) throw std::runtime_error(read_error);
    if (!from.empty()) ckpt.Scatter(shard_map.get(), params, resume_state);
    ckpt = WholeModelBuffers(params, resume_state);
    if (zero && !from.empty()) sharded->LoadFullState(resume_storage);
    resume_storage = {};
    if (!from.empty() && !host) {
      model.WriteParams(host_params.data());
      if (optimizer) optimizer->SyncToDevice();  // ZeRO-1's LoadFullState did its own
    }
    if (!from.empty()) {
      step = h.step;
      tokens_seen = h.tokens;
      flops = h.flops;
      result.checkpoint = from;
    }
    if (layout.world > 1) {
      // Optimizer-state memory per rank (the ZeRO-1 saving), printed by rank 0.
      std::vector<int64_t> bytes(layout.world, 0);
      size_t full = 0;
      if (zero) {
        result.optimizer_state_bytes = sharded->local_state_bytes();
        full = sharded->full_state_bytes();
      } else {
        for (const StateBuffer& sb : optimizer->state()) full += sb.data->size() * sizeof(float);
        result.optimizer_state_bytes = full;
      }
      // Parameters + gradients held here (the expert-parallel saving), and the unsharded sizes.
      result.param_bytes = 2 * model.num_params() * sizeof(float);
      size_t full_params = result.param_bytes;
      if (shard_map) {
        full_params = 2 * shard_map->full_size("params") * sizeof(float);
        full = 0;
        for (const StateBuffer& sb : resume_state) full += shard_map->full_size(sb.name) * 4;
      }
      bytes[layout.rank] = static_cast<int64_t>(result.optimizer_state_bytes);
      std::vector<int64_t> param_bytes(layout.world, 0);
      param_bytes[layout.rank] = static_cast<int64_t>(result.param_bytes);
      comm->AllReduceSum(bytes.data(), bytes.size());
      comm->AllReduceSum(param_bytes.data(), param_bytes.size());
      if (leader) {
        fmt::print(stderr, "moelab train: {} ({} communicator)\n", layout.describe(), comm->kind());
        fmt::print(stderr,
                   "moelab train: parameters + gradients per rank: {:.3f} MiB max, {:.3f} MiB min "
                   "({}; unsharded {:.3f} MiB)\n",
                   *std::max_element(param_bytes.begin(), param_bytes.end()) / 1048576.0,
                   *std::min_element(param_bytes.begin(), param_bytes.end()) / 1048576.0,
                   sharded_ep ? fmt::format("experts sharded over EP {}", layout.ep) : "replicated",
                   full_params / 1048576.0);
        fmt::print(stderr,
                   "moelab train: optimizer state per rank: {:.3f} MiB max, {:.3f} MiB min ({}; "
                   "unsharded {:.3f} MiB)\n",
                   *std::max_element(bytes.begin(), bytes.end()) / 1048576.0,
                   *std::min_element(bytes.begin(), bytes.end()) / 1048576.0,
                   zero         ? fmt::format("ZeRO-1 over {} ranks", layout.dp)
                   : sharded_ep ? fmt::format("experts sharded over EP {}", layout.ep)
                                : "replicated",
                   full / 1048576.0);
      }
      comm->ResetStats();
    }
    result.start_step = step;
    if (options.on_start) options.on_start(step, from);

    // Collective with ZeRO-1 (the state is gathered over the DP ranks) and with sharded expert
    // parallelism (the whole model is gathered inside rank 0's EP group); only rank 0 writes.
    const bool in_writer_group = sharded_ep && layout.rank < layout.ep;
    auto write_checkpoint = [&](const std::string& dir, int64_t at, int keep) -> std::string {
      if (!leader && !zero && !in_writer_group) return "";
      if (!host) {
        model.ReadParams(host_params.data());
        if (optimizer) optimizer->SyncToHost();  // ZeRO-1's GatherFullState does its own
      }
      std::vector<std::vector<float>> storage;
      std::vector<StateBuffer> state = checkpoint_state(storage, true);
      std::span<const float> out_params = params;
      std::vector<float> full_params;
      std::vector<std::vector<float>> full_state;
      if (sharded_ep) {
        if (!in_writer_group) return "";
        full_params.resize(shard_map->full_size("params"));
        shard_map->Gather(*ep_comm, "params", params.data(), full_params.data());
        out_params = full_params;
        full_state.reserve(state.size());
        for (StateBuffer& sb : state) {
          full_state.emplace_back(shard_map->full_size(sb.name));
          shard_map->Gather(*ep_comm, sb.name, sb.data->data(), full_state.back().data());
          sb.data = &full_state.back();
        }
      }
      if (!leader) return "";
      CheckpointHeader h{hash, branch_hash, at, tokens_seen, flops, options.run_uuid};
      return WriteCheckpoint(dir, h, out_params, bias, state, keep);
    };
    auto checkpoint = [&](int64_t at) {
      const std::string path = write_checkpoint(ckpt_dir, at, c.checkpoint.keep);
      if (!leader) return;
      result.checkpoint = path;
      sink->OnCheckpoint(at, result.checkpoint);
    };
    auto is_branch_step = [&](int64_t at) {
      return std::find(options.branch_steps.begin(), options.branch_steps.end(), at) !=
             options.branch_steps.end();
    };

    std::vector<int32_t> tokens(static_cast<size_t>(B) * (S + 1));
    // This rank's rows of the global batch: the batch is a pure function of (seed, step), so the
    // trajectory does not depend on how many ranks share it.
    const int32_t* local_tokens =
        tokens.data() + static_cast<size_t>(comm->rank()) * local_batch * (S + 1);
    StepStats stats;
    GradAccumulator accumulator(be, model.num_params());  // allocated only when the batch splits
    // The Switch aux loss over micro-batches takes the step's statistics (one extra forward).
    std::unique_ptr<StepAuxStats> step_aux;
    if (micro.count() > 1 && c.moe.enabled() && c.moe.balance == "aux_loss") {
      step_aux = std::make_unique<StepAuxStats>(layout.world > 1 ? AllReduceBatchStatsHook(*comm)
                                                                 : MoeBatchStatsHook{});
    }
    ProgressBar bar("train", total, options.progress && leader);
    const int64_t end = options.stop_at_step >= 0 ? std::min(total, options.stop_at_step) : total;
    const auto t_start = Clock::now();
    auto last_heartbeat = t_start;
    sink->OnHeartbeat();
    const bool aux_free = c.moe.enabled() && c.moe.balance == "aux_free";
    int64_t steps_timed = 0;
    double time_in_steps = 0;
    int64_t step_comm_bytes = 0;  // collectives inside the timed steps (not eval, checkpoints)
    double step_comm_seconds = 0;
    int64_t step_ep_bytes = 0;  // of which inside the EP group (token all-to-all, expert gather)
    // The last losses, for the summary (TrainResult::recent_loss): one batch's loss is noisy.
    const int64_t recent_window = std::clamp<int64_t>((end - step) / 10, 1, 100);
    std::deque<double> recent_losses;

    while (step < end) {
      bool stop = options.stop_flag && options.stop_flag->load();
      if (layout.world > 1) {
        // A signal may reach the ranks at different steps: stop together.
        float f = stop ? 1.0f : 0.0f;
        comm->AllReduceMax(&f, 1);
        stop = f > 0;
      }
      if (stop) break;
      const auto t0 = Clock::now();
      const CommStats comm_before = comm->stats();
      const CommStats nccl_before = nccl ? nccl->stats() : CommStats{};
      const CommStats ep_before = ep_grad ? ep_grad->stats() : CommStats{};
      const CommStats dp_before = dp_grad ? dp_grad->stats() : CommStats{};
      data->TrainBatch(c.train.seed, step, 0, B, S, tokens.data());
      ForwardBackwardMicroBatched(model, local_tokens, S, micro, &stats, accumulator,
                                  step_aux.get());
      const size_t n = model.num_params();
      float* grads = model.grads();
      if (layout.world > 1) {
        if (zero && sharded_ep) {
          // Replicated tensors: summed in the EP group, then the DP reduce-scatter completes the
          // world sum; experts over the DP group only.
          SumNonExpertOverExpertGroup(*ep_grad, model.param_infos(), grads, n, c.dist.bucket_mb);
          sharded->ReduceScatterGradients(grads, c.dist.bucket_mb, layout.world);
        } else if (zero) {
          sharded->ReduceScatterGradients(grads, c.dist.bucket_mb);
        } else if (overlap) {
          overlap->Finish();
        } else if (sharded_ep) {
          ReduceExpertParallelGradients(*grad_comm, *dp_grad, be, model.param_infos(), grads, n,
                                        c.dist.bucket_mb);
        } else {
          AllReduceGradients(*grad_comm, be, grads, n, c.dist.bucket_mb);
        }
        // S_max with MAX so every rank computes the same QK-Clip γ and clips identically.
        comm->AllReduceMax(stats.max_logit.data(), stats.max_logit.size());
        comm->AllReduceMax(stats.max_logit_raw.data(), stats.max_logit_raw.size());
        comm->AllReduceSum(stats.expert_counts.data(), stats.expert_counts.size());
        double l[3] = {stats.loss, stats.aux_loss, stats.z_loss};
        comm->AllReduceSum(l, 3);
        stats.loss = l[0] / layout.world;
        stats.aux_loss = l[1] / layout.world;
        stats.z_loss = l[2] / layout.world;
      }
      ++step;
      double grad_norm = 0;
      if (sharded_ep) {
        grad_norm =
            ExpertParallelGradNorm(*ep_grad, zero ? dp_grad : nullptr, be, model.param_infos(),
                                   grads, n, zero ? sharded->mine() : ArenaRange{0, n});
      } else if (zero) {
        grad_norm = sharded->GradNorm(grads);
      } else if (layout.world > 1) {
        double sq = 0;
        for (const ArenaRange& r : norm_ranges) sq += be.SumSquares(grads + r.begin, r.size());
        grad_norm = std::sqrt(sq);
      } else {
        grad_norm = be.L2Norm(grads, n);
      }
      if (!std::isfinite(stats.loss) || !std::isfinite(grad_norm)) {
        result.status = RunStatus::kDiverged;
        result.steps_done = step;
        result.error =
            fmt::format("loss became {} at step {} (grad norm {})", stats.loss, step, grad_norm);
        StepRecord r;
        r.step = step;
        r.loss = stats.loss;
        r.grad_norm = grad_norm;
        sink->OnStep(r, stats);
        bar.Finish("diverged", step);
        sink->OnEnd(result.status, result.error);
        return result;
      }
      if (c.optimizer.grad_clip > 0 && grad_norm > c.optimizer.grad_clip) {
        const float s = static_cast<float>(c.optimizer.grad_clip / grad_norm);
        if (zero) {
          be.Scale(grads + sharded->mine().begin, sharded->mine().size(), s);
        } else {
          be.Scale(grads, n, s);
        }
      }
      const double lr = ScheduledLr(c.schedule, c.optimizer.lr, step, total);
      if (zero) {
        sharded->Step(model.params(), grads, lr, step, c.dist.bucket_mb);
      } else {
        optimizer->Step(model.params(), grads, lr, step);
      }
      if (c.optimizer.qk_clip_tau > 0) {
        // After the update, from this step's forward statistics (the step itself is unchanged).
        const QkClipPlan clip = PlanQkClip(c, model.param_infos(), stats.max_logit_raw, step);
        be.ScaleRows(clip.scales, model.params());
        if (!clip.events.empty()) sink->OnClip(clip.events);
      }
      model.ParamsChanged();
      if (aux_free) model.UpdateRouterBias(stats.expert_counts, c.moe.bias_update_rate);

      tokens_seen += tokens_per_step;
      flops += flops_per_token * static_cast<double>(tokens_per_step);
      const auto t1 = Clock::now();
      const double dt = Seconds(t0, t1);
      step_comm_bytes += comm->stats().bytes - comm_before.bytes;
      step_comm_seconds += comm->stats().seconds - comm_before.seconds;
      if (nccl) {
        step_comm_bytes += nccl->stats().bytes - nccl_before.bytes;
        step_comm_seconds += nccl->stats().seconds - nccl_before.seconds;
      }
      if (ep_grad) {
        step_comm_bytes += ep_grad->stats().bytes - ep_before.bytes;
        step_comm_seconds += ep_grad->stats().seconds - ep_before.seconds;
        step_comm_bytes += dp_grad->stats().bytes - dp_before.bytes;
        step_comm_seconds += dp_grad->stats().seconds - dp_before.seconds;
        step_ep_bytes += ep_grad->stats().bytes - ep_before.bytes;
      }
      ++steps_timed;
      time_in_steps += dt;
      StepRecord r;
      r.step = step;
      r.loss = stats.loss;
      r.aux_loss = stats.aux_loss;
      r.lr = lr;
      r.grad_norm = grad_norm;
      r.tokens = tokens_seen;
      r.flops = flops;
      r.step_time_s = dt;
      r.tokens_per_s = static_cast<double>(tokens_per_step) / dt;
      r.norm_gain_rms = AttentionNormGainRms(model);
      sink->OnStep(r, stats);
      result.last_loss = stats.loss;
      recent_losses.push_back(stats.loss);
      if (static_cast<int64_t>(recent_losses.size()) > recent_window) recent_losses.pop_front();

      if ((c.eval.every > 0 && step % c.eval.every == 0) || step == total) {
        result.last_val_loss = Evaluate(model, *data, c, tokens, *comm, layout);
        sink->OnEval(step, tokens_seen, flops, result.last_val_loss);
      }
      if ((c.checkpoint.every > 0 && step % c.checkpoint.every == 0) || step == total) {
        checkpoint(step);
      }
      if (is_branch_step(step)) {
        write_checkpoint(BranchCheckpointDir(ckpt_dir), step, std::numeric_limits<int>::max());
      }
      if (Seconds(last_heartbeat, Clock::now()) >= 1.0) {
        sink->OnHeartbeat();
        last_heartbeat = Clock::now();
      }
      result.tokens_per_s = steps_timed * static_cast<double>(tokens_per_step) / time_in_steps;
      bar.Update(step, fmt::format("loss {:.4f}{} | {} tok/s", stats.loss,
                                   std::isnan(result.last_val_loss)
                                       ? ""
                                       : fmt::format(" val {:.4f}", result.last_val_loss),
                                   ProgressBar::FormatCount(result.tokens_per_s)));
    }
    result.steps_done = step;
    result.train_seconds = time_in_steps;
    if (!recent_losses.empty()) {
      double sum = 0;
      for (const double l : recent_losses) sum += l;
      result.recent_loss = sum / static_cast<double>(recent_losses.size());
      result.recent_loss_steps = static_cast<int64_t>(recent_losses.size());
    }
    if (layout.world > 1 && steps_timed > 0) {
      result.comm_bytes_per_step = static_cast<double>(step_comm_bytes) / steps_timed;
      result.comm_time_share = time_in_steps > 0 ? step_comm_seconds / time_in_steps : 0;
      if (leader) {
        fmt::print(stderr,
                   "moelab train: communication: {:.3f} MiB sent per step by rank 0, {:.1f}% of "
                   "step time in collectives\n",
                   result.comm_bytes_per_step / 1048576.0, 100 * result.comm_time_share);
        if (ep_comm) {
          fmt::print(stderr,
                     "moelab train: expert parallel: {:.3f} MiB per step inside the EP group "
                     "(token all-to-all)\n",
                     static_cast<double>(step_ep_bytes) / steps_timed / 1048576.0);
        }
      }
    }
    if (step < total) {
      // Stopped early (signal or stop_at_step): leave a checkpoint so the run can resume.
      // Rank 0 decides (it alone sees the folder); with ZeRO-1 every rank joins the gather.
      float need = leader && CheckpointStepOf(result.checkpoint) != step ? 1.0f : 0.0f;
      if (layout.world > 1) comm->Broadcast(&need, 1, 0);
      if (need > 0) checkpoint(step);
      result.status = RunStatus::kStopped;
      bar.Finish(fmt::format("stopped at step {}", step), step);
    } else {
      result.status = RunStatus::kDone;
      bar.Finish(fmt::format("loss {:.4f} val {:.4f} | {} tok/s", result.last_loss,
                             result.last_val_loss, ProgressBar::FormatCount(result.tokens_per_s)));
    }
    sink->OnEnd(result.status, "");
  } catch (const std::exception& e) {
    result.status = RunStatus::kFailed;
    result.error = e.what();
    sink->OnEnd(result.status, result.error);
  }
  return result;
}

}  // namespace moelab
