#include "core/train/preflight.h"

#include <exception>

#include "core/data/data.h"
#include "core/device.h"
#include "core/model/cuda_backend.h"

namespace moelab {

void PreflightRun(const RunConfig& config, const DistLayout& layout,
                  const PreflightOptions& options) {
  if (config.data.source == "corpus") {
    try {
      CheckVocabFits(ReadDataMeta(config.data.path), config.model.vocab_size);
    } catch (const std::exception& e) {
      throw ConfigError("data.path", e.what());
    }
  }
  try {
    RequireDevice(config.train);  // train.device "cuda" without a GPU
  } catch (const DeviceError& e) {
    throw ConfigError("train.device", e.what());
  }
  if (config.train.device != "cuda") return;
  RequireCudaSupports(config, layout.world, layout.ep);
  if (options.before_memory_check) options.before_memory_check();
  try {
    RequireCudaMemory(config, layout.local_batch, options.print_memory_plan);
  } catch (const DeviceError& e) {
    throw ConfigError("train.micro_batch", e.what());
  }
}

}  // namespace moelab
