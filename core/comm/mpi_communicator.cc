#include "core/comm/mpi_communicator.h"

#ifdef MOELAB_HAVE_MPI

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstring>
#include <stdexcept>

namespace moelab {

namespace {

using Clock = std::chrono::steady_clock;

void Check(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  throw std::runtime_error(fmt::format("{} failed: {}", what, std::string(msg, len)));
}

int ToInt(size_t n, const char* what) {
  if (n > static_cast<size_t>(INT_MAX)) {
    throw std::runtime_error(
        fmt::format("{}: {} elements exceed one MPI call's limit; use smaller buckets", what, n));
  }
  return static_cast<int>(n);
}

// Times one collective into stats.
// Even split of n elements into w chunks (the first n % w one larger).
std::vector<size_t> EvenCounts(size_t n, int w) {
  std::vector<size_t> c(w, n / w);
  for (size_t r = 0; r < n % w; ++r) ++c[r];
  return c;
}

}  // namespace

std::unique_ptr<MpiCommunicator> MpiCommunicator::World() {
  int initialized = 0;
  MPI_Initialized(&initialized);
  bool finalize = false;
  if (!initialized) {
    int provided = 0;
    Check(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided), "MPI_Init_thread");
    finalize = true;
  }
  // Errors come back as return codes (turned into exceptions) instead of aborting silently.
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  return std::unique_ptr<MpiCommunicator>(new MpiCommunicator(MPI_COMM_WORLD, false, finalize));
}

MpiCommunicator::MpiCommunicator(MPI_Comm comm, bool owns_comm, bool finalize)
    : comm_(comm), owns_comm_(owns_comm), finalize_(finalize) {
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
}

MpiCommunicator::~MpiCommunicator() {
  if (owns_comm_) MPI_Comm_free(&comm_);
  if (finalize_) {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Finalize();
  }
}

template <typename T>
void MpiCommunicator::ReduceScatterT(T* data, const size_t* counts, MPI_Datatype type) {
  const int w = size_;
  icounts_.assign(w, 0);
  idispls_.assign(w, 0);
  rcounts_.assign(w, 0);
  rdispls_.assign(w, 0);
  size_t off = 0, total = 0;
  for (int r = 0; r < w; ++r) total += counts[r];
  const size_t mine = counts[rank_];
  for (int r = 0; r < w; ++r) {
    icounts_[r] = ToInt(counts[r], "ReduceScatterSum");
    idispls_[r] = ToInt(off, "ReduceScatterSum");
    rcounts_[r] = ToInt(mine, "ReduceScatterSum");
    rdispls_[r] = ToInt(r * mine, "ReduceScatterSum");
    off += counts[r];
  }
  CommTimer t(stats_, (total - mine) * sizeof(T));
  scratch_.resize(w * mine * sizeof(T));
  T* recv = reinterpret_cast<T*>(scratch_.data());
  Check(MPI_Alltoallv(data, icounts_.data(), idispls_.data(), type, recv, rcounts_.data(),
                      rdispls_.data(), type, comm_),
        "MPI_Alltoallv (reduce-scatter)");
  // Rank order 0..W−1, the same on every rank: deterministic whatever MPI does internally.
  T* out = data + idispls_[rank_];
  std::memcpy(out, recv, mine * sizeof(T));
  for (int r = 1; r < w; ++r) {
    const T* src = recv + r * mine;
    for (size_t i = 0; i < mine; ++i) out[i] += src[i];
  }
}

template <typename T>
void MpiCommunicator::AllGatherT(T* data, const size_t* counts, MPI_Datatype type) {
  const int w = size_;
  icounts_.assign(w, 0);
  idispls_.assign(w, 0);
  size_t off = 0, total = 0;
  for (int r = 0; r < w; ++r) {
    icounts_[r] = ToInt(counts[r], "AllGatherV");
    idispls_[r] = ToInt(off, "AllGatherV");
    off += counts[r];
    total += counts[r];
  }
  CommTimer t(stats_, (total - counts[rank_]) * sizeof(T));
  Check(MPI_Allgatherv(MPI_IN_PLACE, 0, type, data, icounts_.data(), idispls_.data(), type, comm_),
        "MPI_Allgatherv");
}

template <typename T>
void MpiCommunicator::AllReduceSumT(T* data, size_t n, MPI_Datatype type) {
  if (size_ == 1 || n == 0) return;
  const std::vector<size_t> counts = EvenCounts(n, size_);
  ReduceScatterT(data, counts.data(), type);
  AllGatherT(data, counts.data(), type);
}

void MpiCommunicator::AllReduceSum(float* data, size_t n) { AllReduceSumT(data, n, MPI_FLOAT); }
void MpiCommunicator::AllReduceSum(double* data, size_t n) { AllReduceSumT(data, n, MPI_DOUBLE); }

void MpiCommunicator::AllReduceSum(int64_t* data, size_t n) {
  if (n == 0) return;
  // Integer sums are exact in any order.
  CommTimer t(stats_, 2 * n * sizeof(int64_t) * (size_ - 1) / size_);
  Check(MPI_Allreduce(MPI_IN_PLACE, data, ToInt(n, "AllReduceSum"), MPI_INT64_T, MPI_SUM, comm_),
        "MPI_Allreduce");
}

void MpiCommunicator::AllReduceMax(float* data, size_t n) {
  if (n == 0) return;
  // A maximum is exact in any order.
  CommTimer t(stats_, 2 * n * sizeof(float) * (size_ - 1) / size_);
  Check(MPI_Allreduce(MPI_IN_PLACE, data, ToInt(n, "AllReduceMax"), MPI_FLOAT, MPI_MAX, comm_),
        "MPI_Allreduce");
}

void MpiCommunicator::AllToAllV(const float* send, const size_t* send_counts, float* recv,
                                const size_t* recv_counts) {
  const int w = size_;
  icounts_.assign(w, 0);
  idispls_.assign(w, 0);
  rcounts_.assign(w, 0);
  rdispls_.assign(w, 0);
  size_t so = 0, ro = 0, sent = 0;
  for (int r = 0; r < w; ++r) {
    icounts_[r] = ToInt(send_counts[r], "AllToAllV");
    idispls_[r] = ToInt(so, "AllToAllV");
    rcounts_[r] = ToInt(recv_counts[r], "AllToAllV");
    rdispls_[r] = ToInt(ro, "AllToAllV");
    so += send_counts[r];
    ro += recv_counts[r];
    if (r != rank_) sent += send_counts[r];
  }
  CommTimer t(stats_, sent * sizeof(float));
  Check(MPI_Alltoallv(send, icounts_.data(), idispls_.data(), MPI_FLOAT, recv, rcounts_.data(),
                      rdispls_.data(), MPI_FLOAT, comm_),
        "MPI_Alltoallv");
}

void MpiCommunicator::StartAllReduceSum(float* data, size_t n) {
  if (size_ == 1 || n == 0) return;
  const std::vector<size_t> counts = EvenCounts(n, size_);
  const size_t mine = counts[rank_];
  CommTimer t(stats_, 2 * (n - mine) * sizeof(float));  // what AllReduceSum sends
  PendingSum& p = pending_.emplace_back();
  p.data = data;
  p.counts.resize(size_);
  p.displs.resize(size_);
  p.rcounts.assign(size_, ToInt(mine, "StartAllReduceSum"));
  p.rdispls.resize(size_);
  size_t off = 0;
  for (int r = 0; r < size_; ++r) {
    p.counts[r] = ToInt(counts[r], "StartAllReduceSum");
    p.displs[r] = ToInt(off, "StartAllReduceSum");
    p.rdispls[r] = ToInt(r * mine, "StartAllReduceSum");
    off += counts[r];
  }
  p.recv.resize(size_ * mine);
  Check(MPI_Ialltoallv(data, p.counts.data(), p.displs.data(), MPI_FLOAT, p.recv.data(),
                       p.rcounts.data(), p.rdispls.data(), MPI_FLOAT, comm_, &p.request),
        "MPI_Ialltoallv (reduce-scatter)");
}

void MpiCommunicator::Progress() {
  if (pending_.empty()) return;
  const auto t0 = Clock::now();
  for (PendingSum& p : pending_) {
    int done = 0;
    Check(MPI_Test(&p.request, &done, MPI_STATUS_IGNORE), "MPI_Test");
  }
  stats_.seconds += std::chrono::duration<double>(Clock::now() - t0).count();
}

void MpiCommunicator::WaitAll() {
  if (pending_.empty()) return;
  const auto t0 = Clock::now();
  for (PendingSum& p : pending_) {
    Check(MPI_Wait(&p.request, MPI_STATUS_IGNORE), "MPI_Wait");
    // Rank order 0..W−1, as ReduceScatterT: the bits of AllReduceSum.
    const size_t mine = static_cast<size_t>(p.rcounts[rank_]);
    float* out = p.data + p.displs[rank_];
    std::memcpy(out, p.recv.data(), mine * sizeof(float));
    for (int r = 1; r < size_; ++r) {
      const float* src = p.recv.data() + r * mine;
      for (size_t i = 0; i < mine; ++i) out[i] += src[i];
    }
    Check(MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_FLOAT, p.data, p.counts.data(), p.displs.data(),
                          MPI_FLOAT, comm_, &p.request),
          "MPI_Iallgatherv");
  }
  for (PendingSum& p : pending_) Check(MPI_Wait(&p.request, MPI_STATUS_IGNORE), "MPI_Wait");
  pending_.clear();
  stats_.seconds += std::chrono::duration<double>(Clock::now() - t0).count();
}

void MpiCommunicator::Barrier() {
  CommTimer t(stats_, 0);
  Check(MPI_Barrier(comm_), "MPI_Barrier");
}

void MpiCommunicator::ReduceScatterSum(float* data, const size_t* counts) {
  if (size_ == 1) return;
  ReduceScatterT(data, counts, MPI_FLOAT);
}

void MpiCommunicator::AllGatherV(float* data, const size_t* counts) {
  if (size_ == 1) return;
  AllGatherT(data, counts, MPI_FLOAT);
}

void MpiCommunicator::Broadcast(float* data, size_t n, int root) {
  BroadcastBytes(data, n * sizeof(float), root);
}

void MpiCommunicator::BroadcastBytes(void* data, size_t bytes, int root) {
  if (size_ == 1 || bytes == 0) return;
  CommTimer t(stats_, rank_ == root ? bytes : 0);
  char* p = static_cast<char*>(data);
  constexpr size_t kMax = size_t{1} << 30;
  for (size_t off = 0; off < bytes; off += kMax) {
    const size_t len = std::min(kMax, bytes - off);
    Check(MPI_Bcast(p + off, static_cast<int>(len), MPI_BYTE, root, comm_), "MPI_Bcast");
  }
}

std::unique_ptr<Communicator> MpiCommunicator::Split(int color, int key) {
  MPI_Comm sub;
  Check(MPI_Comm_split(comm_, color, key, &sub), "MPI_Comm_split");
  MPI_Comm_set_errhandler(sub, MPI_ERRORS_RETURN);
  return std::unique_ptr<Communicator>(new MpiCommunicator(sub, true, false));
}

void MpiCommunicator::Abort(int exit_code) {
  MPI_Abort(comm_, exit_code);
  std::_Exit(exit_code);
}

}  // namespace moelab

#endif  // MOELAB_HAVE_MPI
