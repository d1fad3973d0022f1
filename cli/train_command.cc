// `moelab train CONFIG.json --db FILE [--name NAME] [--set path=value ...]` trains a new run;
// `moelab train [CONFIG.json] --db FILE --resume [RUN]` continues a recorded run from its
// stored config (cli/train_resume.h chooses it).
#include <fmt/format.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "cli/build_info.h"
#include "cli/commands.h"
#include "cli/db_option.h"
#include "cli/train_resume.h"
#include "core/config.h"
#include "core/data/data.h"
#include "core/device.h"
#include "core/comm/communicator.h"
#include "core/dist/layout.h"
#include "core/comm/nccl_communicator.h"
#include "core/flops.h"
#include "core/host.h"
#include "core/model/cuda_backend.h"
#include "core/run_shape.h"
#include "core/train/checkpoint.h"
#include "core/train/micro_batch.h"
#include "core/train/preflight.h"
#include "core/train/progress.h"
#include "core/train/trainer.h"
#include "db/reader.h"
#include "db/writer.h"

namespace moelab::cli {

namespace {

std::atomic<bool> g_stop{false};

void OnSignal(int) { g_stop.store(true); }

// A string from rank 0 to every rank.
void BroadcastString(Communicator& comm, std::string* s) {
  uint64_t n = s->size();
  comm.BroadcastBytes(&n, sizeof n, 0);
  s->resize(n);
  if (n > 0) comm.BroadcastBytes(s->data(), n, 0);
}

// "loss 2.3456, val loss 2.4567" from a run's recorded summary.
std::string RecordedLosses(const db::RunRow& r) {
  const auto f = [](const std::optional<double>& v) {
    return v ? fmt::format("{:.4f}", *v) : std::string("(none recorded)");
  };
  return fmt::format("loss {}, val loss {}", f(r.last_loss), f(r.last_val_loss));
}

// The config a continued run trains with: the given file's (or the stored one with --set
// applied); it must not differ from the stored config in a hashed key. Throws ConfigError.
RunConfig ContinuedConfig(const TrainTarget& t, const std::optional<RunConfig>& file,
                          const std::vector<std::string>& sets, const std::string& file_path,
                          const std::string& db) {
  nlohmann::json stored_json = nlohmann::json::parse(t.stored_config_json);
  const RunConfig stored = ConfigFromJson(stored_json);
  RunConfig given = stored;
  if (file) {
    given = *file;
  } else if (!sets.empty()) {
    for (const std::string& o : sets) ApplyOverride(stored_json, o);
    given = ConfigFromJson(stored_json);
  }
  const std::vector<std::string> keys = DifferingKeys(stored, given);
  if (!keys.empty()) {
    std::string list;
    for (const std::string& k : keys) list += "\n  " + k;
    throw ConfigError(
        file ? file_path : "--set",
        fmt::format("differs from the stored config of run {} '{}' in:{}\n  to continue that "
                    "run, drop the config file and --set: moelab train --db {} --resume {}{}",
                    t.run->id, t.run->name, list, db, t.run->id,
                    file ? "\n  to start a new run of this config, drop --resume" : ""));
  }
  return given;
}

// How a continued run's layout (CPU threads, ranks, data- and expert-parallel sizes) differs
// from the one it last trained with, e.g. "trained with 2 threads, 1 rank; this resume has 1
// thread, 1 rank"; "" when it is the same (the trajectory continues bit for bit).
std::string LayoutChange(const TrainTarget& t, const RunConfig& config, const DistLayout& now) {
  const db::RunRow& r = *t.run;
  const int threads =
      r.threads.value_or(ConfigFromJson(nlohmann::json::parse(t.stored_config_json)).train.threads);
  if (threads == config.train.threads && r.ranks == now.world && r.dp_size == now.dp &&
      r.ep_size == now.ep) {
    return "";
  }
  const auto describe = [](int threads, int ranks, int dp, int ep) {
    return fmt::format("{} thread{}, {} rank{}{}", threads, threads == 1 ? "" : "s", ranks,
                       ranks == 1 ? "" : "s",
                       ranks == 1 ? "" : fmt::format(" (dp {}, ep {})", dp, ep));
  };
  return fmt::format("trained with {}; this resume has {}",
                     describe(threads, r.ranks, r.dp_size, r.ep_size),
                     describe(config.train.threads, now.world, now.dp, now.ep));
}

}  // namespace

namespace {

struct TrainArgs {
  std::string config, db, name, ckpt_dir, resume_run;
  std::vector<std::string> set;
  bool no_progress = false, allow_nondeterministic_resume = false;
  int64_t stop_at = -1, run_id = -1;
  std::string init_from;
  std::vector<int64_t> branch_steps;
};

// Rank 0 chooses the run (only it touches the database): the target and the config to train
// as JSON. Returns 0 (train), -1 (nothing to do: exit 0) or an exit code, said on stderr.
int ChooseTrainTarget(const TrainArgs* args, const std::optional<RunConfig>& file_config,
                      bool resuming, TrainTarget* target_out, std::string* config_json_out) {
  TrainTarget& target = *target_out;
  std::string& config_json = *config_json_out;
  int verdict = 0;
  try {
    TrainRequest q;
    q.db = args->db;
    q.resume = resuming;
    q.resume_run = args->resume_run;
    q.run_id = args->run_id;
    q.name = args->name;
    if (file_config) q.config_hash = ConfigHash(*file_config);
    target = ChooseRun(q);
    RunConfig config;
    if (target.kind == TrainTarget::kNew) {
      if (!file_config) throw ConfigError("config", "a config file is required for a new run");
      config = *file_config;
    } else {
      config = ContinuedConfig(target, file_config, args->set, args->config, args->db);
      if (!args->name.empty() && args->name != target.run->name) {
        throw ConfigError("--name", fmt::format("'{}' is not the name of run {} ('{}')", args->name,
                                                target.run->id, target.run->name));
      }
    }
    config_json = ConfigToJson(config).dump();
  } catch (const TrainRefused& e) {
    fmt::print(stderr, "moelab train: {}\n", e.what());
    verdict = e.code();
  } catch (const ConfigError& e) {
    fmt::print(stderr, "moelab train: config error: {}\n", e.what());
    verdict = kExitConfig;
  } catch (const std::exception& e) {
    fmt::print(stderr, "moelab train: FAILED before training: {}\n", e.what());
    verdict = kExitFailed;
  }
  return verdict;
}

// Prints a config error (rank 0; every rank sees the same config and world size) and stops
// every rank with the config exit code.
[[noreturn]] void ConfigErrorExit(bool leader, const std::string& what) {
  if (leader) fmt::print(stderr, "moelab train: config error: {}\n", what);
  throw CLI::RuntimeError(kExitConfig);
}

// The config to train and this rank's layout, with the data, device and memory checks of
// `moelab config check` run before a run row or checkpoint exists.
void PrepareRun(const std::string& config_json, Communicator* comm, RunConfig* config_out,
                DistLayout* layout_out) {
  RunConfig& config = *config_out;
  DistLayout& layout = *layout_out;
  const bool leader = comm->rank() == 0;
  const int world = comm->world_size();
  try {
    config = ConfigFromJson(nlohmann::json::parse(config_json));
    layout = MakeDistLayout(config, world, comm->rank());
    // Data, device and memory problems are config errors too (`moelab config check` runs
    // the same checks): reported before a run row or checkpoint exists.
    PreflightOptions preflight;
    preflight.print_memory_plan = leader;
    if (world > 1) {
      // Each rank's own GPU before the memory check's cudaMemGetInfo makes a CUDA context on
      // the current device (GPU 0 until set; every rank would keep one there).
      preflight.before_memory_check = [] {
        try {
          NcclCommunicator::UseNodeLocalDevice();
        } catch (const std::exception& e) {
          throw ConfigError("train.device", e.what());
        }
      };
    }
    PreflightRun(config, layout, preflight);
  } catch (const ConfigError& e) {
    ConfigErrorExit(leader, e.what());
  }
}

// What rank 0 opened for the run: its row's writer, name, uuid and checkpoint folder.
struct OpenedRun {
  std::unique_ptr<db::RunWriter> writer;
  std::string name, uuid, ckpt_dir;
  bool layout_changed = false;  // resumed with other threads or ranks (allowed by the flag)
  ResumeFolder folder;
  // The step training starts from: the resumed checkpoint's, else the WSD branch point's
  // (whose rows the sweep engine copied into the run), else 0. Rows after it are dropped.
  int64_t start_step = 0;
};

// Rank 0 only: the run row (one per distributed run), attached or created, with its layout and
// build recorded. Returns 0 (train), -1 (already finished: exit 0) or an exit code.
int OpenRunRow(const TrainArgs* args, const TrainTarget& target, const RunConfig& config,
               const DistLayout& layout, const std::string& config_json, const std::string& hash,
               const db::RunShape& shape, OpenedRun* row) {
  std::unique_ptr<db::RunWriter>& writer = row->writer;
  std::string& name = row->name;
  std::string& uuid = row->uuid;
  std::string& ckpt_dir = row->ckpt_dir;
  bool& layout_changed = row->layout_changed;
  ResumeFolder& folder = row->folder;
  int64_t& start_step = row->start_step;
  int verdict = 0;
  try {
    if (!target.note.empty()) fmt::print(stderr, "moelab train: {}\n", target.note);
    if (target.kind == TrainTarget::kFinished) {
      const db::RunRow& r = *target.run;
      const bool diverged = r.status == RunStatus::kDiverged;
      fmt::print(stderr, "moelab train: run {} '{}' is already {} at step {}: {}{}\n", r.id, r.name,
                 ToString(r.status), diverged ? r.diverged_step.value_or(r.last_step) : r.last_step,
                 RecordedLosses(r), diverged ? " (not resumed: it would diverge again)" : "");
      verdict = diverged ? kExitDiverged : -1;
    } else if (target.kind == TrainTarget::kContinue) {
      const db::RunRow& r = *target.run;
      name = r.name;
      uuid = r.uuid;
      folder = FindResumeFolder(r, config, args->ckpt_dir);
      ckpt_dir = folder.dir;
      if (!folder.warning.empty()) {
        fmt::print(stderr, "moelab train: warning: run {}: {}\n", r.id, folder.warning);
      }
      if (!folder.from.empty()) {
        start_step = folder.start_step;
        layout_changed = !LayoutChange(target, config, layout).empty();
        if (layout_changed && !args->allow_nondeterministic_resume) {
          throw TrainRefused(
              kExitConfig,
              fmt::format("config error: run {} '{}' {}: resumed so, its losses would leave "
                          "the recorded trajectory (same seed and threads give the same "
                          "losses bit for bit).\n  resume with the recorded layout, or pass "
                          "--allow-nondeterministic-resume to continue anyway (the run then "
                          "records the step, runs.nondeterministic_from_step)",
                          r.id, r.name, LayoutChange(target, config, layout)));
        }
      }
      writer = db::RunWriter::Attach(args->db, r.id, start_step, shape);
      if (folder.from.empty()) {
        fmt::print(stderr, "moelab train: resuming run {} '{}' from step {}: it has no {}\n", r.id,
                   r.name, start_step,
                   r.last_step > start_step ? "checkpoint to continue from" : "checkpoint yet");
      }  // else announced by on_start once Train has read and verified the checkpoint
    } else {
      name = args->name.empty() ? std::filesystem::path(args->config).stem().string() : args->name;
      db::RunInfo info;
      info.name = name;
      info.config_json = config_json;
      info.config_hash = hash;
      info.host = HostName();
      info.shape = shape;
      writer = db::RunWriter::Create(args->db, info);
      uuid = db::Reader(args->db).GetRun(writer->run_id())->uuid;
      ckpt_dir = args->ckpt_dir.empty() ? DefaultCheckpointDir(config, uuid) : args->ckpt_dir;
    }

    if (writer && config.data.source != "corpus") {
      // Synthetic sources know their true entropy rate: the floor a fitted irreducible loss
      // can be checked against.
      const double h = OpenTokenSource(config.data, config.model.vocab_size)->entropy_rate();
      db::RunWriter::SetRunVar(args->db, writer->run_id(), "data.entropy_rate",
                               fmt::format("{:.6f}", h));
    }
    if (writer) {
      db::RunWriter::SetRunLayout(args->db, writer->run_id(), layout.world, layout.dp, layout.ep,
                                  config.train.threads);
      // Builds need not reproduce each other's losses bit for bit (one build does): every
      // (re)start records the build it ran, the last one winning.
      db::RunWriter::SetRunVar(args->db, writer->run_id(), "build.commit", BuildCommit());
    }
  } catch (const TrainRefused& e) {
    fmt::print(stderr, "moelab train: {}\n", e.what());
    verdict = e.code();
  } catch (const std::exception& e) {
    fmt::print(stderr, "moelab train: FAILED before training: {}\n", e.what());
    verdict = kExitFailed;
  }
  if (verdict != 0 && writer) {
    // Attached but not training: the row goes back to what it was (stopped, resumable).
    writer->OnEnd(RunStatus::kStopped, "");
    writer.reset();
  }
  return verdict;
}

// What Train needs from the command line, and the resume hook that drops rows recorded after
// the step training restarts from.
TrainOptions MakeTrainOptions(const TrainArgs* args, const TrainTarget& target,
                              const OpenedRun& row, Communicator* comm) {
  const bool layout_changed = row.layout_changed;
  const int64_t start_step = row.start_step;
  TrainOptions options;
  options.run_uuid = row.uuid;
  options.checkpoint_dir = row.ckpt_dir;
  options.resume = target.kind == TrainTarget::kContinue;
  options.legacy_checkpoint = row.folder.legacy_checkpoint;
  if (target.run) options.max_resume_step = target.run->last_step;
  options.stop_at_step = args->stop_at;
  options.init_from = args->init_from;
  options.branch_steps = args->branch_steps;
  options.stop_flag = &g_stop;
  options.progress = !args->no_progress;
  options.comm = comm;
  if (row.writer) {
    // Resume fell back past a corrupt checkpoint: drop the rows after the step it restarts
    // from so nothing is recorded twice.
    options.on_start = [writer = row.writer.get(), &target, args, layout_changed, start_step](
                           int64_t s, const std::string& from) {
      if (!from.empty() && target.run) {
        fmt::print(stderr, "moelab train: {} run {} '{}' from step {} ({})\n",
                   from == args->init_from ? "starting" : "resuming", target.run->id,
                   target.run->name, s, from);
        if (layout_changed) {
          db::RunWriter::MarkNondeterministicFrom(args->db, target.run->id, s);
          fmt::print(stderr,
                     "moelab train: warning: another thread count or layout from step {} "
                     "on (--allow-nondeterministic-resume): recorded on the run\n",
                     s);
        }
      }
      if (s < start_step) writer->TruncateAfter(s);
    };
  }
  return options;
}

// Rank 0's communication counters of a distributed run (moelab bench --distributed reads them).
void RecordCommCounters(const TrainArgs* args, const db::RunWriter& run,
                        const TrainResult& result) {
  const db::RunWriter* writer = &run;
  try {
    db::RunWriter::SetRunVar(args->db, writer->run_id(), "dist.comm_bytes_per_step",
                             fmt::format("{:.0f}", result.comm_bytes_per_step));
    db::RunWriter::SetRunVar(args->db, writer->run_id(), "dist.comm_time_share",
                             fmt::format("{:.6f}", result.comm_time_share));
    db::RunWriter::SetRunVar(args->db, writer->run_id(), "dist.optimizer_state_bytes",
                             fmt::format("{}", result.optimizer_state_bytes));
    db::RunWriter::SetRunVar(args->db, writer->run_id(), "dist.param_bytes",
                             fmt::format("{}", result.param_bytes));
  } catch (const std::exception& e) {
    fmt::print(stderr,
               "moelab train: warning: could not record the communication counters: "
               "{}\n",
               e.what());
  }
}

// Rank 0's summary of how training ended; throws the exit code of a run that did not finish.
void ReportTrainResult(const TrainArgs* args, const TrainResult& result, OpenedRun* row,
                       Communicator* comm) {
  std::unique_ptr<db::RunWriter>& writer = row->writer;
  const int world = comm->world_size();
  switch (result.status) {
    case RunStatus::kDone:
      if (result.steps_done > result.start_step) {
        // The summary names what it averages: the last batch's loss alone is noise.
        fmt::print(stderr,
                   "moelab train: done: {} steps ({} trained in {}, {} tok/s); train loss "
                   "{:.4f} (mean of the last {} step{}; last batch {:.4f}), val loss {:.4f}\n",
                   result.steps_done, result.steps_done - result.start_step,
                   ProgressBar::FormatDuration(result.train_seconds),
                   ProgressBar::FormatCount(result.tokens_per_s), result.recent_loss,
                   result.recent_loss_steps, result.recent_loss_steps == 1 ? "" : "s",
                   result.last_loss, result.last_val_loss);
      } else {
        // Resumed from the final checkpoint: nothing ran, the recorded losses are the result.
        fmt::print(stderr, "moelab train: done: {} steps (nothing left to train), {}\n",
                   result.steps_done,
                   RecordedLosses(*db::Reader(args->db).GetRun(writer->run_id())));
      }
      fmt::print(stderr, "  recorded in {} as run {}; look at it with: moelab db runs --db {}\n",
                 args->db, writer->run_id(), args->db);
      return;
    case RunStatus::kStopped:
      fmt::print(stderr,
                 "moelab train: stopped at step {}; checkpoint {}\n  continue with: "
                 "moelab train --db {} --resume {}\n",
                 result.steps_done, result.checkpoint, args->db, writer->run_id());
      throw CLI::RuntimeError(kExitStopped);
    case RunStatus::kDiverged:
      fmt::print(stderr, "moelab train: DIVERGED: {}\n", result.error);
      throw CLI::RuntimeError(kExitDiverged);
    default:
      fmt::print(stderr, "moelab train: FAILED: {}\n", result.error);
      if (world > 1) {
        writer.reset();  // flushed by OnEnd; close before ending the job
        comm->Abort(kExitFailed);
      }
      throw CLI::RuntimeError(kExitFailed);
  }
}

// The command: choose the run, check its config, open its row, train, report.
void RunTrainCommand(TrainArgs* args, bool resuming) {
  // Under mpirun/srun with several ranks: MPI; otherwise one process (no MPI at run time).
  std::unique_ptr<Communicator> comm;
  try {
    comm = MakeWorldCommunicator();
  } catch (const std::exception& e) {
    fmt::print(stderr, "moelab train: {}\n", e.what());
    throw CLI::RuntimeError(kExitConfig);
  }
  const bool leader = comm->rank() == 0;
  const int world = comm->world_size();
  // `--resume CONFIG.json` (the config after the flag): the file is the config, not a run.
  if (resuming && args->config.empty() && args->resume_run.ends_with(".json") &&
      std::filesystem::is_regular_file(args->resume_run)) {
    args->config = std::exchange(args->resume_run, "");
  }
  if (args->config.empty() && !resuming && args->run_id < 0) {
    ConfigErrorExit(leader,
                    "a config file is required (or --resume [RUN] to continue a recorded run)");
  }
  std::optional<RunConfig> file_config;
  if (!args->config.empty()) {
    try {
      file_config = LoadConfigFile(args->config, args->set);
    } catch (const ConfigError& e) {
      ConfigErrorExit(leader, e.what());
    }
  }

  // Rank 0 chooses the run (only it touches the database) and sends the others its verdict
  // and the config to train.
  TrainTarget target;
  std::string config_json;
  int verdict = 0;  // 0: train; -1: nothing to do (exit 0); else the exit code
  if (leader) verdict = ChooseTrainTarget(args, file_config, resuming, &target, &config_json);
  if (world > 1) {
    float v = static_cast<float>(verdict);
    comm->Broadcast(&v, 1, 0);
    verdict = static_cast<int>(v);
    if (verdict == 0) BroadcastString(*comm, &config_json);
  }
  if (verdict != 0) throw CLI::RuntimeError(verdict);
  RunConfig config;
  DistLayout layout;
  PrepareRun(config_json, comm.get(), &config, &layout);
  const std::string hash = ConfigHash(config);
  const db::RunShape shape = RunShapeOf(config);
  const ParamCounts pc = CountParams(config);

  // Only rank 0 touches the database: one run row per distributed run. It tells the other
  // ranks whether to train (0) or to exit with a code.
  OpenedRun row;
  row.start_step = args->init_from.empty() ? 0 : CheckpointStepOf(args->init_from);
  if (leader) verdict = OpenRunRow(args, target, config, layout, config_json, hash, shape, &row);
  if (world > 1) {
    float v = static_cast<float>(verdict);
    comm->Broadcast(&v, 1, 0);
    verdict = static_cast<int>(v);
  }
  if (verdict == -1) return;
  if (verdict != 0) throw CLI::RuntimeError(verdict);
  NullSink null_sink;
  MetricsSink* sink = row.writer ? static_cast<MetricsSink*>(row.writer.get()) : &null_sink;

  std::signal(SIGINT, OnSignal);
  std::signal(SIGTERM, OnSignal);
  // What a Slurm batch script sends on preemption or before the time limit: srun forwards
  // USR1 to every rank, where a TERM would make it SIGKILL them (sweeps/slurm.h).
  std::signal(SIGUSR1, OnSignal);
  const TrainOptions options = MakeTrainOptions(args, target, row, comm.get());
  if (leader) {
    fmt::print(stderr, "moelab train: run {} '{}' config {} ({} steps, {} params, {} active{})\n",
               row.writer->run_id(), row.name, hash.substr(0, 12), config.total_steps(), pc.total,
               pc.active, world > 1 ? ", " + layout.describe() : "");
  }
  const TrainResult result = Train(config, sink, options);
  if (!leader) {
    // The leader reports; a failure on any rank ends the whole job (the others would wait in
    // a collective forever).
    if (result.status == RunStatus::kFailed) {
      fmt::print(stderr, "moelab train: rank {} FAILED: {}\n", comm->rank(), result.error);
      comm->Abort(kExitFailed);
    }
    if (result.status == RunStatus::kDiverged) throw CLI::RuntimeError(kExitDiverged);
    if (result.status == RunStatus::kStopped) throw CLI::RuntimeError(kExitStopped);
    return;
  }
  if (world > 1 && result.steps_done > result.start_step) {
    RecordCommCounters(args, *row.writer, result);
  }
  ReportTrainResult(args, result, &row, comm.get());
}

}  // namespace

void AddTrainCommand(CLI::App& app) {
  auto args = std::make_shared<TrainArgs>();
  CLI::App* cmd = app.add_subcommand("train", "Train one run and record it in SQLite");
  cmd->add_option("config", args->config,
                  "Run config JSON (see docs/config.md); optional with --resume")
      ->check(CLI::ExistingFile);
  AddDbOption(cmd, &args->db, DbAccess::kWrite);
  cmd->add_option("--name", args->name, "Run name (default: the config file's name)");
  cmd->add_option("--set", args->set, "Override a config field: path.to.key=value")
      ->allow_extra_args(false);
  CLI::Option* resume =
      cmd->add_option("--resume", args->resume_run,
                      "Continue a recorded run (id or name; without one: this config's newest "
                      "unfinished run, else the only unfinished run; a new run of CONFIG when "
                      "there is none) from its own newest checkpoint and its stored config")
          ->expected(0, 1);
  cmd->add_option("--checkpoint-dir", args->ckpt_dir,
                  "Checkpoint folder (default: checkpoint.dir/<config hash>/<run uuid>)");
  cmd->add_option("--stop-at-step", args->stop_at,
                  "Stop with a checkpoint after this step (status stopped, resumable)");
  cmd->add_flag("--no-progress", args->no_progress, "No progress bar");
  cmd->add_flag("--allow-nondeterministic-resume", args->allow_nondeterministic_resume,
                "Continue a run from its checkpoint with another train.threads or rank layout "
                "(its losses then leave the recorded trajectory; the run records the step)");
  cmd->add_option("--run-id", args->run_id,
                  "Record into this existing run row, continuing it when it has a checkpoint "
                  "(queued by the sweep engine or moelab promote)");
  cmd->add_option("--init-from", args->init_from,
                  "Start from a checkpoint of a run that differs only in length (WSD branch)")
      ->check(CLI::ExistingFile);
  cmd->add_option("--branch-steps", args->branch_steps,
                  "Keep checkpoints at these steps for WSD branches")
      ->delimiter(',');
  cmd->callback([args, resume]() { RunTrainCommand(args.get(), resume->count() > 0); });
}
}  // namespace moelab::cli
