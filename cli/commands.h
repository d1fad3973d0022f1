// The `moelab` subcommands; each file registers one on the CLI11 app.
#pragma once

#include <CLI/CLI.hpp>

namespace moelab::cli {

void AddDataCommand(CLI::App& app);
void AddTrainCommand(CLI::App& app);
void AddDbCommand(CLI::App& app);
void AddConfigCommand(CLI::App& app);
void AddBenchCommand(CLI::App& app);
void AddSweepCommand(CLI::App& app);
void AddFitCommand(CLI::App& app);
void AddPromoteCommand(CLI::App& app);
// `moelab db export`, registered on the `db` subcommand by AddDbCommand.
void AddDbExportCommand(CLI::App& db);

}  // namespace moelab::cli
