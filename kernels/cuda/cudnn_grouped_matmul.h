// cuDNN's MoE grouped matmul (backend API, CUDNN_BACKEND_OPERATION_MOE_GROUPED_MATMUL_DESCRIPTOR,
// mode NONE; cuDNN 9.18 or later, the first its support matrix lists): out[r] = tok[r] · W_eᵀ for
// the rows r of expert e, where each expert's first row is read from device memory when the kernel
// runs. Unlike cuBLAS's grouped GEMM (kernels/cuda/gemm.h, GemmGrouped), whose per-group shapes
// are host arrays, nothing here needs the routing's row counts on the host: the expert products of
// a layer's forward can be issued without the device-to-host copy and stream synchronisation that
// cuBLAS needs (issue 25, item 2).
//
// Only the forward products: cuDNN 9.19 has no weight-gradient twin (its MOE_GROUPED_MATMUL_BWD
// descriptor comes with 9.22), and its MoE engines take only a "ColumnMajor" weight (B_e [k, n]
// with k contiguous: W stored [E, n, k], the model's projection layout). An input gradient dy·W
// (B_e = W_e, n contiguous) has no engine without a transposed copy of the weights: cuDNN's
// heuristics propose none on Hopper and log weight_layout != "ColumnMajor".
//
// Not yet run on a GPU (docs/cuda.md): the descriptors are checked on the CPU (cuDNN finalizes an
// operation without a device, and refuses wrong shapes there), and so are the heuristics' engine
// proposals for a described device (EnginesProposed); the execution plan, which needs a cuDNN
// handle and so a GPU, is built on the first Run.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "kernels/cuda/device.h"

namespace moelab::cuda {

struct GroupedMatmulShape {
  int experts = 0;
  // All experts' rows, in expert order: expert e's run from first_row[e] to first_row[e + 1]
  // (to `rows` for the last expert).
  int64_t rows = 0;
  int k = 0, n = 0;  // the weights are stored [E, n, k] (out by in): B_e = W_eᵀ, y = x·Wᵀ
};

// True when this build has cuDNN, the loaded cuDNN is 9.18 or later and a GPU is usable; otherwise
// false and *why (when not null) names what is missing.
bool CudnnGroupedMatmulAvailable(std::string* why = nullptr);
// Whether cuDNN `version` (cudnnGetVersion's form, e.g. 91900) has the operation; else false and
// *why names the version and the one needed. (The availability check above, on the loaded one.)
bool CudnnVersionHasGroupedMatmul(size_t version, std::string* why = nullptr);
// The loaded cuDNN's version (cudnnGetVersion, e.g. 91900); 0 in a build without cuDNN.
size_t CudnnVersion();

// One grouped product of fixed shape: the descriptors are built (and cuDNN's checks run) in the
// constructor, which throws std::invalid_argument naming cuDNN's refusal; the execution plan and
// its workspace on the first Run.
class CudnnGroupedMatmul {
 public:
  explicit CudnnGroupedMatmul(const GroupedMatmulShape& shape);
  ~CudnnGroupedMatmul();
  CudnnGroupedMatmul(const CudnnGroupedMatmul&) = delete;
  CudnnGroupedMatmul& operator=(const CudnnGroupedMatmul&) = delete;

  // tok [rows, k], w [E, n, k], out [rows, n] overwritten: bf16 with fp32 accumulation;
  // first_row [E] int32, on the device. Asynchronous on `stream`.
  void Run(const bf16* tok, const bf16* w, const int32_t* first_row, bf16* out,
           cudaStream_t stream = nullptr);
  // How many engine configurations cuDNN's heuristics propose for this product (mode A, else the
  // fallback list: what the first Run chooses from) on the device that `device_json` describes
  // (cuDNN's device-property JSON, CUDNN_ATTR_DEVICEPROP_JSON_REPRESENTATION), without that device.
  // cuDNN needs a loadable libcuda.so.1 for this (the toolkit's stub will do: nothing runs).
  int64_t EnginesProposed(const std::string& device_json) const;
  const GroupedMatmulShape& shape() const { return shape_; }

 private:
  struct Impl;
  GroupedMatmulShape shape_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace moelab::cuda
