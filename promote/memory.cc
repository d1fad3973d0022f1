// Memory per device of a planned run: the engine's parameter, gradient, optimizer-state and
// activation arenas, computed from the config alone (a promoted model may not fit here). The
// model's activation arena is the model's own layout (Model::ActivationElements with the CPU
// backend's attention needs); tests/promote checks the whole against Model::activation_bytes()
// of real models.
#include "promote/memory.h"

#include <algorithm>
#include <cstddef>

#include "core/flops.h"
#include "core/model/attention_dims.h"
#include "core/model/backend.h"
#include "core/model/cuda_backend.h"
#include "core/model/model.h"
#include "kernels/cpu/attention.h"

namespace moelab::promote {

size_t ActivationElements(const RunConfig& c, int batch, int threads) {
  // The arena as Model::Impl::Reserve lays it out, with what the CPU backend's attention keeps
  // (the probabilities, and the capped logits when soft-capping) and its per-thread scratch.
  cpu::AttentionDims dims = AttentionDimsOf(c.model);
  dims.batch = batch;
  size_t total = Model<float>::ActivationElements(c, batch, ProbabilitiesSaved(dims),
                                                  cpu::AttentionScratchSize(dims, threads));
  // Reserve's other buffers, in floats: token ids and targets (int32), the cross-entropy rows
  // (2n + 2 doubles).
  const size_t n = static_cast<size_t>(batch) * c.model.seq_len;
  total += 2 * n + 2 * (2 * n + 2);
  // Each MoE layer's dispatch and expert buffers, as CpuMoeExperts::Reserve (core/model/cpu_moe.h)
  // sizes them for n tokens (the layer has no static sizing of its own; tests/promote checks this
  // against MoeLayer::workspace_bytes of real models).
  if (c.moe.enabled()) {
    const size_t E = c.moe.experts_total, k = c.moe.experts_active, EH = c.moe.expert_hidden,
                 sh = c.moe.shared_experts, d = c.model.d_model;
    const size_t nk = n * k;
    const size_t chunks = std::clamp<size_t>((n + 511) / 512, 1, 8);
    const size_t per = 2 * n * E + 5 * nk + 3 * nk * d + 3 * nk * EH + 3 * sh * n * EH +
                       (sh > 1 ? (sh - 1) * n * d : 0) + (nk + sh * n) * 2 * EH +
                       (chunks > 1 ? sh * chunks * 3 * EH * d : 0) + 2 * (2 * E + 1);
    total += per * MoeLayers(c.model, c.moe);
  }
  return total;
}

MemoryEstimate EstimateMemory(const RunConfig& c, const PromoteLayout& layout) {
  MemoryEstimate m;
  if (layout.device == "cuda") {
    // The trainer's own device plan (the same one it checks free memory against).
    RunConfig on_device = c;
    on_device.train.device = "cuda";
    on_device.dist.expert_parallel = std::max(1, layout.ep);
    const int dp = std::max(1, layout.ranks / std::max(1, layout.ep));
    const int local_batch = std::max(1, (c.train.batch_size + dp - 1) / dp);
    const int micro = c.train.micro_batch > 0 && c.train.micro_batch < local_batch
                          ? c.train.micro_batch
                          : local_batch;
    try {
      const DeviceMemoryPlan plan = PlanCudaMemory(on_device, micro, local_batch);
      m.params = plan.params;
      m.grads = plan.grads;
      m.optimizer = plan.optimizer;
      m.activations = plan.activations;
      m.runtime = plan.runtime;
      m.basis = "cuda";
      return m;
    } catch (const std::runtime_error&) {
      // A build without CUDA: the CPU arenas below (fp32 masters as on the device).
    }
  }
  const ParamCounts pc = CountParams(c);
  double params = static_cast<double>(pc.total);
  double state = static_cast<double>(OptimizerStateElements(c) + OptimizerWorkspaceElements(c));
  const int ep = std::max(1, layout.ep);
  if (ep > 1 && c.moe.enabled()) {
    // Routed experts are split over the EP group; the rest is replicated.
    const double experts = static_cast<double>(pc.routed);
    const double frac = (params - experts + experts / ep) / params;
    params *= frac;
    state *= frac;
  }
  const int dp = std::max(1, layout.ranks / ep);
  const int local_batch = std::max(1, (c.train.batch_size + dp - 1) / dp);
  m.params = 4 * params;
  m.grads = 4 * params;
  m.optimizer = 4 * state;
  m.activations =
      4.0 * static_cast<double>(ActivationElements(c, local_batch, std::max(1, layout.threads)));
  return m;
}

}  // namespace moelab::promote
