// The lifecycle state of one training run, as the trainer reports it and as the runs.status
// column of the database stores it. One enum, so no layer compares status strings.
// Header-only: db/ uses it without linking the engine library (see db/CMakeLists.txt).
#pragma once

#include <optional>
#include <ostream>
#include <stdexcept>
#include <string>
#include <string_view>

namespace moelab {

// Every value the runs.status column can hold (db/schema.cc checks the same list).
enum class RunStatus { kQueued, kRunning, kDone, kFailed, kDiverged, kStopped };

inline constexpr RunStatus kAllRunStatuses[] = {RunStatus::kQueued,   RunStatus::kRunning,
                                                RunStatus::kDone,     RunStatus::kFailed,
                                                RunStatus::kDiverged, RunStatus::kStopped};

// The stored spelling: "queued", "running", "done", "failed", "diverged", "stopped".
inline const char* ToString(RunStatus status) {
  switch (status) {
    case RunStatus::kQueued:
      return "queued";
    case RunStatus::kRunning:
      return "running";
    case RunStatus::kDone:
      return "done";
    case RunStatus::kFailed:
      return "failed";
    case RunStatus::kDiverged:
      return "diverged";
    case RunStatus::kStopped:
      return "stopped";
  }
  return "unknown";
}

// The inverse of ToString, or nullopt for an unknown value (input read from files).
inline std::optional<RunStatus> TryParseRunStatus(std::string_view text) {
  for (RunStatus s : kAllRunStatuses) {
    if (text == ToString(s)) return s;
  }
  return std::nullopt;
}

// The inverse of ToString; throws std::invalid_argument naming the value and the known ones.
inline RunStatus ParseRunStatus(std::string_view text) {
  if (auto s = TryParseRunStatus(text)) return *s;
  std::string known;
  for (RunStatus s : kAllRunStatuses) known += std::string(known.empty() ? "" : ", ") + ToString(s);
  throw std::invalid_argument("unknown run status '" + std::string(text) + "' (known: " + known +
                              ")");
}

// Done, failed, diverged and stopped: the trainer is over (a stopped run may be resumed).
inline bool IsTerminal(RunStatus status) {
  return status != RunStatus::kQueued && status != RunStatus::kRunning;
}

// Prints ToString(status), so test failures show the name rather than a number.
inline std::ostream& operator<<(std::ostream& os, RunStatus status) {
  return os << ToString(status);
}

}  // namespace moelab
