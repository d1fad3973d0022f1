#include "core/comm/communicator.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <stdexcept>

#ifdef MOELAB_HAVE_MPI
#include "core/comm/mpi_communicator.h"
#endif

namespace moelab {

namespace {

[[noreturn]] void Unsupported(const Communicator& c, const char* op) {
  throw std::logic_error(fmt::format(
      "the {} communicator does not implement {} (needed by this layout)", c.kind(), op));
}

}  // namespace

void Communicator::ReduceScatterSum(float*, const size_t*) { Unsupported(*this, "ReduceScatter"); }
void Communicator::AllGatherV(float*, const size_t*) { Unsupported(*this, "AllGatherV"); }
void Communicator::Broadcast(float*, size_t, int) { Unsupported(*this, "Broadcast"); }
void Communicator::BroadcastBytes(void*, size_t, int) { Unsupported(*this, "BroadcastBytes"); }
std::unique_ptr<Communicator> Communicator::Split(int, int) { Unsupported(*this, "Split"); }
void Communicator::Abort(int exit_code) { std::_Exit(exit_code); }

void SingleProcessCommunicator::AllToAllV(const float* send, const size_t* send_counts, float* recv,
                                          const size_t*) {
  if (send != recv) std::copy(send, send + send_counts[0], recv);
}

std::unique_ptr<Communicator> SingleProcessCommunicator::Split(int, int) {
  return std::make_unique<SingleProcessCommunicator>();
}

int LauncherWorldSize() {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE"}) {
    const char* v = std::getenv(name);
    if (v && *v) {
      const int n = std::atoi(v);
      if (n >= 1) return n;
    }
  }
  return 1;
}

std::unique_ptr<Communicator> MakeWorldCommunicator() {
  const int n = LauncherWorldSize();
  if (n <= 1) return std::make_unique<SingleProcessCommunicator>();
#ifdef MOELAB_HAVE_MPI
  return MpiCommunicator::World();
#else
  throw std::runtime_error(fmt::format(
      "started as one of {} ranks (mpirun/srun), but this moelab was built without MPI: install "
      "libopenmpi-dev and rebuild (CMake option MOELAB_WITH_MPI), or run a single process",
      n));
#endif
}

}  // namespace moelab
