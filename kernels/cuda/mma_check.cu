#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/flash_forward_mma.cuh"
#include "kernels/cuda/mma.cuh"
#include "kernels/cuda/mma_check.h"

namespace moelab::cuda {
namespace {

__global__ void TileProductKernel(const __nv_bfloat16* a, const __nv_bfloat16* b, float* c) {
  mma::TileProduct(a, b, c);
}

__global__ void LdMatrixKernel(const __nv_bfloat16* tile, int valid, uint32_t* out) {
  __shared__ __align__(16) __nv_bfloat16 stage[32 * 16];
  flash::LdMatrixProbe(tile, valid, stage, out);
}

}  // namespace

void MmaTileProductOnDevice(const uint16_t* a, const uint16_t* b, float* c) {
  void* buf = nullptr;
  constexpr size_t kA = 256 * 2, kB = 128 * 2, kC = 128 * 4;
  MOELAB_CUDA_CHECK(cudaMalloc(&buf, kA + kB + kC));
  char* p = static_cast<char*>(buf);
  MOELAB_CUDA_CHECK(cudaMemcpy(p, a, kA, cudaMemcpyHostToDevice));
  MOELAB_CUDA_CHECK(cudaMemcpy(p + kA, b, kB, cudaMemcpyHostToDevice));
  TileProductKernel<<<1, 32>>>(reinterpret_cast<const __nv_bfloat16*>(p),
                               reinterpret_cast<const __nv_bfloat16*>(p + kA),
                               reinterpret_cast<float*>(p + kA + kB));
  MOELAB_CUDA_CHECK(cudaGetLastError());
  MOELAB_CUDA_CHECK(cudaMemcpy(c, p + kA + kB, kC, cudaMemcpyDeviceToHost));
  MOELAB_CUDA_CHECK(cudaFree(buf));
}

void MmaLdMatrixOnDevice(const uint16_t* tile, int valid, uint32_t* out) {
  void* buf = nullptr;
  constexpr size_t kTileBytes = 32 * 8 * 2, kOut = 32 * 8 * 4;
  MOELAB_CUDA_CHECK(cudaMalloc(&buf, kTileBytes + kOut));
  char* p = static_cast<char*>(buf);
  MOELAB_CUDA_CHECK(cudaMemcpy(p, tile, kTileBytes, cudaMemcpyHostToDevice));
  LdMatrixKernel<<<1, 32>>>(reinterpret_cast<const __nv_bfloat16*>(p), valid,
                            reinterpret_cast<uint32_t*>(p + kTileBytes));
  MOELAB_CUDA_CHECK(cudaGetLastError());
  MOELAB_CUDA_CHECK(cudaMemcpy(out, p + kTileBytes, kOut, cudaMemcpyDeviceToHost));
  MOELAB_CUDA_CHECK(cudaFree(buf));
}

}  // namespace moelab::cuda
