// What the Sweeps view does, without ImGui: checks a spec's text as the user types (with the
// same parsing and validation as `moelab sweep plan`, by calling sweeps/), and starts or signals
// the processes that do the work. The GUI never trains, writes runs or decides what to resume:
// `moelab sweep run|resume` and `moelab train` do, and their locks and dedupe stay the authority.
//
// Launched processes are detached (double fork + setsid): they outlive the GUI, are never its
// zombies, and each launch is recorded as one JSON line in <db>.sweeps/gui-launches.jsonl with
// its command line, pid and log file.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace moelab::gui {

struct SpecCheck {
  bool ok = false;
  std::string name;          // the sweep's name (also when invalid, when known)
  std::string error;         // the full message of sweeps::SpecError / ConfigError
  std::string error_path;    // where: a JSON path ("grid.moe.experts_total"), "line 3, column 7"
  std::string error_reason;  // the message after the path
  int line = 0, column = 0;  // JSON syntax errors: where the parser stopped (1-based)
  int runs = 0, unique = 0;
  std::vector<std::string> warnings;
  std::string plan;  // `moelab sweep plan`'s table (with times once the rate is measured)
  int parallel = 1;  // the plan's runs at once
  // The time estimate: calibrating (measured in the background, times not shown yet), or how
  // the rate was measured ("" without a calibrator).
  bool calibrating = false;
  std::string time_estimate;
};

class PlanCalibrator;  // gui/plan_calibration.h

// Parses and expands `text` as the spec file `path` would be (a relative "base" is read next to
// it). db_path (optional): mark runs already done there in the plan. With a calibrator the plan
// has the estimated times of `moelab sweep plan --parallel N` once the calibrator has measured
// the sweep's largest run (in the background; until then the plan has none and `calibrating`).
SpecCheck CheckSpecText(const std::string& text, const std::string& path,
                        const std::string& db_path = "", int parallel = 1,
                        PlanCalibrator* calibrator = nullptr);
// Splits a SpecError message into (path, reason); exposed for tests.
void SplitSpecError(const std::string& message, std::string* path, std::string* reason);

// The `moelab` binary: next to this executable (build/bin), else the one on PATH.
std::string MoelabBinary();

struct Launched {
  int pid = -1;       // of the detached process; -1 when it could not start
  std::string error;  // why it could not start
  std::string log;    // its stdout+stderr
};
// Starts argv detached, in its own session, stdout/stderr to log_path, and appends the record
// to <db>.sweeps/gui-launches.jsonl (action: "launch", "resume", "rerun", "resume-run").
Launched LaunchDetached(const std::vector<std::string>& argv, const std::string& db_path,
                        const std::string& action, const std::string& log_path);

// The pid of the live `moelab sweep run|resume` holding the sweep's lock, or -1.
int SweepRunnerPid(const std::string& db_path, const std::string& sweep_name);
bool ProcessAlive(int pid);
// SIGTERM: a sweep runner asks its trainers to checkpoint and stop; a trainer checkpoints and
// records "stopped". Returns false (with *error) when the process is gone or not ours.
bool Terminate(int pid, std::string* error);

// Appends a record of an action that starts nothing (a stop) to gui-launches.jsonl.
void RecordAction(const std::string& db_path, const std::string& action, int pid,
                  const std::string& target);
// The records of gui-launches.jsonl (one JSON object per line), oldest first.
std::vector<std::string> LaunchRecords(const std::string& db_path);

}  // namespace moelab::gui
