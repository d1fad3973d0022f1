// Communicator over NCCL for train.device "cuda" (docs/cuda.md): one process per GPU, started by
// mpirun; MPI only bootstraps (rank 0's ncclUniqueId is broadcast over MPI_COMM_WORLD) and
// provides the barrier. Collectives take device pointers (gradients stay on the GPU); host
// pointers (the per-step statistics) are staged through a device buffer. Every collective is
// ordered after the work queued so far on the compute stream (SetComputeStream). Compiled when NCCL
// and MPI are both found (MOELAB_HAVE_NCCL); otherwise Create() throws with the reason.
#pragma once

#include <memory>
#include <string>

#include "core/comm/communicator.h"

struct CUstream_st;  // cudaStream_t without the CUDA headers (this header builds without them)

namespace moelab {

class NcclCommunicator : public Communicator {
 public:
  // Collective: every rank of MPI_COMM_WORLD calls it. Initialises MPI if nobody has. Makes this
  // process's CUDA device the GPU of its node-local rank (mod the visible GPUs: one GPU under two
  // ranks is refused by ncclCommInitRank) and returns it. Call it before anything creates a CUDA
  // context (cudaMemGetInfo, cuBLAS handles, allocations): those act on the current device, GPU 0
  // until then, and every rank would leave a context there. Throws std::runtime_error when
  // NCCL/MPI are not built in or there is no GPU.
  static int UseNodeLocalDevice();
  // Collective: every rank of MPI_COMM_WORLD calls it. Initialises MPI if nobody has. Uses
  // UseNodeLocalDevice's GPU. Throws std::runtime_error when NCCL/MPI are not built in or fail.
  static std::unique_ptr<NcclCommunicator> Create();
  // Whether this build has NCCL; `why` gets the reason when not.
  static bool Available(std::string* why);
  ~NcclCommunicator() override;

  int rank() const override;
  int world_size() const override;
  void AllReduceSum(float* data, size_t n) override;
  void AllReduceSum(double* data, size_t n) override;
  void AllReduceSum(int64_t* data, size_t n) override;
  void AllReduceMax(float* data, size_t n) override;
  void AllToAllV(const float* send, const size_t* send_counts, float* recv,
                 const size_t* recv_counts) override;
  // ZeRO-1 (core/dist/zero.h): per-chunk ncclReduce / ncclBroadcast rooted at the chunk's
  // owner, grouped into one NCCL call (NCCL's own reduce-scatter and all-gather need equal
  // chunks). Device or host pointers.
  void ReduceScatterSum(float* data, const size_t* counts) override;
  void AllGatherV(float* data, const size_t* counts) override;
  void Barrier() override;
  // A sub-communicator (ncclCommSplit) over the ranks passing the same color, ordered by key:
  // the expert-parallel and data-parallel groups of dist.expert_parallel. Same device.
  std::unique_ptr<Communicator> Split(int color, int key) override;
  void Abort(int exit_code) override;  // MPI_Abort
  std::string kind() const override { return "nccl"; }
  int device() const;  // the CUDA device this rank uses
  // The stream whose work every collective waits for (an event recorded on it, waited on by
  // the NCCL stream), so a collective never reads data still being written. Default: the
  // legacy default stream (nullptr), where the CUDA backend and the device optimizers queue all
  // work.
  void SetComputeStream(CUstream_st* stream);

 private:
  NcclCommunicator();
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace moelab
