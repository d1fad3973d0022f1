// Host-side CUDA helpers for the device backend (docs/cuda.md): error checks that throw, an
// owning device buffer, and CUDA-event timers. Include only from code compiled with
// MOELAB_HAVE_CUDA.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace moelab::cudautil {

// Both Check()s clear the thread's last CUDA error before throwing (see kernels/cuda/device.cu:
// otherwise the next launch check reports the old failure).
inline void Check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    cudaGetLastError();
    throw std::runtime_error(std::string("CUDA error in ") + what + ": " + cudaGetErrorName(e) +
                             " (" + cudaGetErrorString(e) + ")");
  }
}
inline void Check(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) {
    cudaGetLastError();
    throw std::runtime_error(std::string("cuBLAS error in ") + what + ": status " +
                             std::to_string(static_cast<int>(s)));
  }
}
#define MOELAB_CUDA(call) ::moelab::cudautil::Check((call), #call)

// cudaMalloc'd array of T; zeroed on Resize; not copyable.
template <typename T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t n) { Resize(n); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept { *this = std::move(o); }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    std::swap(ptr_, o.ptr_);
    std::swap(size_, o.size_);
    return *this;
  }
  ~DeviceBuffer() {
    if (ptr_) cudaFree(ptr_);
  }
  void Resize(size_t n) {
    if (ptr_) cudaFree(ptr_);
    ptr_ = nullptr;
    size_ = n;
    if (n == 0) return;
    MOELAB_CUDA(cudaMalloc(&ptr_, n * sizeof(T)));
    MOELAB_CUDA(cudaMemset(ptr_, 0, n * sizeof(T)));
  }
  void Upload(const T* host, size_t n, size_t at = 0) {
    MOELAB_CUDA(cudaMemcpy(ptr_ + at, host, n * sizeof(T), cudaMemcpyHostToDevice));
  }
  void Download(T* host, size_t n, size_t at = 0) const {
    MOELAB_CUDA(cudaMemcpy(host, ptr_ + at, n * sizeof(T), cudaMemcpyDeviceToHost));
  }
  void Upload(const std::vector<T>& host) {
    if (host.size() != size_) Resize(host.size());
    if (size_) Upload(host.data(), size_);
  }
  std::vector<T> ToHost() const {
    std::vector<T> out(size_);
    if (size_) Download(out.data(), size_);
    return out;
  }
  T* data() { return ptr_; }
  const T* data() const { return ptr_; }
  size_t size() const { return size_; }

 private:
  T* ptr_ = nullptr;
  size_t size_ = 0;
};

// Elapsed GPU time between two events recorded on a stream.
class EventTimer {
 public:
  EventTimer() {
    MOELAB_CUDA(cudaEventCreate(&start_));
    MOELAB_CUDA(cudaEventCreate(&stop_));
  }
  ~EventTimer() {
    cudaEventDestroy(start_);
    cudaEventDestroy(stop_);
  }
  EventTimer(const EventTimer&) = delete;
  EventTimer& operator=(const EventTimer&) = delete;
  void Start(cudaStream_t s = nullptr) { MOELAB_CUDA(cudaEventRecord(start_, s)); }
  void Stop(cudaStream_t s = nullptr) { MOELAB_CUDA(cudaEventRecord(stop_, s)); }
  // Waits for the stop event; seconds.
  double Seconds() {
    MOELAB_CUDA(cudaEventSynchronize(stop_));
    float ms = 0;
    MOELAB_CUDA(cudaEventElapsedTime(&ms, start_, stop_));
    return ms * 1e-3;
  }

 private:
  cudaEvent_t start_ = nullptr, stop_ = nullptr;
};

// One cuBLAS handle per thread, created on first use.
cublasHandle_t CublasHandle();

// After a caught CUDA failure: clears the thread's last error and waits for the device. Returns
// "" when the context still works (e.g. after an out-of-memory), else the sticky error's name and
// text (a faulting kernel: nothing on this device works again in this process).
std::string RecoverAfterError();

}  // namespace moelab::cudautil
