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

}  // namespace moelab::cudautil
#endif
