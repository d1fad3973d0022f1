// moelab: data, train, db, config and bench for the MoE research workbench.
#include <fmt/format.h>

#include <cstdio>

#include "cli/build_info.h"
#include "cli/commands.h"

int main(int argc, char** argv) {
  CLI::App app{"moelab: a workbench for Mixture-of-Experts language models"};
  app.set_version_flag("--version", std::string("moelab ") + moelab::cli::BuildCommit());
  app.require_subcommand(1);
  moelab::cli::AddDataCommand(app);
  moelab::cli::AddTrainCommand(app);
  moelab::cli::AddDbCommand(app);
  moelab::cli::AddConfigCommand(app);
  moelab::cli::AddBenchCommand(app);
  moelab::cli::AddSweepCommand(app);
  moelab::cli::AddFitCommand(app);
  moelab::cli::AddPromoteCommand(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::RuntimeError& e) {
    return e.get_exit_code();  // the subcommand already explained itself
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const std::exception& e) {
    fmt::print(stderr, "moelab: error: {}\n", e.what());
    return 1;
  }
  return 0;
}
