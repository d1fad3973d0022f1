// CUDA runtime helpers shared by every kernel in kernels/cuda and by core's CUDA backend: device
// detection, error checks, the per-thread cuBLAS handle, a growing device scratch, RAII device
// and pinned buffers, events and timers, and the recovery after a caught failure.
//
// Every kernel function in moelab::cuda takes device pointers and a trailing cudaStream_t
// (default: the legacy default stream) and is asynchronous unless its comment says it
// synchronises. Errors throw std::runtime_error with the failing call's name.
#pragma once

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <string>
#include <vector>

namespace moelab::cuda {

using bf16 = __nv_bfloat16;

// True when at least one CUDA device is usable. Otherwise false, and *reason (when not null)
// gets "no CUDA device: <cudaGetErrorString>" (e.g. "insufficient driver" on a machine without
// a GPU) or "no CUDA device: cudaGetDeviceCount returned 0".
bool CudaAvailable(std::string* reason = nullptr);

// The kernel implementations a run chose (its config's train.kernels: core/kernel_choices.h,
// docs/cuda.md "Kernel choices") that the launchers consult at each call. Process-wide: the CUDA
// backend installs its run's selection for as long as it lives (ScopedKernelSelection), and the
// kernel tests install theirs the same way. Every field's zero value is the default.
struct KernelSelection {
  bool attention_mma = false;  // the mma.sync fused attention kernels (else wmma)
  bool rope_fused = false;     // RoPE inside the mma kernels' tile loads (else its own kernel)
  bool ffn_fused = false;      // bf16 gated FFN with gate and up as one GEMM
  int experts = 0;             // 0 grouped, 1 chunked, 2 cudnn, 3 device
  bool dispatch_sort = false;  // the chunked counting-sort dispatch plan (else the scan)
  // With attention_mma: the first mma kernels (attention_kernel "mma64", 64-key tiles).
  bool attention_mma64 = false;
  // Spelt out: the .cu files are C++17 (no defaulted comparisons).
  bool operator==(const KernelSelection& o) const {
    return attention_mma == o.attention_mma && rope_fused == o.rope_fused &&
           ffn_fused == o.ffn_fused && experts == o.experts && dispatch_sort == o.dispatch_sort &&
           attention_mma64 == o.attention_mma64;
  }
};
// The selection in force (the defaults when none is installed).
KernelSelection SelectedKernels();

// Installs `selection` while it lives (the defaults return when the last one is destroyed). Those
// alive at once must agree: a second CUDA model with other choices in the same process throws
// std::logic_error (its launches would run the first one's kernels), naming both.
class ScopedKernelSelection {
 public:
  explicit ScopedKernelSelection(const KernelSelection& selection);
  ~ScopedKernelSelection();
  ScopedKernelSelection(const ScopedKernelSelection&) = delete;
  ScopedKernelSelection& operator=(const ScopedKernelSelection&) = delete;
};

// Throw std::runtime_error("<what>: <error string>") when the call failed.
void Check(cudaError_t err, const char* what);
void CheckCublas(cublasStatus_t status, const char* what);
// Checks the last kernel launch (cudaGetLastError).
void CheckLaunch(const char* what);

#define MOELAB_CUDA_CHECK(call) ::moelab::cuda::Check((call), #call)
#define MOELAB_CUBLAS_CHECK(call) ::moelab::cuda::CheckCublas((call), #call)

// The calling thread's cuBLAS handle for the current device (created on first use, with
// CUBLAS_POINTER_MODE_HOST and the default math mode: fp32 GEMMs stay true fp32, no TF32),
// bound to `stream` before it is returned.
cublasHandle_t Cublas(cudaStream_t stream);

// A device scratch owned by the calling thread that only grows (stream-ordered reuse: valid
// until the next call on the same thread; callers use one stream per thread). Used internally
// for cuBLAS pointer arrays and small reductions.
void* ThreadScratch(size_t bytes);

// Owning device allocation of n elements of T (cudaMalloc / cudaFree), move-only.
template <typename T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t n) { Resize(n); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(o.ptr_), n_(o.n_) { o.ptr_ = nullptr, o.n_ = 0; }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      Free();
      ptr_ = o.ptr_, n_ = o.n_;
      o.ptr_ = nullptr, o.n_ = 0;
    }
    return *this;
  }
  ~DeviceBuffer() { Free(); }

  // Reallocates (contents lost) when n differs from the current size.
  void Resize(size_t n) {
    if (n == n_) return;
    Free();
    if (n) MOELAB_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&ptr_), n * sizeof(T)));
    n_ = n;
  }
  void Upload(const T* host, size_t n) {
    Resize(n);
    if (n) MOELAB_CUDA_CHECK(cudaMemcpy(ptr_, host, n * sizeof(T), cudaMemcpyHostToDevice));
  }
  void Upload(const std::vector<T>& host) { Upload(host.data(), host.size()); }
  std::vector<T> Download() const {
    std::vector<T> out(n_);
    if (n_) MOELAB_CUDA_CHECK(cudaMemcpy(out.data(), ptr_, n_ * sizeof(T), cudaMemcpyDeviceToHost));
    return out;
  }
  void Zero() {
    if (n_) MOELAB_CUDA_CHECK(cudaMemset(ptr_, 0, n_ * sizeof(T)));
  }
  T* data() { return ptr_; }
  const T* data() const { return ptr_; }
  size_t size() const { return n_; }

 private:
  void Free() {
    if (ptr_) cudaFree(ptr_);
    ptr_ = nullptr;
    n_ = 0;
  }
  T* ptr_ = nullptr;
  size_t n_ = 0;
};

// Owning page-locked host allocation of n elements of T (cudaMallocHost / cudaFreeHost): the
// target of an asynchronous device-to-host copy that the host reads later, after an event.
template <typename T>
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  explicit PinnedBuffer(size_t n) {
    if (n) MOELAB_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&ptr_), n * sizeof(T)));
    n_ = n;
  }
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  PinnedBuffer(PinnedBuffer&& o) noexcept : ptr_(o.ptr_), n_(o.n_) { o.ptr_ = nullptr, o.n_ = 0; }
  PinnedBuffer& operator=(PinnedBuffer&& o) noexcept {
    if (this != &o) {
      if (ptr_) cudaFreeHost(ptr_);
      ptr_ = o.ptr_, n_ = o.n_;
      o.ptr_ = nullptr, o.n_ = 0;
    }
    return *this;
  }
  ~PinnedBuffer() {
    if (ptr_) cudaFreeHost(ptr_);
  }
  T* data() { return ptr_; }
  const T* data() const { return ptr_; }
  size_t size() const { return n_; }

 private:
  T* ptr_ = nullptr;
  size_t n_ = 0;
};

// An owned CUDA event without timing (cudaEventDisableTiming): records where a stream has got to.
class Event {
 public:
  Event() { MOELAB_CUDA_CHECK(cudaEventCreateWithFlags(&e_, cudaEventDisableTiming)); }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  ~Event() { cudaEventDestroy(e_); }
  void Record(cudaStream_t stream = nullptr) { MOELAB_CUDA_CHECK(cudaEventRecord(e_, stream)); }
  // Blocks the host until the recorded work is done (at once when it already is).
  void Wait() { MOELAB_CUDA_CHECK(cudaEventSynchronize(e_)); }

 private:
  cudaEvent_t e_ = nullptr;
};

// Elapsed GPU time between two events recorded on a stream (a timing twin of Event).
class EventTimer {
 public:
  EventTimer() {
    MOELAB_CUDA_CHECK(cudaEventCreate(&start_));
    MOELAB_CUDA_CHECK(cudaEventCreate(&stop_));
  }
  ~EventTimer() {
    cudaEventDestroy(start_);
    cudaEventDestroy(stop_);
  }
  EventTimer(const EventTimer&) = delete;
  EventTimer& operator=(const EventTimer&) = delete;
  void Start(cudaStream_t s = nullptr) { MOELAB_CUDA_CHECK(cudaEventRecord(start_, s)); }
  void Stop(cudaStream_t s = nullptr) { MOELAB_CUDA_CHECK(cudaEventRecord(stop_, s)); }
  // Waits for the stop event; seconds.
  double Seconds() {
    MOELAB_CUDA_CHECK(cudaEventSynchronize(stop_));
    float ms = 0;
    MOELAB_CUDA_CHECK(cudaEventElapsedTime(&ms, start_, stop_));
    return ms * 1e-3;
  }

 private:
  cudaEvent_t start_ = nullptr, stop_ = nullptr;
};

// After a caught CUDA failure: clears the thread's last error and waits for the device. Returns
// "" when the context still works (e.g. after an out-of-memory), else the sticky error's name and
// text (a faulting kernel: nothing on this device works again in this process).
std::string RecoverAfterError();

// Elementwise precision casts (n elements).
void CastToBf16(const float* in, bf16* out, size_t n, cudaStream_t stream = nullptr);
void CastToFloat(const bf16* in, float* out, size_t n, cudaStream_t stream = nullptr);
// x[i] = value for i < n.
void Fill(float* x, size_t n, float value, cudaStream_t stream = nullptr);

}  // namespace moelab::cuda
