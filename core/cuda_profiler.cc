#include "core/cuda_profiler.h"

#include <stdexcept>

#if MOELAB_HAVE_CUDA
#include "kernels/cuda/device.h"
#endif

namespace moelab {

#if MOELAB_HAVE_CUDA
struct CudaOpProfiler::Impl {
  struct Bracket {
    std::string op;
    cudaEvent_t start, stop;
  };
  std::vector<Bracket> brackets;  // reused across Reset (events are created once)
  size_t used = 0;
  std::vector<size_t> open;  // the open brackets, innermost last
  ~Impl() {
    for (Bracket& b : brackets) {
      cudaEventDestroy(b.start);
      cudaEventDestroy(b.stop);
    }
  }
};

CudaOpProfiler::CudaOpProfiler() : impl_(std::make_unique<Impl>()) {}
CudaOpProfiler::~CudaOpProfiler() = default;

void CudaOpProfiler::Begin(const char* op_class) {
  Impl& I = *impl_;
  if (I.used == I.brackets.size()) {
    Impl::Bracket b;
    MOELAB_CUDA_CHECK(cudaEventCreate(&b.start));
    MOELAB_CUDA_CHECK(cudaEventCreate(&b.stop));
    I.brackets.push_back(b);
  }
  Impl::Bracket& b = I.brackets[I.used];
  b.op = I.open.empty() ? op_class : I.brackets[I.open.back()].op + "/" + op_class;
  MOELAB_CUDA_CHECK(cudaEventRecord(b.start, nullptr));
  I.open.push_back(I.used++);
}

void CudaOpProfiler::End() {
  Impl& I = *impl_;
  if (I.open.empty()) throw std::logic_error("CudaOpProfiler: End without Begin");
  MOELAB_CUDA_CHECK(cudaEventRecord(I.brackets[I.open.back()].stop, nullptr));
  I.open.pop_back();
}

std::map<std::string, double> CudaOpProfiler::Totals() {
  std::map<std::string, double> out;
  for (size_t i = 0; i < impl_->used; ++i) {
    Impl::Bracket& b = impl_->brackets[i];
    MOELAB_CUDA_CHECK(cudaEventSynchronize(b.stop));
    float ms = 0;
    MOELAB_CUDA_CHECK(cudaEventElapsedTime(&ms, b.start, b.stop));
    out[b.op] += ms * 1e-3;
  }
  return out;
}

void CudaOpProfiler::Reset() {
  impl_->used = 0;
  impl_->open.clear();
}

#else

struct CudaOpProfiler::Impl {};
CudaOpProfiler::CudaOpProfiler() : impl_(std::make_unique<Impl>()) {}
CudaOpProfiler::~CudaOpProfiler() = default;
void CudaOpProfiler::Begin(const char*) {}
void CudaOpProfiler::End() {}
std::map<std::string, double> CudaOpProfiler::Totals() { return {}; }
void CudaOpProfiler::Reset() {}

#endif

}  // namespace moelab
