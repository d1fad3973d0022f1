// The memory half of the backend seam (core/model/backend.h): raw allocations and copies of a
// backend, owned arrays in it, and plain host memory. Split out so that code which only moves
// data (the expert-parallel row exchange, core/model/expert_exchange.h) depends on memory alone.
#pragma once

#include <cstddef>
#include <string>
#include <utility>

namespace moelab {

// Raw memory of a backend: zero-filled allocations and copies.
class BackendMemory {
 public:
  virtual ~BackendMemory() = default;
  virtual std::string name() const = 0;  // "cpu" or "cuda": train.device
  // True when the backend's pointers are host memory (the CPU backend).
  virtual bool is_host() const = 0;
  // Zero-filled, aligned to at least 256 bytes; null for 0 bytes. Throws std::bad_alloc (or a
  // DeviceError naming the size) when it cannot.
  virtual void* Allocate(size_t bytes) = 0;
  virtual void Release(void* p) noexcept = 0;
  virtual void ToBackend(void* dst, const void* host, size_t bytes) = 0;
  virtual void ToHost(void* host, const void* src, size_t bytes) const = 0;
  virtual void Copy(void* dst, const void* src, size_t bytes) = 0;
  virtual void Zero(void* p, size_t bytes) = 0;
};

// An owned array in a backend's memory.
template <typename U>
class BackendArray {
 public:
  BackendArray() = default;
  explicit BackendArray(BackendMemory* memory) : memory_(memory) {}
  BackendArray(const BackendArray&) = delete;
  BackendArray& operator=(const BackendArray&) = delete;
  BackendArray(BackendArray&& other) noexcept { *this = std::move(other); }
  BackendArray& operator=(BackendArray&& other) noexcept {
    if (this != &other) {
      Reset();
      memory_ = other.memory_;
      data_ = std::exchange(other.data_, nullptr);
      size_ = std::exchange(other.size_, 0);
    }
    return *this;
  }
  ~BackendArray() { Reset(); }
  void Bind(BackendMemory* memory) { memory_ = memory; }
  // Discards the contents; the new array is zero-filled.
  void Resize(size_t n) {
    Reset();
    data_ = static_cast<U*>(memory_->Allocate(n * sizeof(U)));
    size_ = n;
  }
  void Upload(const U* host, size_t n) { memory_->ToBackend(data_, host, n * sizeof(U)); }
  void Download(U* host, size_t n) const { memory_->ToHost(host, data_, n * sizeof(U)); }
  U* data() { return data_; }
  const U* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  void Reset() {
    if (data_) memory_->Release(data_);
    data_ = nullptr;
    size_ = 0;
  }
  BackendMemory* memory_ = nullptr;
  U* data_ = nullptr;
  size_t size_ = 0;
};

// Host memory: 256-byte aligned, zero-filled allocations, memcpy copies. The CPU backend's
// memory, and what host-side code written over BackendMemory uses (the CPU MoE layer's expert
// exchange).
class HostMemory final : public BackendMemory {
 public:
  std::string name() const override { return "cpu"; }
  bool is_host() const override { return true; }
  void* Allocate(size_t bytes) override;
  void Release(void* p) noexcept override;
  void ToBackend(void* dst, const void* host, size_t bytes) override;
  void ToHost(void* host, const void* src, size_t bytes) const override;
  void Copy(void* dst, const void* src, size_t bytes) override;
  void Zero(void* p, size_t bytes) override;
};

// The process's one HostMemory (it has no state).
HostMemory& Host();

}  // namespace moelab
