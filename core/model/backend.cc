#include "core/model/backend.h"

#include <stdexcept>

namespace moelab {

template <>
std::unique_ptr<Backend<float>> MakeBackend<float>(const RunConfig& config) {
  if (config.train.device == "cuda") return MakeCudaBackend(config);
  return MakeCpuBackend<float>();
}

// Double precision exists for the finite-difference checks, on the CPU only.
template <>
std::unique_ptr<Backend<double>> MakeBackend<double>(const RunConfig& config) {
  if (config.train.device == "cuda") {
    throw std::invalid_argument("train.device \"cuda\": the double-precision model is CPU-only");
  }
  return MakeCpuBackend<double>();
}

}  // namespace moelab
