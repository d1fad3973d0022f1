#include "core/train/cuda_trainer.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <span>
#include <vector>

#include "core/data/data.h"
#include "core/device.h"
#include "core/dist/layout.h"
#include "core/dist/nccl_communicator.h"
#include "core/flops.h"
#include "core/model/cuda_model.h"
#include "core/optim/cuda_optimizer.h"
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

// As trainer.cc: every rank evaluates its slice of each global validation batch.
double Evaluate(CudaModel& model, TokenSource& data, const RunConfig& c,
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
  return sum / (static_cast<double>(c.eval.batches) * layout.dp);
}

TrainResult Fail(TrainResult result, MetricsSink* sink, const std::string& error) {
  result.status = RunStatus::kFailed;
  result.error = error;
  sink->OnEnd(result.status, result.error);
  return result;
}

}  // namespace

// Mirrors Train() in trainer.cc step for step; the differences: parameters, gradients and
// optimizer state live on the device (host copies only for checkpoints), the gradient norm,
// clipping, optimizer and QK-Clip run on the device, and several ranks (mpirun) exchange through
// an NcclCommunicator created here over the job's MPI world (data parallelism only; every rank
// reads the resume checkpoint itself, so checkpoints must be on a shared filesystem).
TrainResult TrainOnCuda(const RunConfig& c, MetricsSink* sink, const TrainOptions& options) {
  TrainResult result;
  result.last_val_loss = std::numeric_limits<double>::quiet_NaN();
  try {
    RequireDevice(c.train);
  } catch (const DeviceError& e) {
    return Fail(result, sink, std::string("train.device: ") + e.what());
  }
  std::string why;
  if (!CudaModel::ForwardBackwardAvailable(&why)) {
    return Fail(result, sink, "train.device \"cuda\": " + why);
  }
  SingleProcessCommunicator single;
  Communicator* comm = options.comm ? options.comm : &single;
  std::unique_ptr<NcclCommunicator> nccl;
  DistLayout layout;
  try {
    layout = MakeDistLayout(c, comm->world_size(), comm->rank());
    if (layout.world > 1) {
      if (layout.ep > 1 || c.dist.zero1) {
        throw std::runtime_error(
            "train.device \"cuda\" with several ranks supports data parallelism only "
            "(dist.expert_parallel 1, dist.zero1 false)");
      }
      if (comm->kind() != "nccl") {
        nccl = NcclCommunicator::Create();  // collective over the MPI world
        comm = nccl.get();
      }
    }
  } catch (const std::exception& e) {
    return Fail(result, sink, e.what());
  }
  // Only rank 0 records and writes checkpoints.
  NullSink null_sink;
  const bool leader = comm->rank() == 0;
  if (!leader) sink = &null_sink;
  const int local_batch = layout.local_batch;
  const std::string ckpt_dir = options.checkpoint_dir.empty()
                                   ? DefaultCheckpointDir(c, options.run_uuid)
                                   : options.checkpoint_dir;
  const std::string hash = ConfigHash(c);
  const std::string branch_hash = BranchHash(c);
  const int64_t total = c.total_steps();
  const int B = c.train.batch_size, S = c.model.seq_len;
  const int64_t tokens_per_step = TokensPerStep(c);
  const double flops_per_token = ForwardFlopsPerToken(c).training();

  try {
    std::unique_ptr<TokenSource> data = OpenTokenSource(c.data, c.model.vocab_size);
    RequireCudaMemory(c, local_batch, false);  // refuses what cannot fit (the CLI printed it)
    CudaModel model(c);
    model.Init(c.train.seed);
    std::unique_ptr<CudaOptimizer> optimizer =
        MakeCudaOptimizer(c.optimizer, model.param_infos(), model.bf16());
    const size_t n = model.num_params();
    std::vector<float> host_params(n);  // checkpoint staging
    std::span<float> params(host_params);
    std::span<float> bias(model.router_bias().data(), model.router_bias().size());

    int64_t step = 0, tokens_seen = 0;
    double flops = 0;
    // The same choice as the CPU trainer: this run's newest valid checkpoint (another run's are
    // skipped with a warning), else the WSD branch point. Every rank reads (shared filesystem).
    std::string from;
    CheckpointHeader h;
    const std::function<void(const std::string&)> warn =
        leader ? std::function<void(const std::string&)>(WarnResume) : nullptr;
    if (options.resume) {
      from = ReadNewestValidCheckpoint(
          ResumeCandidates(ckpt_dir, ResumeIdentityOf(options, hash), warn), hash, params, bias,
          optimizer->state(), &h, warn);
    }
    if (from.empty() && !options.init_from.empty()) {
      from = options.init_from;
      h = ReadCheckpoint(from, branch_hash, params, bias, optimizer->state(), true);
    }
    if (!from.empty()) {
      if (h.step > total) {
        throw std::runtime_error(
            fmt::format("{} is at step {}, beyond this run's {} steps", from, h.step, total));
      }
      model.UploadParams(host_params.data());
      model.UploadRouterBias();
      optimizer->SyncToDevice();
      step = h.step;
      tokens_seen = h.tokens;
      flops = h.flops;
      result.checkpoint = from;
    }
    result.start_step = step;
    if (options.on_start) options.on_start(step);

    auto write = [&](const std::string& dir, int64_t at, int keep) -> std::string {
      if (!leader) return "";
      model.DownloadParams(host_params.data());
      optimizer->SyncToHost();
      CheckpointHeader h{hash, branch_hash, at, tokens_seen, flops, options.run_uuid};
      return WriteCheckpoint(dir, h, params, bias, optimizer->state(), keep);
    };
    auto is_branch_step = [&](int64_t at) {
      return std::find(options.branch_steps.begin(), options.branch_steps.end(), at) !=
             options.branch_steps.end();
    };

    std::vector<int32_t> tokens(static_cast<size_t>(B) * (S + 1));
    const int32_t* local_tokens =
        tokens.data() + static_cast<size_t>(comm->rank()) * local_batch * (S + 1);
    StepStats stats;
    const MicroBatchPlan micro = PlanMicroBatches(c, local_batch);
    DeviceGradAccumulator accumulator(n);
    ProgressBar bar("train", total, options.progress && leader);
    const int64_t end = options.stop_at_step >= 0 ? std::min(total, options.stop_at_step) : total;
    auto last_heartbeat = Clock::now();
    sink->OnHeartbeat();
    const bool aux_free = c.moe.enabled() && c.moe.balance == "aux_free";
    int64_t steps_timed = 0;
    double time_in_steps = 0;

    while (step < end) {
      bool stop = options.stop_flag && options.stop_flag->load();
      if (layout.world > 1) {
        float f = stop ? 1.0f : 0.0f;
        comm->AllReduceMax(&f, 1);
        stop = f > 0;
      }
      if (stop) break;
      const auto t0 = Clock::now();
      data->TrainBatch(c.train.seed, step, 0, B, S, tokens.data());
      ForwardBackwardMicroBatched(model, local_tokens, S, micro, &stats, accumulator);
      float* grads = model.grads();
      if (layout.world > 1) {
        // In place on the device. NcclCommunicator orders it after the backward's kernels (an
        // event on the default stream that its non-blocking stream waits for).
        comm->AllReduceSum(grads, n);
        DeviceScale(grads, n, 1.0f / comm->world_size());
        comm->AllReduceMax(stats.max_logit.data(), stats.max_logit.size());
        comm->AllReduceMax(stats.max_logit_raw.data(), stats.max_logit_raw.size());
        comm->AllReduceSum(stats.expert_counts.data(), stats.expert_counts.size());
        double l[3] = {stats.loss, stats.aux_loss, stats.z_loss};
        comm->AllReduceSum(l, 3);
        stats.loss = l[0] / layout.dp;
        stats.aux_loss = l[1] / layout.dp;
        stats.z_loss = l[2] / layout.dp;
      }
      ++step;
      const double grad_norm = DeviceL2Norm(grads, n);
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
        DeviceScale(grads, n, static_cast<float>(c.optimizer.grad_clip / grad_norm));
      }
      const double lr = ScheduledLr(c.schedule, c.optimizer.lr, step, total);
      optimizer->Step(model.params(), grads, lr, step);
      if (c.optimizer.qk_clip_tau > 0) {
        const QkClipPlan plan = PlanQkClip(c, model.param_infos(), stats.max_logit_raw, step);
        ApplyQkClipPlanOnDevice(plan, model.params());
        if (!plan.events.empty()) sink->OnClip(plan.events);
      }
      model.ParamsChanged();
      if (aux_free) model.UpdateRouterBias(stats.expert_counts, c.moe.bias_update_rate);

      tokens_seen += tokens_per_step;
      flops += flops_per_token * static_cast<double>(tokens_per_step);
      const double dt = Seconds(t0, Clock::now());
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
      sink->OnStep(r, stats);
      result.last_loss = stats.loss;

      if ((c.eval.every > 0 && step % c.eval.every == 0) || step == total) {
        result.last_val_loss = Evaluate(model, *data, c, tokens, *comm, layout);
        sink->OnEval(step, tokens_seen, flops, result.last_val_loss);
      }
      if (leader && ((c.checkpoint.every > 0 && step % c.checkpoint.every == 0) || step == total)) {
        result.checkpoint = write(ckpt_dir, step, c.checkpoint.keep);
        sink->OnCheckpoint(step, result.checkpoint);
      }
      if (is_branch_step(step)) {
        write(BranchCheckpointDir(ckpt_dir), step, std::numeric_limits<int>::max());
      }
      if (Seconds(last_heartbeat, Clock::now()) >= 1.0) {
        sink->OnHeartbeat();
        last_heartbeat = Clock::now();
      }
      result.tokens_per_s = steps_timed * static_cast<double>(tokens_per_step) / time_in_steps;
      bar.Update(step, fmt::format("loss {:.4f} | {} tok/s", stats.loss,
                                   ProgressBar::FormatCount(result.tokens_per_s)));
    }
    result.steps_done = step;
    if (step < total) {
      if (leader && CheckpointStepOf(result.checkpoint) != step) {
        result.checkpoint = write(ckpt_dir, step, c.checkpoint.keep);
        sink->OnCheckpoint(step, result.checkpoint);
      }
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
