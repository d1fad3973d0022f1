// The checks Train makes of train.device before a run starts (docs/cuda.md), all in one place:
// the trainer itself never looks at the device string or the CUDA backend. Each is a no-op off
// "cuda". They run at three points of the set-up, in the order Train always made them, so the
// same error wins when several apply and the memory check sees the device after the NCCL set-up.
#pragma once

#include "core/config.h"
#include "core/dist/layout.h"

namespace moelab {

// True when the run trains on a CUDA device.
bool TrainsOnCuda(const RunConfig& config);

// Before the layout: a usable device exists (DeviceError "train.device: ..." otherwise).
void RequireTrainDevice(const RunConfig& config);

// Once the layout is known: what the CUDA backend cannot run (RequireCudaSupports, a
// ConfigError naming the JSON path).
void CheckDevice(const RunConfig& config, const DistLayout& layout);

// Once the communicators and the data exist, before the model allocates: the rank's memory
// plan fits in device 0's free memory (RequireCudaMemory, DeviceError otherwise).
void CheckDeviceMemory(const RunConfig& config, const DistLayout& layout);

}  // namespace moelab
