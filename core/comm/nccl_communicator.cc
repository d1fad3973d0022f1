#include "core/comm/nccl_communicator.h"

#include <exception>
#include <stdexcept>

#if MOELAB_HAVE_NCCL && MOELAB_HAVE_MPI && MOELAB_HAVE_CUDA
#define MOELAB_NCCL_BUILT 1
#include <mpi.h>
#include <nccl.h>

#include <vector>

#include "core/comm/collective_wait.h"
#include "kernels/cuda/device.h"
#endif

namespace moelab {

#if MOELAB_NCCL_BUILT

namespace {

void CheckNccl(ncclResult_t r, const char* what) {
  if (r != ncclSuccess) {
    throw std::runtime_error(std::string("NCCL error in ") + what + ": " + ncclGetErrorString(r));
  }
}
#define MOELAB_NCCL(call) CheckNccl((call), #call)

bool IsDevicePointer(const void* p) {
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
}

}  // namespace

struct NcclCommunicator::Impl {
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;   // NCCL's own, non-blocking: no implicit order with others
  cudaStream_t compute = nullptr;  // where the data is written (legacy default stream)
  cudaEvent_t written = nullptr;   // recorded on `compute` before every collective
  int rank = 0, size = 1, device = 0;
  bool split = false;  // a sub-communicator (Split): its barrier cannot be MPI_COMM_WORLD's
  cuda::DeviceBuffer<unsigned char> staging;  // for host pointers
  double timeout_s = 1800;                    // CollectiveTimeoutSeconds(), read at Create

  // Waits for what is queued on the NCCL stream, watching NCCL's asynchronous errors and the
  // time-out (collective_wait.h) where cudaStreamSynchronize would wait forever for a peer that
  // died; on either the communicator is aborted (ending its pending collectives, as NCCL's docs
  // prescribe after an asynchronous error) and the wait throws naming `what`.
  void Finish(const char* what) {
    try {
      WaitWatched(
          [&](std::string* why) {
            const cudaError_t q = cudaStreamQuery(stream);
            if (q == cudaSuccess) return CollectiveState::kDone;
            if (q != cudaErrorNotReady) {
              *why = cudaGetErrorString(q);
              return CollectiveState::kFailed;
            }
            // Not an error, but kept as the thread's last one: cleared, or the next launch check
            // would report it (PyTorch's stream query does the same).
            cudaGetLastError();
            ncclResult_t async = ncclSuccess;
            const ncclResult_t r = ncclCommGetAsyncError(comm, &async);
            if (r != ncclSuccess || (async != ncclSuccess && async != ncclInProgress)) {
              *why = ncclGetErrorString(r != ncclSuccess ? r : async);
              return CollectiveState::kFailed;
            }
            return CollectiveState::kPending;
          },
          timeout_s, std::string("NCCL ") + what + " (rank " + std::to_string(rank) + ")");
    } catch (...) {
      if (comm) ncclCommAbort(comm);
      comm = nullptr;
      throw;
    }
  }

  unsigned char* Stage(size_t bytes) {
    if (staging.size() < bytes) {
      staging.Resize(bytes);
      // Resize allocates without a fill (kernels/cuda/device.h): nothing is queued that could
      // land after the host data is copied in. The wait stays for the rare growth (the first
      // host collectives, a checkpoint gather): the reallocation happens on an idle device.
      MOELAB_CUDA_CHECK(cudaDeviceSynchronize());
    }
    return staging.data();
  }

  // Makes the NCCL stream wait for everything queued on the compute stream so far. Without it
  // the all-reduce of the gradients could start while the backward's last kernels (queued
  // asynchronously on the default stream) are still writing them: a non-blocking stream does not
  // synchronise with the legacy default stream.
  void AfterCompute() {
    MOELAB_CUDA_CHECK(cudaEventRecord(written, compute));
    MOELAB_CUDA_CHECK(cudaStreamWaitEvent(stream, written, 0));
  }

  // In-place all-reduce of n elements of `type` at p (device or host memory). Counted into
  // stats as what a ring all-reduce sends from each rank: 2·(W−1)/W of the elements.
  template <typename T>
  void AllReduce(CommStats& stats, T* p, size_t n, ncclDataType_t type, ncclRedOp_t op) {
    const size_t w = static_cast<size_t>(size), elem = sizeof(T);
    CommTimer t(stats, 2 * n * elem * (w - 1) / w);
    if (n == 0) return;
    AfterCompute();
    if (IsDevicePointer(p)) {
      MOELAB_NCCL(ncclAllReduce(p, p, n, type, op, comm, stream));
      Finish("all-reduce");
      return;
    }
    unsigned char* d = Stage(n * elem);
    MOELAB_CUDA_CHECK(cudaMemcpyAsync(d, p, n * elem, cudaMemcpyHostToDevice, stream));
    MOELAB_NCCL(ncclAllReduce(d, d, n, type, op, comm, stream));
    MOELAB_CUDA_CHECK(cudaMemcpyAsync(p, d, n * elem, cudaMemcpyDeviceToHost, stream));
    Finish("all-reduce");
  }
  // Chunk r of data (counts[r] floats) through fn(chunk, count, r) inside one NCCL group; host
  // memory goes through the staging buffer. Counted into stats as MpiCommunicator counts its
  // reduce-scatter and all-gather: the elements of the chunks other ranks own.
  template <typename Fn>
  void Chunked(CommStats& stats, float* data, const size_t* counts, Fn fn) {
    Impl& I = *this;
    size_t total = 0;
    for (int r = 0; r < I.size; ++r) total += counts[r];
    CommTimer t(stats, (total - counts[I.rank]) * sizeof(float));
    if (total == 0) return;
    I.AfterCompute();
    const bool device = IsDevicePointer(data);
    float* d = device ? data : reinterpret_cast<float*>(I.Stage(total * sizeof(float)));
    if (!device) {
      MOELAB_CUDA_CHECK(
          cudaMemcpyAsync(d, data, total * sizeof(float), cudaMemcpyHostToDevice, I.stream));
    }
    MOELAB_NCCL(ncclGroupStart());
    size_t off = 0;
    for (int r = 0; r < I.size; ++r) {
      if (counts[r]) fn(d + off, counts[r], r);
      off += counts[r];
    }
    MOELAB_NCCL(ncclGroupEnd());
    if (!device) {
      MOELAB_CUDA_CHECK(
          cudaMemcpyAsync(data, d, total * sizeof(float), cudaMemcpyDeviceToHost, I.stream));
    }
    I.Finish("reduce/broadcast by chunks");
  }
};

NcclCommunicator::NcclCommunicator() : impl_(std::make_unique<Impl>()) {}

bool NcclCommunicator::Available(std::string* why) {
  if (why) why->clear();
  return true;
}

int NcclCommunicator::UseNodeLocalDevice() {
  int inited = 0;
  MPI_Initialized(&inited);
  if (!inited) {
    int provided = 0;
    MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided);
  }
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  // One GPU per process: the node-local rank picks it.
  MPI_Comm local;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &local);
  int local_rank = 0;
  MPI_Comm_rank(local, &local_rank);
  MPI_Comm_free(&local);
  int devices = 0;
  MOELAB_CUDA_CHECK(cudaGetDeviceCount(&devices));
  if (devices == 0) throw std::runtime_error("NcclCommunicator: no CUDA device");
  const int device = local_rank % devices;
  MOELAB_CUDA_CHECK(cudaSetDevice(device));
  return device;
}

std::unique_ptr<NcclCommunicator> NcclCommunicator::Create() {
  const double timeout_s = CollectiveTimeoutSeconds();  // a bad value stops before any collective
  const int device = UseNodeLocalDevice();
  std::unique_ptr<NcclCommunicator> c(new NcclCommunicator());
  Impl& I = *c->impl_;
  MPI_Comm_rank(MPI_COMM_WORLD, &I.rank);
  MPI_Comm_size(MPI_COMM_WORLD, &I.size);
  I.device = device;
  I.timeout_s = timeout_s;
  MOELAB_CUDA_CHECK(cudaStreamCreateWithFlags(&I.stream, cudaStreamNonBlocking));
  MOELAB_CUDA_CHECK(cudaEventCreateWithFlags(&I.written, cudaEventDisableTiming));
  ncclUniqueId id;
  if (I.rank == 0) MOELAB_NCCL(ncclGetUniqueId(&id));
  MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
  MOELAB_NCCL(ncclCommInitRank(&I.comm, I.size, id, I.rank));
  return c;
}

// ncclCommSplit: collective over every rank of this communicator, in the same order. The new
// communicator has its own stream and event, on this rank's device.
std::unique_ptr<Communicator> NcclCommunicator::Split(int color, int key) {
  Impl& I = *impl_;
  I.Finish("wait before split");
  std::unique_ptr<NcclCommunicator> c(new NcclCommunicator());
  Impl& S = *c->impl_;
  MOELAB_NCCL(ncclCommSplit(I.comm, color, key, &S.comm, nullptr));
  if (S.comm == nullptr) throw std::runtime_error("NcclCommunicator::Split: no communicator");
  MOELAB_NCCL(ncclCommUserRank(S.comm, &S.rank));
  MOELAB_NCCL(ncclCommCount(S.comm, &S.size));
  S.device = I.device;
  S.compute = I.compute;
  S.split = true;
  S.timeout_s = I.timeout_s;
  MOELAB_CUDA_CHECK(cudaStreamCreateWithFlags(&S.stream, cudaStreamNonBlocking));
  MOELAB_CUDA_CHECK(cudaEventCreateWithFlags(&S.written, cudaEventDisableTiming));
  return c;
}

NcclCommunicator::~NcclCommunicator() {
  // ncclCommDestroy (with the ncclCommFinalize it calls) is an intra-node collective: every rank
  // on the node must call it, or it hangs (NCCL's API docs, ncclCommDestroy). While an exception
  // unwinds the trainer on this rank, the other ranks wait in a collective and never will, so
  // destroying here would hang this rank before it reaches MPI_Abort (cli/train_command.cc ends
  // the job on a failure). The communicator is left to the end of the process instead.
  if (std::uncaught_exceptions() > 0) return;
  if (impl_->comm) ncclCommDestroy(impl_->comm);
  if (impl_->written) cudaEventDestroy(impl_->written);
  if (impl_->stream) cudaStreamDestroy(impl_->stream);
}

void NcclCommunicator::SetComputeStream(CUstream_st* stream) { impl_->compute = stream; }

int NcclCommunicator::rank() const { return impl_->rank; }
int NcclCommunicator::world_size() const { return impl_->size; }
int NcclCommunicator::device() const { return impl_->device; }

void NcclCommunicator::AllReduceSum(float* data, size_t n) {
  impl_->AllReduce(stats_, data, n, ncclFloat32, ncclSum);
}
void NcclCommunicator::AllReduceSum(double* data, size_t n) {
  impl_->AllReduce(stats_, data, n, ncclFloat64, ncclSum);
}
void NcclCommunicator::AllReduceSum(int64_t* data, size_t n) {
  impl_->AllReduce(stats_, data, n, ncclInt64, ncclSum);
}
void NcclCommunicator::AllReduceMax(float* data, size_t n) {
  impl_->AllReduce(stats_, data, n, ncclFloat32, ncclMax);
}

// Point-to-point sends/receives grouped into one NCCL call. Device pointers only (the expert-
// parallel exchange moves activations that live on the GPU).
void NcclCommunicator::AllToAllV(const float* send, const size_t* send_counts, float* recv,
                                 const size_t* recv_counts) {
  Impl& I = *impl_;
  size_t sent = 0, send_total = 0, recv_total = 0;
  for (int r = 0; r < I.size; ++r) {
    sent += r == I.rank ? 0 : send_counts[r];
    send_total += send_counts[r];
    recv_total += recv_counts[r];
  }
  // Only a buffer that moves data must be on the device: a rank that receives no rows passes
  // the expert exchange's still unallocated buffer (nullptr), and a throw here, on one rank
  // only, would leave the others waiting in the group below forever.
  if ((send_total > 0 && !IsDevicePointer(send)) || (recv_total > 0 && !IsDevicePointer(recv))) {
    throw std::invalid_argument("NcclCommunicator::AllToAllV needs device pointers");
  }
  CommTimer t(stats_, sent * sizeof(float));
  size_t so = 0, ro = 0;
  I.AfterCompute();
  MOELAB_NCCL(ncclGroupStart());
  for (int r = 0; r < I.size; ++r) {
    if (send_counts[r])
      MOELAB_NCCL(ncclSend(send + so, send_counts[r], ncclFloat32, r, I.comm, I.stream));
    if (recv_counts[r])
      MOELAB_NCCL(ncclRecv(recv + ro, recv_counts[r], ncclFloat32, r, I.comm, I.stream));
    so += send_counts[r];
    ro += recv_counts[r];
  }
  MOELAB_NCCL(ncclGroupEnd());
  I.Finish("all-to-all");
}

void NcclCommunicator::ReduceScatterSum(float* data, const size_t* counts) {
  Impl& I = *impl_;
  I.Chunked(stats_, data, counts, [&](float* chunk, size_t n, int root) {
    MOELAB_NCCL(ncclReduce(chunk, chunk, n, ncclFloat32, ncclSum, root, I.comm, I.stream));
  });
}

void NcclCommunicator::AllGatherV(float* data, const size_t* counts) {
  Impl& I = *impl_;
  I.Chunked(stats_, data, counts, [&](float* chunk, size_t n, int root) {
    MOELAB_NCCL(ncclBroadcast(chunk, chunk, n, ncclFloat32, root, I.comm, I.stream));
  });
}

void NcclCommunicator::Barrier() {
  Impl& I = *impl_;
  I.Finish("wait before barrier");
  if (!I.split) {
    MPI_Barrier(MPI_COMM_WORLD);
    return;
  }
  // Only this group's ranks take part: a one-element all-reduce, waited for.
  float* one = reinterpret_cast<float*>(I.Stage(sizeof(float)));
  MOELAB_NCCL(ncclAllReduce(one, one, 1, ncclFloat32, ncclSum, I.comm, I.stream));
  I.Finish("barrier");
}

void NcclCommunicator::Abort(int exit_code) { MPI_Abort(MPI_COMM_WORLD, exit_code); }

#else  // NCCL, MPI or CUDA missing from this build

struct NcclCommunicator::Impl {};
NcclCommunicator::NcclCommunicator() = default;
NcclCommunicator::~NcclCommunicator() = default;

bool NcclCommunicator::Available(std::string* why) {
  if (why) {
    *why =
        "this moelab was built without NCCL (needs the CUDA toolkit's NCCL and MPI at "
        "configure time)";
  }
  return false;
}
int NcclCommunicator::UseNodeLocalDevice() {
  std::string why;
  Available(&why);
  throw std::runtime_error(why);
}
std::unique_ptr<NcclCommunicator> NcclCommunicator::Create() {
  std::string why;
  Available(&why);
  throw std::runtime_error(why);
}
int NcclCommunicator::rank() const { return 0; }
int NcclCommunicator::world_size() const { return 1; }
int NcclCommunicator::device() const { return 0; }
void NcclCommunicator::AllReduceSum(float*, size_t) {}
void NcclCommunicator::AllReduceSum(double*, size_t) {}
void NcclCommunicator::AllReduceSum(int64_t*, size_t) {}
void NcclCommunicator::AllReduceMax(float*, size_t) {}
void NcclCommunicator::AllToAllV(const float*, const size_t*, float*, const size_t*) {}
void NcclCommunicator::ReduceScatterSum(float*, const size_t*) {}
void NcclCommunicator::AllGatherV(float*, const size_t*) {}
void NcclCommunicator::Barrier() {}
std::unique_ptr<Communicator> NcclCommunicator::Split(int, int) {
  std::string why;
  Available(&why);
  throw std::runtime_error(why);
}
void NcclCommunicator::Abort(int) {}
void NcclCommunicator::SetComputeStream(CUstream_st*) {}

#endif

}  // namespace moelab
