// Per-op-class GPU time of a training step (docs/cuda.md, issue 11's breakdown): the device
// model brackets each op class with CUDA events when a profiler is attached, and the totals are
// read after the step. Attaching one serialises nothing; reading waits for the events.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

namespace moelab {

class CudaOpProfiler {
 public:
  CudaOpProfiler();
  ~CudaOpProfiler();
  CudaOpProfiler(const CudaOpProfiler&) = delete;
  CudaOpProfiler& operator=(const CudaOpProfiler&) = delete;
  // Brackets on the default stream. A bracket opened inside another is also a sub-class of it,
  // reported as "outer/inner" beside the outer's inclusive total (the MoE layer's phases, say).
  void Begin(const char* op_class);
  void End();
  // Seconds per op class summed over every bracket since the last Reset (waits for the GPU).
  std::map<std::string, double> Totals();
  void Reset();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// RAII bracket; a null profiler costs one branch.
class ProfileScope {
 public:
  ProfileScope(CudaOpProfiler* p, const char* op_class) : p_(p) {
    if (p_) p_->Begin(op_class);
  }
  ~ProfileScope() {
    if (p_) p_->End();
  }
  ProfileScope(const ProfileScope&) = delete;
  ProfileScope& operator=(const ProfileScope&) = delete;

 private:
  CudaOpProfiler* p_;
};

// Consecutive brackets over one stretch of code: Next(name) closes the previous phase and opens
// the next; the last one closes with the object. A null profiler costs one branch a phase.
class ProfilePhases {
 public:
  explicit ProfilePhases(CudaOpProfiler* p) : p_(p) {}
  ~ProfilePhases() {
    if (p_ && open_) p_->End();
  }
  void Next(const char* op_class) {
    if (!p_) return;
    if (open_) p_->End();
    p_->Begin(op_class);
    open_ = true;
  }
  ProfilePhases(const ProfilePhases&) = delete;
  ProfilePhases& operator=(const ProfilePhases&) = delete;

 private:
  CudaOpProfiler* p_;
  bool open_ = false;
};

}  // namespace moelab
