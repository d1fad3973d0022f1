// `moelab db export`: a sweep's runs and evaluation points as JSON (read back by
// `moelab fit --inputs`) or CSV (one row per evaluation point), for committing beside an
// experiment so its tables can be checked without rerunning it.
#include <fmt/format.h>

#include <cstdio>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>

#include "analysis/export.h"
#include "cli/commands.h"
#include "db/fits.h"

namespace moelab::cli {

void AddDbExportCommand(CLI::App& db) {
  struct Args {
    std::string db = "moelab.db", sweep, format = "json", out;
  };
  auto a = std::make_shared<Args>();
  CLI::App* cmd = db.add_subcommand(
      "export", "Export a sweep's runs and evaluation points (JSON for `fit --inputs`, or CSV)");
  cmd->add_option("--db", a->db, "Database file")->capture_default_str();
  cmd->add_option("--sweep", a->sweep, "Sweep name (default: every run)");
  cmd->add_option("--format", a->format, "json | csv")
      ->check(CLI::IsMember({"json", "csv"}))
      ->capture_default_str();
  cmd->add_option("--out,-o", a->out, "Output file (default: stdout)");
  cmd->callback([a]() {
    std::optional<int64_t> sweep_id;
    if (!a->sweep.empty()) {
      const auto sweep = db::FindSweep(a->db, a->sweep);
      if (!sweep) throw std::runtime_error(fmt::format("no sweep '{}' in {}", a->sweep, a->db));
      sweep_id = sweep->id;
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
