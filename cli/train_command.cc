// `moelab train CONFIG.json --db FILE [--name NAME] [--resume] [--set path=value ...]`
#include <fmt/format.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <filesystem>

#include "cli/commands.h"
#include "core/config.h"
#include "core/data/data.h"
#include "core/device.h"
#include "core/dist/communicator.h"
#include "core/dist/layout.h"
#include "core/flops.h"
#include "core/host.h"
#include "core/run_shape.h"
#include "core/train/checkpoint.h"
#include "core/train/trainer.h"
#include "db/reader.h"
#include "db/writer.h"

namespace moelab::cli {

namespace {

std::atomic<bool> g_stop{false};

void OnSignal(int) { g_stop.store(true); }

}  // namespace

void AddTrainCommand(CLI::App& app) {
  struct Args {
    std::string config, db = "moelab.db", name, ckpt_dir;
    std::vector<std::string> set;
    bool resume = false, no_progress = false;
    int64_t stop_at = -1, run_id = -1;
    std::string init_from;
    std::vector<int64_t> branch_steps;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand("train", "Train one run and record it in SQLite");
  cmd->add_option("config", args->config, "Run config JSON (see docs/config.md)")
      ->required()
      ->check(CLI::ExistingFile);
  cmd->add_option("--db", args->db, "SQLite database file (created if missing)");
  cmd->add_option("--name", args->name, "Run name (default: the config file's name)");
  cmd->add_option("--set", args->set, "Override a config field: path.to.key=value")
      ->allow_extra_args(false);
  cmd->add_flag("--resume", args->resume,
                "Continue this config's unfinished run from its newest checkpoint");
  cmd->add_option("--checkpoint-dir", args->ckpt_dir,
                  "Checkpoint folder (default: checkpoint.dir/<config hash>)");
  cmd->add_option("--stop-at-step", args->stop_at,
                  "Stop with a checkpoint after this step (status stopped, resumable)");
  cmd->add_flag("--no-progress", args->no_progress, "No progress bar");
  cmd->add_option("--run-id", args->run_id,
                  "Record into this existing run row (created queued by the sweep engine)");
  cmd->add_option("--init-from", args->init_from,
                  "Start from a checkpoint of a run that differs only in length (WSD branch)")
      ->check(CLI::ExistingFile);
  cmd->add_option("--branch-steps", args->branch_steps,
                  "Keep checkpoints at these steps for WSD branches")
      ->delimiter(',');
  cmd->callback([args]() {
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
    RunConfig config;
    DistLayout layout;
    try {
      config = LoadConfigFile(args->config, args->set);
      layout = MakeDistLayout(config, world, comm->rank());
      // Data problems (missing corpus, vocabulary too small) are config errors too: report
      // them before a run row or checkpoint exists.
      if (config.data.source == "corpus") {
        try {
          CheckVocabFits(ReadDataMeta(config.data.path), config.model.vocab_size);
        } catch (const std::exception& e) {
          throw ConfigError("data.path", e.what());
        }
      }
      try {
        RequireDevice(config.train);  // train.device "cuda" without a GPU: exit 2, no run row
      } catch (const DeviceError& e) {
        throw ConfigError("train.device", e.what());
      }
    } catch (const ConfigError& e) {
      // Every rank sees the same config and world size, so all of them stop here.
      if (leader) fmt::print(stderr, "moelab train: config error: {}\n", e.what());
      throw CLI::RuntimeError(kExitConfig);
    }
    const std::string hash = ConfigHash(config);
    const std::string ckpt_dir =
        args->ckpt_dir.empty() ? DefaultCheckpointDir(config) : args->ckpt_dir;
    const std::string name =
        args->name.empty() ? std::filesystem::path(args->config).stem().string() : args->name;

    const db::RunShape shape = RunShapeOf(config);
    const ParamCounts pc = CountParams(config);

    const std::string latest = args->resume ? LatestCheckpoint(ckpt_dir) : "";
    int64_t start_step = 0;
    if (!latest.empty()) {
      start_step = CheckpointStepOf(latest);
    } else if (!args->init_from.empty()) {
      start_step = CheckpointStepOf(args->init_from);
    }
    // Only rank 0 touches the database: one run row per distributed run. It tells the other
    // ranks whether to train (0) or to exit with a code.
    std::unique_ptr<db::RunWriter> writer;
    int verdict = 0;
    if (leader) {
      try {
        if (args->run_id >= 0) {
          writer = db::RunWriter::Attach(args->db, args->run_id, start_step, shape);
        } else if (args->resume) {
          // The newest unfinished run of this config continues; a finished one is left alone.
          std::optional<db::RunRow> previous;
          const std::vector<int64_t> ids = db::RunWriter::FindRunsByHash(args->db, hash);
          if (!ids.empty()) previous = db::Reader(args->db).GetRun(ids.back());
          if (previous && previous->status == RunStatus::kDone) {
            fmt::print(stderr, "moelab train: run {} ('{}') of this config is already done\n",
                       previous->id, previous->name);
            verdict = -1;  // nothing to do: every rank exits 0
          }
          if (previous && verdict == 0) {
            writer = db::RunWriter::Attach(args->db, previous->id, start_step, shape);
            fmt::print(stderr, "moelab train: resuming run {} from step {}\n", previous->id,
                       start_step);
          }
        }
        if (!writer && verdict == 0) {
          db::RunInfo info;
          info.name = name;
          info.config_json = ConfigToJson(config).dump();
          info.config_hash = hash;
          info.host = HostName();
          info.shape = shape;
          writer = db::RunWriter::Create(args->db, info);
        }

        if (writer && config.data.source != "corpus") {
          // Synthetic sources know their true entropy rate: the floor a fitted irreducible loss
          // can be checked against.
          const double h = OpenTokenSource(config.data, config.model.vocab_size)->entropy_rate();
          db::RunWriter::SetRunVar(args->db, writer->run_id(), "data.entropy_rate",
                                   fmt::format("{:.6f}", h));
        }
        if (writer) {
          db::RunWriter::SetRunLayout(args->db, writer->run_id(), layout.world, layout.dp,
                                      layout.ep);
        }
      } catch (const std::exception& e) {
        fmt::print(stderr, "moelab train: FAILED before training: {}\n", e.what());
        verdict = kExitFailed;
      }
    }
    if (world > 1) {
      float v = static_cast<float>(verdict);
      comm->Broadcast(&v, 1, 0);
      verdict = static_cast<int>(v);
    }
    if (verdict == -1) return;
    if (verdict != 0) throw CLI::RuntimeError(verdict);
    NullSink null_sink;
    MetricsSink* sink = writer ? static_cast<MetricsSink*>(writer.get()) : &null_sink;

    std::signal(SIGINT, OnSignal);
    std::signal(SIGTERM, OnSignal);
    TrainOptions options;
    options.checkpoint_dir = ckpt_dir;
    options.resume = args->resume;
    options.stop_at_step = args->stop_at;
    options.init_from = args->init_from;
    options.branch_steps = args->branch_steps;
    options.stop_flag = &g_stop;
    options.progress = !args->no_progress;
    options.comm = comm.get();
    if (writer) {
      // Resume fell back past a corrupt checkpoint: drop the rows after the step it restarts
      // from so nothing is recorded twice.
      options.on_start = [&writer, start_step](int64_t s) {
        if (s < start_step) writer->TruncateAfter(s);
      };
    }
    if (leader) {
      fmt::print(stderr, "moelab train: run {} '{}' config {} ({} steps, {} params, {} active{})\n",
                 writer->run_id(), name, hash.substr(0, 12), config.total_steps(), pc.total,
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
      // Communication counters of rank 0 (moelab bench --distributed reads them).
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
    switch (result.status) {
      case RunStatus::kDone:
        fmt::print(stderr, "moelab train: done: {} steps, loss {:.4f}, val loss {:.4f}\n",
                   result.steps_done, result.last_loss, result.last_val_loss);
        fmt::print(stderr, "  recorded in {} as run {}; look at it with: moelab db runs --db {}\n",
                   args->db, writer->run_id(), args->db);
        return;
      case RunStatus::kStopped:
        fmt::print(stderr,
                   "moelab train: stopped at step {}; checkpoint {}\n  continue with: "
                   "moelab train {} --db {} --resume\n",
                   result.steps_done, result.checkpoint, args->config, args->db);
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
  });
}

}  // namespace moelab::cli
