// Collective operations the trainer needs, behind an interface so data- and expert-parallel
// training (MPI on CPU, NCCL on GPU) plug in without reshaping the model or trainer.
//
// Implementations: SingleProcessCommunicator (here), MpiCommunicator (core/dist/
// mpi_communicator.h, built when CMake finds MPI). A GPU NcclCommunicator implements the same
// virtuals. The collectives added for ZeRO-1, distributed Muon and sub-communicators have
// default implementations that throw, so an implementation that lacks them still compiles and
// fails with a clear message only when a layout needs them.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace moelab {

// What a communicator has moved and how long it waited, for the "share of step time spent in
// communication" numbers. bytes counts what this rank sent (a ring all-reduce of n bytes over W
// ranks sends 2·(W−1)/W·n).
struct CommStats {
  int64_t calls = 0;
  int64_t bytes = 0;
  double seconds = 0;
};

// Counts one collective into a CommStats for as long as it lives: a call, the bytes this rank
// sends, and the seconds until the scope ends (the collective returned).
class CommTimer {
 public:
  CommTimer(CommStats& stats, size_t bytes) : stats_(stats), t0_(std::chrono::steady_clock::now()) {
    ++stats_.calls;
    stats_.bytes += static_cast<int64_t>(bytes);
  }
  ~CommTimer() {
    stats_.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
  }
  CommTimer(const CommTimer&) = delete;
  CommTimer& operator=(const CommTimer&) = delete;

 private:
  CommStats& stats_;
  std::chrono::steady_clock::time_point t0_;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  // In-place reductions across ranks; the same call order on every rank.
  virtual void AllReduceSum(float* data, size_t n) = 0;
  virtual void AllReduceSum(double* data, size_t n) = 0;
  virtual void AllReduceSum(int64_t* data, size_t n) = 0;
  virtual void AllReduceMax(float* data, size_t n) = 0;
  // Variable-size exchange (expert parallelism: between MoE dispatch and combine).
  // send_counts[r] elements go to rank r; recv_counts[r] arrive from rank r.
  virtual void AllToAllV(const float* send, const size_t* send_counts, float* recv,
                         const size_t* recv_counts) = 0;
  virtual void Barrier() = 0;

  // ---- Collectives for ZeRO-1, distributed Muon and sub-communicators. ----
  // data holds world_size() consecutive chunks, chunk r of counts[r] elements. Sums chunk
  // rank() over all ranks into its place in data (the other chunks are left unspecified).
  virtual void ReduceScatterSum(float* data, const size_t* counts);
  // data holds world_size() consecutive chunks (counts[r] elements each); every rank's own chunk
  // rank() is copied to all ranks, in place.
  virtual void AllGatherV(float* data, const size_t* counts);
  // n elements of root's data copied to every rank.
  virtual void Broadcast(float* data, size_t n, int root);
  virtual void BroadcastBytes(void* data, size_t bytes, int root);
  // Overlap (issue 23): a float sum started now and completed by WaitAll, so gradient buckets
  // travel while the backward computes the rest; the result has the bits of AllReduceSum.
  // Progress lets started sums advance (MPI moves non-blocking collectives only inside MPI
  // calls). Defaults: sum at once, nothing pending.
  virtual void StartAllReduceSum(float* data, size_t n) { AllReduceSum(data, n); }
  virtual void Progress() {}
  virtual void WaitAll() {}
  // A communicator over the ranks passing the same color, ordered by key (MPI_Comm_split).
  virtual std::unique_ptr<Communicator> Split(int color, int key);
  // Ends every rank of the job (a failure on one rank must not leave the others waiting in a
  // collective). Returns only for a single process.
  virtual void Abort(int exit_code);
  // "single", "mpi", "nccl".
  virtual std::string kind() const { return "unknown"; }

  const CommStats& stats() const { return stats_; }
  void ResetStats() { stats_ = CommStats{}; }

 protected:
  CommStats stats_;
};

// One process: every collective is the identity.
class SingleProcessCommunicator : public Communicator {
 public:
  int rank() const override { return 0; }
  int world_size() const override { return 1; }
  void AllReduceSum(float*, size_t) override {}
  void AllReduceSum(double*, size_t) override {}
  void AllReduceSum(int64_t*, size_t) override {}
  void AllReduceMax(float*, size_t) override {}
  void AllToAllV(const float* send, const size_t* send_counts, float* recv, const size_t*) override;
  void Barrier() override {}
  void ReduceScatterSum(float*, const size_t*) override {}
  void AllGatherV(float*, const size_t*) override {}
  void Broadcast(float*, size_t, int) override {}
  void BroadcastBytes(void*, size_t, int) override {}
  std::unique_ptr<Communicator> Split(int, int) override;
  void Abort(int) override {}
  std::string kind() const override { return "single"; }
};

// The world size the launcher announced in the environment (OMPI_COMM_WORLD_SIZE from mpirun,
// PMI_SIZE from MPICH/Hydra or srun --mpi=pmi2), or 1.
int LauncherWorldSize();

// The communicator for this process: an MpiCommunicator when the launcher announced more than
// one rank (initialising MPI), else a SingleProcessCommunicator. Throws std::runtime_error when
// started by mpirun with several ranks in a build without MPI.
std::unique_ptr<Communicator> MakeWorldCommunicator();

}  // namespace moelab
