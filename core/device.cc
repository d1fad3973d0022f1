#include "core/device.h"

#include <fmt/format.h>

#if MOELAB_HAVE_CUDA
#include <cuda_runtime.h>
#endif

namespace moelab {

bool CudaCompiledIn() {
#if MOELAB_HAVE_CUDA
  return true;
#else
  return false;
#endif
}

const CudaDeviceInfo& QueryCudaDevices() {
  static const CudaDeviceInfo info = [] {
    CudaDeviceInfo i;
#if MOELAB_HAVE_CUDA
    int count = 0;
    const cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess) {
      i.reason =
          fmt::format("no CUDA device ({}: {})", cudaGetErrorName(err), cudaGetErrorString(err));
      cudaGetLastError();  // clear the sticky error for later callers
      return i;
    }
    if (count == 0) {
      i.reason = "no CUDA device (the driver reports none)";
      return i;
    }
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) {
      i.reason = "no CUDA device (cannot read device 0's properties)";
      cudaGetLastError();
      return i;
    }
    if (prop.major < 8) {
      i.reason = fmt::format("CUDA device 0 ({}) is sm_{}{}; moelab's kernels need sm_80 or newer",
                             prop.name, prop.major, prop.minor);
      return i;
    }
    i.count = count;
    i.name = prop.name;
    i.sm_major = prop.major;
    i.sm_minor = prop.minor;
    i.memory_bytes = prop.totalGlobalMem;
    i.multiprocessors = prop.multiProcessorCount;
#else
    i.reason = "this moelab was built without CUDA (no toolkit found at configure time)";
#endif
    return i;
  }();
  return info;
}

std::string CudaSkipReason() { return QueryCudaDevices().reason; }

void RequireDevice(const TrainConfig& train) {
  if (train.device != "cuda") return;
  const CudaDeviceInfo& info = QueryCudaDevices();
  if (info.count > 0) return;
  throw DeviceError(fmt::format(
      "\"cuda\" cannot run here: {}; set train.device to \"cpu\" or run on a machine with a GPU",
      info.reason));
}

}  // namespace moelab
