#include "kernels/cuda/profile.h"

#include <nvtx3/nvToolsExt.h>

#include <algorithm>
#include <stdexcept>

#include "kernels/cuda/device.h"

namespace moelab::cuda {

EventProfiler::~EventProfiler() {
  // Best effort: at process exit the runtime may already be gone, so errors are ignored.
  for (auto& o : open_) cudaEventDestroy(o.start);
  for (auto& d : done_) {
    cudaEventDestroy(d.start);
    cudaEventDestroy(d.stop);
  }
  for (auto e : pool_) cudaEventDestroy(e);
}

cudaEvent_t EventProfiler::NewEvent() {
  if (!pool_.empty()) {
    cudaEvent_t e = pool_.back();
    pool_.pop_back();
    return e;
  }
  cudaEvent_t e = nullptr;
  MOELAB_CUDA_CHECK(cudaEventCreate(&e));
  return e;
}

void EventProfiler::Begin(const char* name, cudaStream_t stream) {
  if (!enabled_) return;
  nvtxRangePushA(name);
  cudaEvent_t start = NewEvent();
  MOELAB_CUDA_CHECK(cudaEventRecord(start, stream));
  open_.push_back({name, start});
}

void EventProfiler::End(cudaStream_t stream) {
  if (!enabled_) return;
  if (open_.empty()) throw std::logic_error("EventProfiler::End without Begin");
  cudaEvent_t stop = NewEvent();
  MOELAB_CUDA_CHECK(cudaEventRecord(stop, stream));
  nvtxRangePop();
  done_.push_back({std::move(open_.back().name), open_.back().start, stop});
  open_.pop_back();
}

std::vector<EventProfiler::Entry> EventProfiler::Collect() {
  for (Done& d : done_) {
    MOELAB_CUDA_CHECK(cudaEventSynchronize(d.stop));
    float ms = 0;
    MOELAB_CUDA_CHECK(cudaEventElapsedTime(&ms, d.start, d.stop));
    auto it = std::find_if(totals_.begin(), totals_.end(),
                           [&](const Entry& e) { return e.name == d.name; });
    if (it == totals_.end()) it = totals_.insert(totals_.end(), Entry{d.name, 0.0, 0});
    it->ms += ms;
    ++it->calls;
    Recycle(d.start);
    Recycle(d.stop);
  }
  done_.clear();
  std::vector<Entry> out = totals_;
  std::stable_sort(out.begin(), out.end(),
                   [](const Entry& a, const Entry& b) { return a.ms > b.ms; });
  return out;
}

void EventProfiler::Reset() {
  for (Done& d : done_) {
    Recycle(d.start);
    Recycle(d.stop);
  }
  done_.clear();
  totals_.clear();
}

EventProfiler& Profiler() {
  thread_local EventProfiler profiler;
  return profiler;
}

}  // namespace moelab::cuda
