// `moelab db export`: a sweep's runs and evaluation points as JSON (read back by
// `moelab fit --inputs`) or CSV (one row per evaluation point), for committing beside an
// experiment so its tables can be checked without rerunning it; with --steps, every recorded
// step's metrics as CSV or JSON Lines (for pandas).
#include <fmt/format.h>

#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>

#include "analysis/export.h"
#include "cli/commands.h"
#include "cli/db_option.h"
#include "db/fits.h"

namespace moelab::cli {

void AddDbExportCommand(CLI::App& db) {
  struct Args {
    std::string db, sweep, format, out;
    bool steps = false;
  };
  auto a = std::make_shared<Args>();
  CLI::App* cmd = db.add_subcommand(
      "export",
      "Export a sweep's runs and evaluation points (JSON for `fit --inputs`, or CSV), or with "
      "--steps every step's metrics (CSV or JSON Lines)");
  AddDbOption(cmd, &a->db, DbAccess::kRead);
  cmd->add_option("--sweep", a->sweep, "Sweep name (default: every run)");
  cmd->add_flag("--steps", a->steps,
                "Per-step metrics: loss, LR, grad norm, S_max per head, expert load "
                "(docs/database.md)");
  cmd->add_option("--format", a->format,
                  "json | csv (default json); with --steps: csv | jsonl (default csv)")
      ->check(CLI::IsMember({"json", "csv", "jsonl"}));
  cmd->add_option("--out,-o", a->out, "Output file (default: stdout)");
  cmd->callback([a]() {
    std::optional<int64_t> sweep_id;
    if (!a->sweep.empty()) {
      const auto sweep = db::FindSweep(a->db, a->sweep);
      if (!sweep) throw std::runtime_error(fmt::format("no sweep '{}' in {}", a->sweep, a->db));
      sweep_id = sweep->id;
    }
    if (a->steps) {
      const std::string format = a->format.empty() ? "csv" : a->format;
      if (format == "json") {
        throw std::runtime_error("--steps writes csv or jsonl (one JSON object per line)");
      }
      const auto f =
          format == "csv" ? analysis::StepsFormat::kCsv : analysis::StepsFormat::kJsonLines;
      if (a->out.empty()) {
        analysis::ExportSteps(a->db, sweep_id, f, std::cout);
        std::cout.flush();
        return;
      }
      std::ofstream out(a->out, std::ios::binary);
      const int64_t rows = analysis::ExportSteps(a->db, sweep_id, f, out);
      out.close();
      if (!out) throw std::runtime_error(fmt::format("cannot write {}", a->out));
      fmt::print(stderr, "{} step rows -> {}\n", rows, a->out);
      return;
    }
    if (a->format == "jsonl") {
      throw std::runtime_error("jsonl is the format of --steps; the run export is json or csv");
    }
    const nlohmann::json e = analysis::ExportRuns(a->db, sweep_id, a->sweep);
    const std::string text = a->format == "csv" ? analysis::ExportCsv(e) : e.dump(1) + "\n";
    if (a->out.empty()) {
      std::fwrite(text.data(), 1, text.size(), stdout);
      return;
    }
    std::ofstream f(a->out, std::ios::binary);
    f << text;
    if (!f) throw std::runtime_error(fmt::format("cannot write {}", a->out));
    fmt::print(stderr, "{} runs, {} evaluation points -> {}\n", e["runs"].size(),
               e["points"].size(), a->out);
  });
}

}  // namespace moelab::cli
