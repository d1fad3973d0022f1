// Communicator over MPI (OpenMPI or MPICH; started by mpirun or srun). Built only when CMake
// finds MPI (MOELAB_HAVE_MPI); MakeWorldCommunicator() picks it when the launcher announced more
// than one rank, so a single process never initialises MPI.
//
// Floating-point sums are deterministic and bitwise identical on every rank whatever algorithm
// the MPI library picks: AllReduceSum = reduce-scatter (an all-to-all of chunks, each rank adding
// the W copies of its chunk in rank order 0..W−1) + all-gather (a copy). That costs what a ring
// all-reduce costs (2·(W−1)/W·n elements sent per rank) and keeps replicated parameters
// identical across data-parallel ranks without ever broadcasting them.
#pragma once

#ifdef MOELAB_HAVE_MPI

#include <mpi.h>

#include <deque>
#include <memory>
#include <vector>

#include "core/comm/communicator.h"

namespace moelab {

class MpiCommunicator : public Communicator {
 public:
  // MPI_COMM_WORLD, initialising MPI (MPI_THREAD_FUNNELED) if needed; finalises it when the
  // returned object is destroyed (only one world object may exist at a time).
  static std::unique_ptr<MpiCommunicator> World();
  ~MpiCommunicator() override;
  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;

  int rank() const override { return rank_; }
  int world_size() const override { return size_; }
  void AllReduceSum(float* data, size_t n) override;
  void AllReduceSum(double* data, size_t n) override;
  void AllReduceSum(int64_t* data, size_t n) override;
  void AllReduceMax(float* data, size_t n) override;
  void AllToAllV(const float* send, const size_t* send_counts, float* recv,
                 const size_t* recv_counts) override;
  void Barrier() override;
  void ReduceScatterSum(float* data, const size_t* counts) override;
  void AllGatherV(float* data, const size_t* counts) override;
  void Broadcast(float* data, size_t n, int root) override;
  void BroadcastBytes(void* data, size_t bytes, int root) override;
  void StartAllReduceSum(float* data, size_t n) override;
  void Progress() override;
  void WaitAll() override;
  std::unique_ptr<Communicator> Split(int color, int key) override;
  [[noreturn]] void Abort(int exit_code) override;
  std::string kind() const override { return "mpi"; }

  MPI_Comm comm() const { return comm_; }

 private:
  MpiCommunicator(MPI_Comm comm, bool owns_comm, bool finalize);
  template <typename T>
  void ReduceScatterT(T* data, const size_t* counts, MPI_Datatype type);
  template <typename T>
  void AllGatherT(T* data, const size_t* counts, MPI_Datatype type);
  template <typename T>
  void AllReduceSumT(T* data, size_t n, MPI_Datatype type);

  MPI_Comm comm_;
  bool owns_comm_;
  bool finalize_;
  int rank_ = 0, size_ = 1;
  std::vector<int> icounts_, idispls_, rcounts_, rdispls_;  // scratch for the v-collectives
  std::vector<char> scratch_;
  // Started sums: the reduce-scatter's all-to-all in flight, then (WaitAll) the rank-order sum
  // and the all-gather, as AllReduceSum does them.
  struct PendingSum {
    float* data = nullptr;
    std::vector<int> counts, displs, rcounts, rdispls;
    std::vector<float> recv;
    MPI_Request request = MPI_REQUEST_NULL;
  };
  std::deque<PendingSum> pending_;
};

}  // namespace moelab

#endif  // MOELAB_HAVE_MPI
