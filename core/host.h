// The name of this machine, as recorded with every run (runs.host) and compared against it when
// deciding whether a run's process can be signalled or checked from here. One definition, so
// the writer, the sweep runner, the trainer and the GUI agree (also on failure).
#pragma once

#include <unistd.h>

#include <string>

namespace moelab {

inline std::string HostName() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof(buf) - 1) != 0) return "unknown";
  return buf;
}

}  // namespace moelab
