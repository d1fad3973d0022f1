#include <cuda_runtime.h>

#include <cstdlib>
#include <mutex>
#include <stdexcept>
#include <string>
#include <unordered_map>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/device.h"

namespace moelab::cuda {

bool CudaAvailable(std::string* reason) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    cudaGetLastError();  // clear the sticky-free error so later calls start clean
    if (reason) *reason = std::string("no CUDA device: ") + cudaGetErrorString(err);
    return false;
  }
  if (count == 0) {
    if (reason) *reason = "no CUDA device: cudaGetDeviceCount returned 0";
    return false;
  }
  if (reason) reason->clear();
  return true;
}

void Check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    // The failed call also set the thread's last error; left there, the next CheckLaunch (a
    // kernel that launched fine) would throw it again. Sticky errors (a faulting kernel) stay
    // whatever this does: the context is lost until the process ends.
    cudaGetLastError();
    throw std::runtime_error(std::string(what) + ": " + cudaGetErrorName(err) + " (" +
                             cudaGetErrorString(err) + ")");
  }
}

void CheckCublas(cublasStatus_t status, const char* what) {
  if (status != CUBLAS_STATUS_SUCCESS) {
    cudaGetLastError();  // a failed workspace allocation inside cuBLAS sets it too
    throw std::runtime_error(std::string(what) + ": " + cublasGetStatusName(status) + " (" +
                             cublasGetStatusString(status) + ")");
  }
}

void CheckLaunch(const char* what) { Check(cudaGetLastError(), what); }

namespace {

std::mutex selection_mutex;
KernelSelection selection;  // guarded by selection_mutex
int selection_holders = 0;  // live ScopedKernelSelection objects

std::string Describe(const KernelSelection& k) {
  return std::string("attention ") +
         (k.attention_mma ? (k.attention_mma64 ? "mma64" : "mma") : "wmma") + ", rope " +
         (k.rope_fused ? "fused" : "separate") + ", ffn " + (k.ffn_fused ? "fused" : "split") +
         ", experts " +
         (k.experts == 1   ? "chunked"
          : k.experts == 2 ? "cudnn"
          : k.experts == 3 ? "device"
                           : "grouped") +
         ", dispatch " + (k.dispatch_sort ? "sort" : "scan");
}

}  // namespace

KernelSelection SelectedKernels() {
  std::lock_guard<std::mutex> lock(selection_mutex);
  return selection;
}

ScopedKernelSelection::ScopedKernelSelection(const KernelSelection& wanted) {
  std::lock_guard<std::mutex> lock(selection_mutex);
  if (selection_holders > 0 && !(selection == wanted)) {
    throw std::logic_error("two CUDA models with different train.kernels in one process (" +
                           Describe(selection) + " | " + Describe(wanted) +
                           "): the kernels' selection is process-wide");
  }
  selection = wanted;
  ++selection_holders;
}

ScopedKernelSelection::~ScopedKernelSelection() {
  std::lock_guard<std::mutex> lock(selection_mutex);
  if (--selection_holders == 0) selection = KernelSelection{};
}

std::string RecoverAfterError() {
  cudaGetLastError();
  cudaError_t e = cudaDeviceSynchronize();
  if (e == cudaSuccess) e = cudaGetLastError();
  if (e == cudaSuccess) return "";
  return std::string(cudaGetErrorName(e)) + " (" + cudaGetErrorString(e) + ")";
}

namespace {

struct ThreadState {
  std::unordered_map<int, cublasHandle_t> handles;  // by device
  void* scratch = nullptr;
  size_t scratch_bytes = 0;
  int scratch_device = -1;
  ~ThreadState() {
    // Handles and memory die with the context at process exit; destroying them here could run
    // after the driver has shut down, so only the scratch of a still-live thread is freed.
    if (scratch) cudaFree(scratch);
  }
};
thread_local ThreadState tls;

}  // namespace

cublasHandle_t Cublas(cudaStream_t stream) {
  int device = 0;
  MOELAB_CUDA_CHECK(cudaGetDevice(&device));
  auto it = tls.handles.find(device);
  if (it == tls.handles.end()) {
    cublasHandle_t h = nullptr;
    MOELAB_CUBLAS_CHECK(cublasCreate(&h));
    MOELAB_CUBLAS_CHECK(cublasSetPointerMode(h, CUBLAS_POINTER_MODE_HOST));
    // Default math: fp32 GEMMs in true fp32 (the twin tests compare against OpenBLAS).
    MOELAB_CUBLAS_CHECK(cublasSetMathMode(h, CUBLAS_DEFAULT_MATH));
    it = tls.handles.emplace(device, h).first;
  }
  MOELAB_CUBLAS_CHECK(cublasSetStream(it->second, stream));
  return it->second;
}

void* ThreadScratch(size_t bytes) {
  int device = 0;
  MOELAB_CUDA_CHECK(cudaGetDevice(&device));
  if (bytes > tls.scratch_bytes || device != tls.scratch_device) {
    if (tls.scratch) {
      // The old scratch may still be read by queued work: wait for it before freeing.
      MOELAB_CUDA_CHECK(cudaDeviceSynchronize());
      MOELAB_CUDA_CHECK(cudaFree(tls.scratch));
      tls.scratch = nullptr;
    }
    const size_t want = bytes < 4096 ? 4096 : bytes;
    MOELAB_CUDA_CHECK(cudaMalloc(&tls.scratch, want));
    tls.scratch_bytes = want;
    tls.scratch_device = device;
  }
  return tls.scratch;
}

namespace {

__global__ void CastToBf16Kernel(const float* in, bf16* out, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    out[i] = __float2bfloat16(in[i]);
  }
}
__global__ void CastToFloatKernel(const bf16* in, float* out, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    out[i] = __bfloat162float(in[i]);
  }
}
__global__ void FillKernel(float* x, size_t n, float value) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    x[i] = value;
  }
}

}  // namespace

void CastToBf16(const float* in, bf16* out, size_t n, cudaStream_t stream) {
  if (!n) return;
  CastToBf16Kernel<<<detail::Blocks(n, 256), 256, 0, stream>>>(in, out, n);
  CheckLaunch("CastToBf16");
}

void CastToFloat(const bf16* in, float* out, size_t n, cudaStream_t stream) {
  if (!n) return;
  CastToFloatKernel<<<detail::Blocks(n, 256), 256, 0, stream>>>(in, out, n);
  CheckLaunch("CastToFloat");
}

void Fill(float* x, size_t n, float value, cudaStream_t stream) {
  if (!n) return;
  FillKernel<<<detail::Blocks(n, 256), 256, 0, stream>>>(x, n, value);
  CheckLaunch("Fill");
}

}  // namespace moelab::cuda
