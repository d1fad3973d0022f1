// `moelab db runs|show|migrate|integrity|mark-stale`
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/db_option.h"
#include "cli/train_resume.h"
#include "db/merge.h"
#include "db/reader.h"
#include "db/schema.h"
#include "db/writer.h"
#include "sweeps/adopt.h"

namespace moelab::cli {

namespace {

// "device cuda (bf16), kernels attention=auto attention_kernel=mma ..." from a stored config:
// train.kernels (core/kernel_choices.h) is recorded with the run; runs from before it have none.
std::string DeviceAndKernelsLine(const std::string& config_json) {
  const nlohmann::json c = nlohmann::json::parse(config_json, nullptr, false);
  if (c.is_discarded() || !c.contains("train") || !c["train"].is_object()) {
    return "device and kernels: the stored config is unreadable";
  }
  const nlohmann::json& t = c["train"];
  std::string line = fmt::format("device {} ({}), kernels", t.value("device", "cpu"),
                                 t.value("precision", "auto"));
  if (!t.contains("kernels") || !t["kernels"].is_object()) {
    return line + " not recorded (a run from before train.kernels: the defaults of its time)";
  }
  for (const auto& [key, value] : t["kernels"].items()) {
    line += fmt::format(" {}={}", key, value.is_string() ? value.get<std::string>() : value.dump());
  }
  return line;
}

}  // namespace

namespace {

std::string Opt(const std::optional<double>& v, const char* fmt_spec = "{:.4f}") {
  return v && std::isfinite(*v) ? fmt::format(fmt::runtime(fmt_spec), *v) : "-";
}

}  // namespace

void AddDbCommand(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand("db", "Look into a moelab database");
  cmd->require_subcommand(1);
  auto path = std::make_shared<std::string>(kDefaultDb);
  auto as_json = std::make_shared<bool>(false);

  CLI::App* runs = cmd->add_subcommand("runs", "List runs with their status and summary");
  AddDbOption(runs, path.get(), DbAccess::kRead);
  runs->add_flag("--json", *as_json, "JSON output");
  runs->callback([path, as_json]() {
    db::Reader reader(*path);
    const auto rows = reader.ListRuns();
    if (*as_json) {
      nlohmann::json out = nlohmann::json::array();
      for (const auto& r : rows) {
        out.push_back(
            {{"id", r.id},
             {"name", r.name},
             {"status", ToString(r.effective_status)},
             {"config_hash", r.config_hash},
             {"step", r.last_step},
             {"total_steps", r.shape.total_steps},
             {"loss", r.last_loss ? nlohmann::json(*r.last_loss) : nullptr},
             {"best_val_loss", r.best_val_loss ? nlohmann::json(*r.best_val_loss) : nullptr},
             {"tokens", r.tokens},
             {"flops", r.flops},
             {"error", r.error}});
      }
      fmt::print("{}\n", out.dump(2));
      return;
    }
    // The name column fits the longest name (a cut name hides which budget a run is), capped so a
    // long name cannot push the numbers off screen; a longer one keeps its start and its end
    // (where sweep names put the budget) around a "~". When two different names would still
    // read the same, the column takes their full length: two runs never look identical.
    size_t longest = 4;
    for (const auto& r : rows) longest = std::max(longest, r.name.size());
    size_t name_width = std::min<size_t>(longest, 60);
    const auto cut = [](const std::string& n, size_t width) {
      if (n.size() <= width) return n;
      const size_t tail = (width - 1) / 2;
      return n.substr(0, width - 1 - tail) + "~" + n.substr(n.size() - tail);
    };
    {
      std::map<std::string, std::string> seen;  // shown -> full
      for (const auto& r : rows) {
        auto [it, inserted] = seen.emplace(cut(r.name, name_width), r.name);
        if (!inserted && it->second != r.name) name_width = longest;
      }
    }
    const auto shown_name = [&](const std::string& n) { return cut(n, name_width); };
    fmt::print("{:>4}  {:<{}} {:<9} {:>11} {:>8} {:>9} {:>10} {:>10}  {}\n", "id", "name",
               name_width, "status", "step", "loss", "best val", "tokens", "tok/s", "config");
    for (const auto& r : rows) {
      fmt::print("{:>4}  {:<{}} {:<9} {:>11} {:>8} {:>9} {:>10.3g} {:>10}  {}\n", r.id,
                 shown_name(r.name), name_width, ToString(r.effective_status),
                 fmt::format("{}/{}", r.last_step, r.shape.total_steps), Opt(r.last_loss),
                 Opt(r.best_val_loss), static_cast<double>(r.tokens), Opt(r.tokens_per_s, "{:.0f}"),
                 r.config_hash.substr(0, 12));
      if (!r.error.empty()) fmt::print("      error: {}\n", r.error);
    }
  });

  auto run_key = std::make_shared<std::string>();
  CLI::App* show = cmd->add_subcommand("show", "Show one run: config, curve and max logits");
  show->add_option("run", *run_key, "Run id or name (as `moelab train --resume RUN` takes it)")
      ->required();
  AddDbOption(show, path.get(), DbAccess::kRead);
  show->callback([path, run_key]() {
    db::Reader reader(*path);
    const std::vector<db::RunRow> rows = reader.ListRuns();
    const db::RunRow* run = nullptr;
    try {
      run = FindRun(rows, *run_key, *path);
    } catch (const TrainRefused& e) {
      fmt::print(stderr, "moelab db show: {}\n", e.what());
      throw CLI::RuntimeError(e.code());
    }
    if (!run) {
      std::string list;
      for (const db::RunRow& r : rows) list += "\n" + DescribeRun(r);
      throw std::runtime_error(
          fmt::format("no run '{}' in {}{}", *run_key, *path,
                      rows.empty() ? " (it has no runs)" : "; its runs:" + list));
    }
    const int64_t run_id = run->id;
    fmt::print("run {} '{}' status {} step {}/{}\n", run->id, run->name,
               ToString(run->effective_status), run->last_step, run->shape.total_steps);
    fmt::print("params {} total, {} active; {:.3g} training FLOPs/token\n", run->shape.params_total,
               run->shape.params_active, run->shape.flops_per_token);
    fmt::print("{}\n", DeviceAndKernelsLine(reader.RunConfigJson(run_id)));
    const db::Series loss = reader.GetSeries(run_id, "loss");
    const db::Series val = reader.GetSeries(run_id, "val_loss");
    const size_t every = std::max<size_t>(1, loss.steps.size() / 10);
    fmt::print("\n{:>8} {:>10}\n", "step", "loss");
    for (size_t i = 0; i < loss.steps.size(); i += every)
      fmt::print("{:>8} {:>10.4f}\n", loss.steps[i], loss.values[i]);
    fmt::print("\n{:>8} {:>10}\n", "step", "val loss");
    for (size_t i = 0; i < val.steps.size(); ++i)
      fmt::print("{:>8} {:>10.4f}\n", val.steps[i], val.values[i]);
    if (auto m = reader.GetMaxLogitMatrix(run_id)) {
      fmt::print("\nmax logit S_max (layer x head) at step {}\n", m->step);
      for (int l = 0; l < m->layers; ++l) {
        fmt::print("  L{:<3}", l);
        for (int h = 0; h < m->heads; ++h) fmt::print(" {:7.2f}", m->values[l * m->heads + h]);
        fmt::print("\n");
      }
    }
  });

  // Readers (fit, show, the GUI) refuse a file of an older schema rather than guess at missing
  // columns; this applies the pending migrations, as any writer does when it opens the file.
  CLI::App* migrate = cmd->add_subcommand(
      "migrate", "Upgrade a database written by an older moelab to this build's schema");
  AddDbOption(migrate, path.get(), DbAccess::kRead)->check(CLI::ExistingFile);
  migrate->callback([path]() {
    const int before = [&] {
      db::Connection raw(*path, SQLITE_OPEN_READONLY);
      return static_cast<int>(raw.QueryInt("PRAGMA user_version"));
    }();
    db::OpenForWrite(*path);
    fmt::print("{}: schema version {} -> {}{}\n", *path, before, db::SchemaVersion(),
               before == db::SchemaVersion() ? " (already current)" : "");
  });

  CLI::App* integrity = cmd->add_subcommand("integrity", "Run PRAGMA integrity_check");
  AddDbOption(integrity, path.get(), DbAccess::kRead);
  integrity->callback([path]() {
    const std::string r = db::IntegrityCheck(*path);
    fmt::print("{}\n", r);
    if (r != "ok") throw CLI::RuntimeError(1);
  });

  auto source = std::make_shared<std::string>();
  CLI::App* merge = cmd->add_subcommand(
      "merge", "Import runs from another database file (by config hash, no duplicates)");
  merge->add_option("source", *source, "Database to import from")
      ->required()
      ->check(CLI::ExistingFile);
  AddDbOption(merge, path.get(), DbAccess::kWrite);
  merge->callback([path, source]() {
    const db::MergeResult r = db::MergeDatabase(*path, *source);
    fmt::print("imported {} run(s), skipped {} already present\n", r.imported, r.skipped);
    if (r.promotions_imported + r.promotions_skipped > 0) {
      fmt::print("imported {} promotion(s), skipped {} already present\n", r.promotions_imported,
                 r.promotions_skipped);
    }
    if (r.adaptive_batches_imported + r.adaptive_batches_skipped > 0) {
      fmt::print("imported {} adaptive batch(es), skipped {} already present\n",
                 r.adaptive_batches_imported, r.adaptive_batches_skipped);
    }
    for (const std::string& name : r.adaptive_conflicts) {
      fmt::print(
          "warning: adaptive sweep '{}' chose other runs in the two files: its history here is "
          "kept, the other's is not imported (one sequential question has one history)\n",
          name);
    }
    // Runs of a sweep trained elsewhere (a Slurm job's database) join it now, by config hash.
    for (const auto& a : sweeps::AdoptRuns(*path)) {
      fmt::print("run {} ({}) joined sweep '{}' as #{}\n", a.run_id, ToString(a.status), a.sweep,
                 a.idx);
    }
  });

  auto max_age = std::make_shared<double>(30.0);
  CLI::App* stale =
      cmd->add_subcommand("mark-stale", "Mark running runs with a stale heartbeat as failed");
  AddDbOption(stale, path.get(), DbAccess::kRead)->check(CLI::ExistingFile);
  stale->add_option("--max-age", *max_age, "Heartbeat age in seconds")->capture_default_str();
  stale->callback([path, max_age]() {
    fmt::print("{} run(s) marked failed\n", db::MarkStaleRunsFailed(*path, *max_age));
  });

  AddDbExportCommand(*cmd);  // cli/db_export.cc
}

}  // namespace moelab::cli
