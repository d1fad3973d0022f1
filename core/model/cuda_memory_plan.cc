// The device memory plan of a CUDA run (core/model/cuda_backend.h): what the model, the
// gradient accumulator and the optimizer allocate, from the config alone (no GPU needed), and
// the check that it fits before a run starts.
#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>
#include <string>

#include "core/device.h"
#include "core/flops.h"
#include "core/model/cuda_backend.h"
#include "core/model/model.h"
#include "core/optimizer_traits.h"

#if MOELAB_HAVE_CUDA
#include "core/model/attention_dims.h"
#include "core/model/cuda_backend_choices.h"
#include "core/model/cuda_moe.h"
#include "kernels/cuda/device.h"
#endif

namespace moelab {

#if MOELAB_HAVE_CUDA

DeviceMemoryPlan PlanCudaMemory(const RunConfig& c, int micro_batch, int local_batch) {
  DeviceMemoryPlan plan;
  plan.micro_batch = micro_batch;
  const bool use_bf16 = c.train.effective_precision() == "bf16";
  // Expert parallelism: a rank holds 1/EP of the routed experts (their weights, gradients and
  // optimizer state; Muon or AdamW alike keep at most two state elements and one Newton–Schulz
  // element per expert weight).
  const int ep = c.moe.enabled() ? std::max(1, c.dist.expert_parallel) : 1;
  const ParamCounts counts = CountParams(c);
  const double not_held = static_cast<double>(counts.routed) * (ep - 1) / ep;
  const bool muon = TraitsOf(c.optimizer).muon;
  const double np = static_cast<double>(counts.total) - not_held;
  plan.params = 4 * np + (use_bf16 ? 2 * np : 0);
  plan.grads = 4 * np + (micro_batch < local_batch ? 4 * np : 0);
  // Muon's Newton–Schulz: the same-shape bank plus one ping buffer of the largest bank (bounded
  // here by the bank itself), in the compute precision.
  const double ns_elem = use_bf16 ? 2 : 4;
  plan.optimizer =
      4.0 * (static_cast<double>(OptimizerStateElements(c)) - (muon ? 1 : 2) * not_held) +
      2 * ns_elem * (static_cast<double>(OptimizerWorkspaceElements(c)) - (muon ? not_held : 0));
  // The run's experts path sizes the MoE buffers below (the same selection its backend installs).
  const cuda::ScopedKernelSelection kernels(KernelSelectionOf(c.train.kernels));
  // The model's own activation layout with this backend's attention needs.
  const bool flash = ChooseFlash(c);
  cpu::AttentionDims dims = AttentionDimsOf(c.model);
  dims.batch = micro_batch;
  const size_t n = static_cast<size_t>(micro_batch) * c.model.seq_len;
  double act =
      4.0 * static_cast<double>(Model<float>::ActivationElements(
                c, micro_batch, AttentionSaved(flash, dims), AttentionScratch(flash, dims)));
  // Token ids, the cross-entropy rows, and the embedding backward's radix-sort scratch: cub sizes
  // it through a device query, so the plan (which needs no GPU) takes a bound: double-buffered
  // int32 keys and values, plus 1 MiB.
  act += 8.0 * n + 8.0 * (2 * n + 2) + 16.0 * n + (1 << 20);
  if (use_bf16) act += 2.0 * static_cast<double>(CastElements(c.model, n));
  if (c.moe.enabled()) {
    const bool shared_xe = cudamodel::SharedExpertInputs(use_bf16, ep > 1);
    act += static_cast<double>(MoeLayers(c.model, c.moe)) *
           static_cast<double>(
               cudamodel::DeviceMoe::Bytes(c.moe, c.model.d_model, n, use_bf16, shared_xe));
    act += static_cast<double>(
        cudamodel::MoeScratch::Bytes(c.moe, c.model.d_model, n, use_bf16, shared_xe));
    if (ep > 1) {  // the owned rows per layer and the exchange buffer, for balanced routing
      const double rows = static_cast<double>(n) * c.moe.experts_active;
      act += static_cast<double>(MoeLayers(c.model, c.moe)) *
             cudamodel::DeviceMoe::OwnedBytes(c.moe, c.model.d_model, rows, use_bf16);
    }
  }
  plan.activations = act;
  plan.runtime = 1.0 * (1 << 30);
  return plan;
}

int LargestFittingMicroBatch(const RunConfig& c, int local_batch, double budget_bytes) {
  for (int m = local_batch; m >= 1; --m) {
    if (PlanCudaMemory(c, m, local_batch).total() <= budget_bytes) return m;
  }
  return 0;
}

void RequireCudaMemory(const RunConfig& c, int local_batch, bool print) {
  const int micro = c.train.micro_batch > 0 && c.train.micro_batch < local_batch
                        ? c.train.micro_batch
                        : local_batch;
  const DeviceMemoryPlan plan = PlanCudaMemory(c, micro, local_batch);
  size_t free_bytes = 0, total_bytes = 0;
  MOELAB_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  constexpr double kGiB = 1024.0 * 1024 * 1024;
  if (print) {
    fmt::print(stderr, "moelab train: device memory estimate: {} ({:.1f} GiB free of {:.1f})\n",
               plan.Describe(), free_bytes / kGiB, total_bytes / kGiB);
  }
  if (plan.total() <= static_cast<double>(free_bytes)) return;
  const int fits = LargestFittingMicroBatch(c, local_batch, static_cast<double>(free_bytes));
  throw DeviceError(fmt::format(
      "the run needs about {:.1f} GiB of device memory ({}) but {:.1f} GiB are free; {}",
      plan.total() / kGiB, plan.Describe(), free_bytes / kGiB,
      fits > 0 ? fmt::format("set train.micro_batch to {} or less (the largest that fits)", fits)
               : std::string("no micro-batch fits: use a smaller model or more GPUs")));
}

#else  // no CUDA in this build: every entry point says so.

DeviceMemoryPlan PlanCudaMemory(const RunConfig&, int, int) {
  throw std::runtime_error("this moelab was built without CUDA");
}
int LargestFittingMicroBatch(const RunConfig&, int, double) {
  throw std::runtime_error("this moelab was built without CUDA");
}
void RequireCudaMemory(const RunConfig&, int, bool) {
  throw DeviceError("this moelab was built without CUDA");
}

#endif

std::string DeviceMemoryPlan::Describe() const {
  constexpr double kGiB = 1024.0 * 1024 * 1024;
  return fmt::format(
      "params {:.2f} GiB, grads {:.2f} GiB, optimizer {:.2f} GiB, activations {:.2f} GiB "
      "(micro-batch {}), runtime {:.2f} GiB: total {:.2f} GiB",
      params / kGiB, grads / kGiB, optimizer / kGiB, activations / kGiB, micro_batch,
      runtime / kGiB, total() / kGiB);
}

}  // namespace moelab
