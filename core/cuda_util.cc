#if MOELAB_HAVE_CUDA
#include "core/cuda_util.h"

namespace moelab::cudautil {

cublasHandle_t CublasHandle() {
  struct Holder {
    cublasHandle_t h = nullptr;
    Holder() { Check(cublasCreate(&h), "cublasCreate"); }
    ~Holder() {
      if (h) cublasDestroy(h);
    }
  };
  thread_local Holder holder;
  return holder.h;
}

std::string RecoverAfterError() {
  cudaGetLastError();
  cudaError_t e = cudaDeviceSynchronize();
  if (e == cudaSuccess) e = cudaGetLastError();
  if (e == cudaSuccess) return "";
  return std::string(cudaGetErrorName(e)) + " (" + cudaGetErrorString(e) + ")";
}

}  // namespace moelab::cudautil
#endif
