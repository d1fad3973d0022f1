// One buffer of optimizer state in a backend's memory, with the host vector that checkpoints read
// and write (Optimizer::state()). On host memory the vector is the state itself; on a device it is
// a mirror: SyncToHost() before a checkpoint is written from it, SyncToDevice() after one was read
// into it.
#pragma once

#include <cstddef>
#include <vector>

#include "core/model/optimizer_ops.h"

namespace moelab {

class StateArray {
 public:
  StateArray(BackendMemory& memory, size_t n) : host_(n, 0.0f), on_device_(!memory.is_host()) {
    if (on_device_) {
      device_.Bind(&memory);
      device_.Resize(n);
    }
  }
  // The state in the backend's memory (what the ops update).
  float* data() { return on_device_ ? device_.data() : host_.data(); }
  std::vector<float>* host() { return &host_; }
  size_t size() const { return host_.size(); }
  void SyncToHost() {
    if (on_device_ && !host_.empty()) device_.Download(host_.data(), host_.size());
  }
  void SyncToDevice() {
    if (on_device_ && !host_.empty()) device_.Upload(host_.data(), host_.size());
  }

 private:
  std::vector<float> host_;
  bool on_device_;
  BackendArray<float> device_;
};

}  // namespace moelab
