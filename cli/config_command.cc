// `moelab config docs|check|hash`
#include <fmt/format.h>

#include <cstdio>

#include "cli/commands.h"
#include "core/config.h"
#include "core/device.h"
#include "core/flops.h"
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
  CLI::App* check =
      cmd->add_subcommand("check", "Validate a config and print it fully defaulted with its hash");
  check->add_option("config", *file)->required()->check(CLI::ExistingFile);
  check->add_option("--set", *sets, "Override a config field: path.to.key=value");
  check->callback([file, sets]() {
    try {
      const RunConfig c = LoadConfigFile(*file, *sets);
      try {
        RequireDevice(c.train);  // as `moelab train` would refuse it: before any run is planned
      } catch (const DeviceError& e) {
        throw ConfigError("train.device", e.what());
      }
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
