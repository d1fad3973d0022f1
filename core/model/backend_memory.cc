#include "core/model/backend_memory.h"

#include <cstdlib>
#include <cstring>
#include <new>

namespace moelab {

namespace {
constexpr size_t kAlignBytes = 256;
}  // namespace

void* HostMemory::Allocate(size_t bytes) {
  if (bytes == 0) return nullptr;
  const size_t padded = (bytes + kAlignBytes - 1) / kAlignBytes * kAlignBytes;
  void* p = std::aligned_alloc(kAlignBytes, padded);
  if (!p) throw std::bad_alloc();
  std::memset(p, 0, padded);
  return p;
}

void HostMemory::Release(void* p) noexcept { std::free(p); }

void HostMemory::ToBackend(void* dst, const void* host, size_t bytes) {
  if (bytes) std::memcpy(dst, host, bytes);
}

void HostMemory::ToHost(void* host, const void* src, size_t bytes) const {
  if (bytes) std::memcpy(host, src, bytes);
}

void HostMemory::Copy(void* dst, const void* src, size_t bytes) {
  auto* d = static_cast<char*>(dst);
  const auto* s = static_cast<const char*>(src);
  const long n = static_cast<long>(bytes);
#pragma omp parallel for simd schedule(static) if (n > (1 << 18))
  for (long i = 0; i < n; ++i) d[i] = s[i];
}

void HostMemory::Zero(void* p, size_t bytes) {
  if (bytes) std::memset(p, 0, bytes);
}

HostMemory& Host() {
  static HostMemory memory;
  return memory;
}

}  // namespace moelab
