// Launchers of the device-shaped grouped GEMM (grouped_gemm_device.h; device code in
// grouped_gemm_device.cuh).
#include <cuda_runtime.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "kernels/cuda/grouped_gemm_device.cuh"
#include "kernels/cuda/grouped_gemm_device.h"

namespace moelab::cuda {

namespace {

using ggemm::ExpertTensors;
using ggemm::Op;
using ggemm::Problem;

// The workspace: problems [E] (16-byte aligned: it starts the workspace), then tile_begin [E+1].
Problem* Problems(void* workspace) { return static_cast<Problem*>(workspace); }
int* TileBegin(void* workspace, int experts) {
  return reinterpret_cast<int*>(Problems(workspace) + experts);
}

template <Op kOp>
void SetSmemLimitOnce() {
  // The attribute sticks per device and kernel: set once per thread and device, not on every
  // launch (a graph capture then records only the two launches).
  static thread_local int done_for_device = -1;
  int device = 0;
  MOELAB_CUDA_CHECK(cudaGetDevice(&device));
  if (done_for_device == device) return;
  MOELAB_CUDA_CHECK(cudaFuncSetAttribute(ggemm::GroupedGemmKernel<kOp>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(ggemm::kSmemBytes)));
  done_for_device = device;
}

// The shape kernel for kOp, then the persistent GEMM over every expert's tiles.
template <Op kOp>
void RunProduct(const ExpertTensors& t, void* workspace, cudaStream_t stream, const char* what) {
  Problem* problems = Problems(workspace);
  int* tile_begin = TileBegin(workspace, t.experts);
  ggemm::ShapeKernel<<<1, ggemm::kShapeThreads, 0, stream>>>(kOp, t, problems, tile_begin);
  CheckLaunch(what);
  SetSmemLimitOnce<kOp>();
  ggemm::GroupedGemmKernel<kOp>
      <<<DeviceGroupedGemmBlocks(), ggemm::kThreads, ggemm::kSmemBytes, stream>>>(
          problems, tile_begin, t.experts);
  CheckLaunch(what);
}

void Require(int experts, int d, int hidden, const void* workspace, const char* what) {
  std::string why;
  if (!DeviceGroupedGemmSupports(d, hidden, &why)) {
    throw std::invalid_argument(std::string(what) + ": " + why);
  }
  if (experts < 1) throw std::invalid_argument(std::string(what) + ": no experts");
  if (reinterpret_cast<uintptr_t>(workspace) % 16 != 0) {
    throw std::invalid_argument(std::string(what) + ": workspace not 16-byte aligned");
  }
}

}  // namespace

bool DeviceGroupedGemmSupports(int d, int hidden, std::string* why) {
  if (d > 0 && hidden > 0 && d % 8 == 0 && hidden % 8 == 0) return true;
  if (why) {
    *why =
        "d_model and moe.expert_hidden must be positive multiples of 8 (16-byte rows for "
        "cp.async), got " +
        std::to_string(d) + " and " + std::to_string(hidden);
  }
  return false;
}

size_t DeviceGroupedGemmWorkspaceBytes(int experts) {
  return sizeof(Problem) * experts + sizeof(int) * (experts + 1);
}

int DeviceGroupedGemmBlocks() {
  static thread_local int device = -1, blocks = 0;
  int current = 0;
  MOELAB_CUDA_CHECK(cudaGetDevice(&current));
  if (current != device) {
    int sms = 0;
    MOELAB_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, current));
    blocks = 2 * sms;
    device = current;
  }
  return blocks;
}

void DeviceGroupedGemmResources(int* registers, int* local_bytes) {
  cudaFuncAttributes attr{};
  MOELAB_CUDA_CHECK(cudaFuncGetAttributes(&attr, ggemm::GroupedGemmKernel<Op::kGateUp>));
  *registers = attr.numRegs;
  *local_bytes = static_cast<int>(attr.localSizeBytes);
}

void MoeExpertsForwardDevice(const bf16* xe, const int64_t* offsets, int experts, int d, int hidden,
                             const bf16* w1, const bf16* w3, const bf16* w2, bf16* h1, bf16* h3,
                             bf16* act, bf16* ye, void* workspace, cudaStream_t stream) {
  Require(experts, d, hidden, workspace, "MoeExpertsForwardDevice");
  ExpertTensors t{};
  t.offsets = offsets, t.experts = experts, t.d = d, t.hidden = hidden;
  t.xe = xe, t.w1 = w1, t.w3 = w3, t.w2 = w2;
  t.h1 = h1, t.h3 = h3, t.act = act, t.ye = ye;
  RunProduct<Op::kGateUp>(t, workspace, stream, "MoeExpertsForwardDevice (gate and up)");
  RunProduct<Op::kDown>(t, workspace, stream, "MoeExpertsForwardDevice (down)");
}

void MoeExpertsBackwardDevice(const bf16* xe, const int64_t* offsets, int experts, int d,
                              int hidden, const bf16* w1, const bf16* w3, const bf16* w2,
                              const bf16* h1, const bf16* h3, const bf16* act, const bf16* dye,
                              bf16* dxe, float* dw1, float* dw3, float* dw2, bf16* scratch,
                              void* workspace, cudaStream_t stream) {
  Require(experts, d, hidden, workspace, "MoeExpertsBackwardDevice");
  ExpertTensors t{};
  t.offsets = offsets, t.experts = experts, t.d = d, t.hidden = hidden;
  t.xe = xe, t.w1 = w1, t.w3 = w3, t.w2 = w2, t.dye = dye;
  // The epilogues only read h1, h3 and act; the tensors' struct holds them non-const for the
  // forward's outputs.
  t.h1 = const_cast<bf16*>(h1), t.h3 = const_cast<bf16*>(h3), t.act = const_cast<bf16*>(act);
  t.dh = scratch, t.dxe = dxe, t.dw1 = dw1, t.dw3 = dw3, t.dw2 = dw2;
  RunProduct<Op::kDact>(t, workspace, stream, "MoeExpertsBackwardDevice (dact, SwiGLU)");
  RunProduct<Op::kDx>(t, workspace, stream, "MoeExpertsBackwardDevice (dxe)");
  RunProduct<Op::kWgrad13>(t, workspace, stream, "MoeExpertsBackwardDevice (dW1, dW3)");
  RunProduct<Op::kWgrad2>(t, workspace, stream, "MoeExpertsBackwardDevice (dW2)");
}

}  // namespace moelab::cuda
