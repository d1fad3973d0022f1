// `moelab config docs|check|hash`
#include <fmt/format.h>

#include <cstdio>

#include "cli/commands.h"
#include "core/config.h"
#include "core/dist/layout.h"
#include "core/flops.h"
#include "core/train/preflight.h"
#include "core/train/trainer.h"

namespace moelab::cli {

void AddConfigCommand(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand("config", "Inspect run configs");
  cmd->require_subcommand(1);
  cmd->add_subcommand("docs", "Print the config reference (docs/config.md)")->callback([]() {
    fmt::print("{}", ConfigDocsMarkdown());
  });
  auto file = std::make_shared<std::string>();
  auto sets = std::make_shared<std::vector<std::string>>();
  auto ranks = std::make_shared<int>(1);
  CLI::App* check = cmd->add_subcommand(
      "check",
      "Validate a config as `moelab train` does before training (data, tokenizer, device, "
      "memory plan) and print it fully defaulted with its hash; exit 2 on the same errors");
  check->add_option("config", *file)->required()->check(CLI::ExistingFile);
  check->add_option("--set", *sets, "Override a config field: path.to.key=value");
  check->add_option("--ranks", *ranks, "Check the layout of this many ranks (mpirun -np N)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  check->callback([file, sets, ranks]() {
    try {
      const RunConfig c = LoadConfigFile(*file, *sets);
      // The very checks `moelab train` runs before it records anything (core/train/preflight.h).
      PreflightOptions preflight;
      preflight.print_memory_plan = true;
      PreflightRun(c, MakeDistLayout(c, *ranks, 0), preflight);
      const ParamCounts p = CountParams(c);
      fmt::print("{}\n", ConfigToJson(c).dump(2));
      fmt::print(
          stderr, "ok: hash {}\n  {} steps, {} params ({} active), {:.3g} training FLOPs/token\n",
          ConfigHash(c), c.total_steps(), p.total, p.active, ForwardFlopsPerToken(c).training());
    } catch (const ConfigError& e) {
      fmt::print(stderr, "config error: {}\n", e.what());
      throw CLI::RuntimeError(kExitConfig);
    }
  });
}

}  // namespace moelab::cli
