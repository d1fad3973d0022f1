// Where a run executes: the CPU, or a CUDA GPU (docs/cuda.md). Every function here exists in every
// build; without a CUDA toolkit they report that CUDA was not compiled in.
#pragma once

#include <stdexcept>
#include <string>

#include "core/config.h"

namespace moelab {

// Raised when train.device asks for something this machine or build cannot do. The CLI reports
// it like a config error (exit 2) before any run row or checkpoint exists.
class DeviceError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct CudaDeviceInfo {
  int count = 0;       // visible CUDA devices (0: none usable)
  std::string reason;  // why count is 0 ("" when a device is usable)
  std::string name;    // device 0's name
  int sm_major = 0, sm_minor = 0;
  size_t memory_bytes = 0;
  int multiprocessors = 0;
};

// True when this binary was built with the CUDA backend.
bool CudaCompiledIn();
// Queries the CUDA runtime once (cached); never throws and never aborts without a driver.
const CudaDeviceInfo& QueryCudaDevices();
// Throws DeviceError with a clear message when train.device cannot be used here (cuda without a
// GPU, without a driver, or in a CPU-only build). Does nothing for device "cpu".
void RequireDevice(const TrainConfig& train);
// The reason GPU tests skip with ("" when a GPU is usable).
std::string CudaSkipReason();

}  // namespace moelab
