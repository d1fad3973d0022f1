// Helpers of the distributed tests: run moelab (or a worker) under mpirun --oversubscribe.
#pragma once

#include <sys/wait.h>

#include <cstdlib>
#include <string>

#include "tests/common/test_util.h"

namespace moelab::disttest {

using test::BinDir;

inline bool HaveMpirun() { return std::system("command -v mpirun >/dev/null 2>&1") == 0; }

// "mpirun -np N --oversubscribe ..." with what OpenMPI needs as root in a container; np = 0
// runs the command without mpirun.
inline std::string Mpirun(int np) {
  if (np == 0) return "";
  return "env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 "
         "OMPI_MCA_rmaps_base_oversubscribe=1 "
         "mpirun --oversubscribe --bind-to none -np " +
         std::to_string(np) + " ";
}

// Exit status of a shell command (-1 when it did not exit normally).
inline int Shell(const std::string& cmd) {
  const int rc = std::system(cmd.c_str());
  if (rc == -1 || !WIFEXITED(rc)) return -1;
  return WEXITSTATUS(rc);
}

}  // namespace moelab::disttest
