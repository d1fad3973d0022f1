// The trainer processes a local sweep starts (`moelab train` children): whether one is still
// alive, which executable to start, and the line of its log that says why it ended.
#pragma once

#include <sys/types.h>

#include <string>

namespace moelab::sweeps {

// True while `pid` runs. kill(pid, 0) also succeeds for a zombie, which an orphaned trainer stays
// until its new parent reaps it (some container inits never do): a zombie counts as dead.
bool ProcessAlive(pid_t pid);

// This process's own executable (/proc/self/exe), or "moelab" when it cannot be read.
std::string SelfExe();

// The last non-empty line of a trainer's log ("" when the file is missing or empty).
std::string LastLine(const std::string& path);

}  // namespace moelab::sweeps
