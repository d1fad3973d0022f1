// Per-region GPU timing for the per-kernel breakdown of `bench --device cuda` (issue 11): CUDA
// events around named regions, aggregated by name, plus NVTX ranges of the same names so an
// Nsight Systems trace shows them too. Off by default: a disabled profiler makes no CUDA call.
//
//   cuda::Profiler().set_enabled(true);
//   { cuda::ProfileRegion r("attention.fwd", stream); AttentionForward(...); }
//   for (auto& e : cuda::Profiler().Collect()) ...   // synchronises; totals since the last Reset
//
// One profiler per host thread (the thread that issues the work on its stream).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>
#include <vector>

namespace moelab::cuda {

class EventProfiler {
 public:
  struct Entry {
    std::string name;
    double ms = 0;  // summed GPU time between the region's start and stop events
    int64_t calls = 0;
  };

  EventProfiler() = default;
  EventProfiler(const EventProfiler&) = delete;
  EventProfiler& operator=(const EventProfiler&) = delete;
  ~EventProfiler();

  void set_enabled(bool enabled) { enabled_ = enabled; }
  bool enabled() const { return enabled_; }

  // Regions nest (a stack); nested time is also counted in the enclosing region.
  void Begin(const char* name, cudaStream_t stream = nullptr);
  void End(cudaStream_t stream = nullptr);

  // Waits for the recorded events, folds them into the totals and returns every name's total,
  // largest first. Open regions stay open.
  std::vector<Entry> Collect();
  // Drops the totals (and any finished, uncollected regions).
  void Reset();

 private:
  struct Open {
    std::string name;
    cudaEvent_t start;
  };
  struct Done {
    std::string name;
    cudaEvent_t start, stop;
  };
  cudaEvent_t NewEvent();
  void Recycle(cudaEvent_t e) { pool_.push_back(e); }

  bool enabled_ = false;
  std::vector<Open> open_;
  std::vector<Done> done_;
  std::vector<Entry> totals_;
  std::vector<cudaEvent_t> pool_;
};

// The calling thread's profiler.
EventProfiler& Profiler();

// RAII region on the calling thread's profiler (a no-op when it is disabled).
class ProfileRegion {
 public:
  ProfileRegion(const char* name, cudaStream_t stream = nullptr) : stream_(stream) {
    active_ = Profiler().enabled();
    if (active_) Profiler().Begin(name, stream);
  }
  ~ProfileRegion() {
    if (active_) Profiler().End(stream_);
  }
  ProfileRegion(const ProfileRegion&) = delete;
  ProfileRegion& operator=(const ProfileRegion&) = delete;

 private:
  cudaStream_t stream_;
  bool active_ = false;
};

}  // namespace moelab::cuda
