// Launching one run on several processes: the layout a sweep asks for (ranks, and the config's
// dist.expert_parallel / dist.zero1), its validation with errors that name the spec location
// (runs[3].ranks), and the command lines that start it (mpirun locally, srun under Slurm).
// docs/distributed.md is the user's reference.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "sweeps/spec.h"

namespace moelab::sweeps {

// No sweep asks for more ranks per run than this (Slurm included): a typo guard.
constexpr int kMaxRanks = 65536;
// The most ranks one run may have when the local scheduler starts it with mpirun on this
// machine: max(16, 8 × cores). More belongs on a cluster (Slurm, or mpirun with a hostfile).
int LocalRankCap();

// A run's process layout. ranks is the world size (not part of the config hash: the trajectory
// does not depend on it); expert_parallel and zero1 come from the config's dist section.
struct Layout {
  int ranks = 1;
  int expert_parallel = 1;
  bool zero1 = false;
  int data_parallel() const { return expert_parallel > 0 ? ranks / expert_parallel : ranks; }
};

// The layout of `config` trained on `ranks` processes (dist.expert_parallel, dist.zero1).
Layout LayoutOf(const RunConfig& config, int ranks);

// Where the layout's numbers came from, for error messages: "runs[3].ranks", "ranks",
// "--ranks", "base.dist.expert_parallel", ...
struct LayoutOrigin {
  std::string ranks = "ranks";
  std::string expert_parallel = "dist.expert_parallel";
};

// Empty when `config` can be trained on `ranks` processes; otherwise why not, naming the
// origins: ranks < 1, ranks > kMaxRanks, a global batch that does not split over the ranks,
// world size not divisible by the expert-parallel size, more expert-parallel ranks than
// experts, experts that do not split evenly over them, expert parallelism of a dense model. (The
// trainer checks the same before training: MakeDistLayout in core/dist/layout.h.)
std::string LayoutError(const RunConfig& config, const Layout& layout,
                        const LayoutOrigin& origin = {});
inline std::string LayoutError(const RunConfig& config, int ranks,
                               const LayoutOrigin& origin = {}) {
  return LayoutError(config, LayoutOf(config, ranks), origin);
}

// The spec location that set `key` (a config path, or one of the launch keys ranks /
// expert_parallel / zero1) for the run with runs[] index runs_index (-1: no runs list).
// Checks runs[i], zip, grid, random, seeds, derived, set, the top-level key and base, in that
// order, and falls back to the key itself.
std::string KeyOrigin(const ojson& spec, const std::string& key, int runs_index);

// Sets every run of the sweep to `ranks` processes (`--ranks` of sweep run/resume) and checks
// each layout again; throws SpecError naming "--ranks" and the run.
void OverrideRanks(Sweep* sweep, int ranks);

// Was this binary built with the MPI communicator (CMake found MPI)?
bool BuildHasMpi();

// Empty, or why this process must not train: it was started as one of several ranks by
// mpirun/srun (moelab::LauncherWorldSize) but the build has no MPI. MakeWorldCommunicator in
// core/comm/communicator.h makes the same check when it picks the communicator.
std::string LaunchEnvironmentError();

// Checks, before the local scheduler starts anything, that the sweep's multi-rank runs can be
// started here: a build with MPI, `mpirun` on PATH, ranks within LocalRankCap(). Throws
// SpecError.
void CheckLocalLaunch(const Sweep& sweep);

// Finds an executable on PATH ("" when absent).
std::string FindOnPath(const std::string& name);

// The argv that starts one run of `ranks` processes locally. ranks == 1: train_args unchanged.
// Otherwise "mpirun -np N --bind-to none [--oversubscribe] -x OMP_NUM_THREADS -x
// OPENBLAS_NUM_THREADS [--allow-run-as-root] <train_args>"; --oversubscribe when N exceeds
// `cores`, --allow-run-as-root when `as_root`.
std::vector<std::string> MpirunCommand(int ranks, const std::vector<std::string>& train_args,
                                       int cores, bool as_root);

// Environment the launched process needs besides the thread counts: as root, Open MPI's
// OMPI_ALLOW_RUN_AS_ROOT and OMPI_ALLOW_RUN_AS_ROOT_CONFIRM.
std::vector<std::pair<std::string, std::string>> MpirunEnvironment(bool as_root);

}  // namespace moelab::sweeps
