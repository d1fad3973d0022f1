#include "core/train/trainer.h"

#include <cblas.h>
#include <fmt/format.h>
#include <omp.h>

#include <exception>
#include <limits>
#include <string>

#include "core/comm/communicator.h"
#include "core/flops.h"
#include "core/train/training_run.h"

namespace moelab {

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
  TrainingConstants k;
  k.ckpt_dir = options.checkpoint_dir.empty() ? DefaultCheckpointDir(c, options.run_uuid)
                                              : options.checkpoint_dir;
  k.hash = ConfigHash(c);
  k.branch_hash = BranchHash(c);
  k.total = c.total_steps();
  k.B = c.train.batch_size;  // the global batch
  k.S = c.model.seq_len;
  k.tokens_per_step = TokensPerStep(c);
  k.flops_per_token = ForwardFlopsPerToken(c).training();

  omp_set_num_threads(c.train.threads);
  openblas_set_num_threads(c.train.threads);

  try {
    // Inside the try: a failure unwinds the run (its model, communicators, expert-parallel
    // scope) before the sink hears of it.
    TrainingRun run(c, sink, options, *comm, k, result);
    run.Run();
  } catch (const std::exception& e) {
    result.status = RunStatus::kFailed;
    result.error = e.what();
    sink->OnEnd(result.status, result.error);
  }
  return result;
}

}  // namespace moelab
