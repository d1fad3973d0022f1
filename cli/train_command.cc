// `moelab train CONFIG.json --db FILE [--name NAME] [--resume] [--set path=value ...]`
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <filesystem>

#include <fmt/format.h>

#include "cli/commands.h"
#include "core/config.h"
#include "core/data/data.h"
#include "core/device.h"
#include "core/flops.h"
#include "core/train/checkpoint.h"
#include "core/train/trainer.h"
#include "db/reader.h"
#include "db/writer.h"

namespace moelab::cli {

namespace {

std::atomic<bool> g_stop{false};

void OnSignal(int) { g_stop.store(true); }

std::string HostName() {
  char buf[256] = {0};
  gethostname(buf, sizeof buf - 1);
  return buf;
}

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
    RunConfig config;
    try {
      config = LoadConfigFile(args->config, args->set);
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
      fmt::print(stderr, "moelab train: config error: {}\n", e.what());
      throw CLI::RuntimeError(kExitConfig);
    }
    const std::string hash = ConfigHash(config);
    const std::string ckpt_dir =
        args->ckpt_dir.empty() ? DefaultCheckpointDir(config) : args->ckpt_dir;
    const std::string name =
        args->name.empty() ? std::filesystem::path(args->config).stem().string() : args->name;

    db::RunShape shape;
    shape.layers = config.model.layers;
    shape.heads = config.model.heads;
    shape.moe_layers =
        config.moe.enabled() ? config.model.layers - config.moe.dense_layers : 0;
    shape.experts = config.moe.experts_total;
    const ParamCounts pc = CountParams(config);
    shape.params_total = pc.total;
    shape.params_active = pc.active;
    shape.flops_per_token = ForwardFlopsPerToken(config).training();
    shape.total_steps = config.total_steps();

    const std::string latest = args->resume ? LatestCheckpoint(ckpt_dir) : "";
    int64_t start_step = 0;
    if (!latest.empty()) {
      start_step = CheckpointStepOf(latest);
    } else if (!args->init_from.empty()) {
      start_step = CheckpointStepOf(args->init_from);
    }
    std::unique_ptr<db::RunWriter> writer;
    if (args->run_id >= 0) {
      writer = db::RunWriter::Attach(args->db, args->run_id, start_step, shape);
    } else if (args->resume) {
      // The newest unfinished run of this config continues; a finished one is left alone.
      std::optional<db::RunRow> previous;
      const std::vector<int64_t> ids = db::RunWriter::FindRunsByHash(args->db, hash);
      if (!ids.empty()) previous = db::Reader(args->db).GetRun(ids.back());
      if (previous && previous->status == "done") {
        fmt::print(stderr, "moelab train: run {} ('{}') of this config is already done\n",
                   previous->id, previous->name);
        return;
      }
      if (previous) {
        writer = db::RunWriter::Attach(args->db, previous->id, start_step, shape);
        fmt::print(stderr, "moelab train: resuming run {} from step {}\n", previous->id,
                   start_step);
      }
    }
    if (!writer) {
      db::RunInfo info;
      info.name = name;
      info.config_json = ConfigToJson(config).dump();
      info.config_hash = hash;
      info.host = HostName();
      info.shape = shape;
      writer = db::RunWriter::Create(args->db, info);
    }

    if (config.data.source != "corpus") {
      // Synthetic sources know their true entropy rate: the floor a fitted irreducible loss
      // can be checked against.
      const double h = OpenTokenSource(config.data, config.model.vocab_size)->entropy_rate();
      db::RunWriter::SetRunVar(args->db, writer->run_id(), "data.entropy_rate",
                               fmt::format("{:.6f}", h));
    }

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
    fmt::print(stderr, "moelab train: run {} '{}' config {} ({} steps, {} params, {} active)\n",
               writer->run_id(), name, hash.substr(0, 12), config.total_steps(), pc.total,
               pc.active);
    const TrainResult result = Train(config, writer.get(), options);
    switch (result.status) {
      case RunStatus::kDone:
        fmt::print(stderr, "moelab train: done: {} steps, loss {:.4f}, val loss {:.4f}\n",
                   result.steps_done, result.last_loss, result.last_val_loss);
        fmt::print(stderr, "  recorded in {} as run {}; look at it with: moelab db runs --db {}\n",
                   args->db, writer->run_id(), args->db);
        return;
      case RunStatus::kStopped:
        fmt::print(stderr, "moelab train: stopped at step {}; checkpoint {}\n  continue with: "
                           "moelab train {} --db {} --resume\n",
                   result.steps_done, result.checkpoint, args->config, args->db);
        throw CLI::RuntimeError(kExitStopped);
      case RunStatus::kDiverged:
        fmt::print(stderr, "moelab train: DIVERGED: {}\n", result.error);
        throw CLI::RuntimeError(kExitDiverged);
      default:
        fmt::print(stderr, "moelab train: FAILED: {}\n", result.error);
        throw CLI::RuntimeError(kExitFailed);
    }
  });
}

}  // namespace moelab::cli
