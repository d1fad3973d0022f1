// The decoder-only MoE transformer: parameters in one flat arena with per-tensor views, a
// hand-written backward pass, and per-step statistics (per-head max logits, expert loads).
// Templated on the scalar type: float for training, double for finite-difference checks.
// Written once for every device: it runs over a backend (core/model/backend.h) chosen by
// train.device, whose memory holds the arenas (host memory on the CPU, device memory on CUDA).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/config.h"
#include "core/model/moe.h"
#include "core/param_info.h"
#include "core/step_stats.h"

namespace moelab {

template <typename T>
class Backend;

// Rows of logits the LM head + cross-entropy form at once: all `rows` while rows·vocab is at most
// LogitChunkElements() (default 2^24: 64 MiB in fp32), else chunks of that many elements.
int LogitChunkRows(int rows, int vocab);
long LogitChunkElements();
// For tests (several chunks on a small model) and memory experiments; not thread-safe: set it
// before models run.
void SetLogitChunkElements(long elements);

template <typename T>
class Model {
 public:
  // On MakeBackend<T>(config): the CPU, or the GPU for train.device "cuda" (float only).
  explicit Model(const RunConfig& config, ExpertShard shard = {});
  Model(const RunConfig& config, ExpertShard shard, std::unique_ptr<Backend<T>> backend);
  // The parameter layout of the whole (unsharded) model and its arena size, without allocating
  // it: the checkpoint format.
  static std::vector<ParamInfo> FullLayout(const RunConfig& config, size_t* num_params);
  // Elements of the activation arena for `batch` sequences, given the backend's attention needs
  // at that batch (saved per layer, scratch): the device memory plan (core/model/cuda_backend.h).
  static size_t ActivationElements(const RunConfig& config, int batch, size_t attention_saved,
                                   size_t attention_scratch);
  ~Model();
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  // Deterministic initialisation from the seed (normal(0, init_std); output projections scaled
  // by 1/sqrt(2·layers); norms at 1; router bias at 0).
  void Init(uint64_t seed);

  const std::vector<ParamInfo>& param_infos() const;
  size_t num_params() const;
  // The arenas, in the backend's memory (host pointers only on the CPU backend).
  T* params();
  T* grads();
  const T* params() const;
  Backend<T>& backend();
  const Backend<T>& backend() const;
  // Host copies of the parameter arena (checkpoints, tests); WriteParams calls ParamsChanged.
  void ReadParams(T* host) const;
  void WriteParams(const T* host);
  // After an optimizer step or QK-Clip changed params(): a backend computing on a copy (CUDA's
  // bf16 weights) refreshes it. Free on the CPU.
  void ParamsChanged();
  // Non-trainable state saved in checkpoints (the aux-loss-free router biases), on the host;
  // every forward uses its current values.
  std::vector<T>& router_bias();
  const std::vector<T>& router_bias() const;

  int moe_layers() const;  // number of MoE layers (layers - dense_layers, or 0 if dense)
  // Bytes of the activation arena and the MoE layers' dispatch buffers as sized so far (they
  // grow to the largest batch seen; 0 before the first forward). The promotion planner's
  // memory estimate (promote/memory.cc) is checked against it.
  size_t activation_bytes() const;

  // tokens: [B, seq_len + 1]; inputs tokens[:, :S], targets tokens[:, 1:].
  // Returns the training objective (cross-entropy + aux + z-loss) and overwrites grads with its
  // gradient. stats may be null.
  double ForwardBackward(const int32_t* tokens, int batch, StepStats* stats);
  // Objective without gradients (evaluation, finite differences).
  double Forward(const int32_t* tokens, int batch, StepStats* stats);
  // Aux-loss-free balancing: b_i += rate·sign(mean load − load_i) from the step's global counts
  // [moe_layers * experts_total].
  void UpdateRouterBias(const std::vector<int64_t>& counts, double rate);
  // Global-batch statistics for the Switch aux loss of every MoE layer (core/model/moe.h,
  // MoeBatchStatsHook; the hook gets the MoE layer index 0 … moe_layers()−1). Null: this call's
  // tokens are the batch.
  void SetMoeBatchStatsHook(MoeBatchStatsHook hook);
  // Overlap (issue 23): called in ForwardBackward's backward pass each time the gradients of a
  // contiguous arena range are final, in backward order: [final_norm, arena) (final norm, LM
  // head), each layer's range from the last layer to the first, then [0, layer 0) (embedding).
  // The ranges tile the arena from its end to its start. Null: none.
  using GradReadyHook = std::function<void(size_t begin, size_t end)>;
  void SetGradReadyHook(GradReadyHook hook);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

extern template class Model<float>;
extern template class Model<double>;

}  // namespace moelab
