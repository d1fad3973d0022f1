#include "core/train/device_check.h"

#include <string>

#include "core/device.h"
#include "core/model/cuda_backend.h"

namespace moelab {

bool TrainsOnCuda(const RunConfig& config) { return config.train.device == "cuda"; }

void RequireTrainDevice(const RunConfig& config) {
  if (!TrainsOnCuda(config)) return;
  try {
    RequireDevice(config.train);
  } catch (const DeviceError& e) {
    throw DeviceError(std::string("train.device: ") + e.what());
  }
}

void CheckDevice(const RunConfig& config, const DistLayout& layout) {
  if (!TrainsOnCuda(config)) return;
  RequireCudaSupports(config, layout.world, layout.ep);
}

void CheckDeviceMemory(const RunConfig& config, const DistLayout& layout) {
  if (!TrainsOnCuda(config)) return;
  RequireCudaMemory(config, layout.local_batch, false);  // the CLI printed the plan
}

}  // namespace moelab
