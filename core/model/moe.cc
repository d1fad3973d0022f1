#include "core/model/moe.h"

#include <stdexcept>
#include <string>

#include "core/comm/communicator.h"

namespace moelab {

namespace {

// Per thread: the trainer sets it on the thread that runs the model (tests run several ranks as
// threads of one process).
thread_local Communicator* g_expert_parallel = nullptr;

}  // namespace

void SetMoeExpertParallel(Communicator* comm) {
  g_expert_parallel = comm != nullptr && comm->world_size() > 1 ? comm : nullptr;
}

Communicator* MoeExpertParallel() { return g_expert_parallel; }

MoeShape::MoeShape(const ModelConfig& model, const MoEConfig& moe)
    : d(model.d_model),
      hidden(moe.expert_hidden),
      experts(moe.experts_total),
      top_k(moe.experts_active),
      shared(moe.shared_experts),
      sigmoid(moe.router == "sigmoid"),
      aux_loss(moe.balance == "aux_loss"),
      aux_coef(moe.aux_loss_coef),
      route_scale(moe.route_scale) {
  if (experts <= 0 || top_k <= 0 || top_k > experts) {
    throw std::invalid_argument("MoE layer: need 0 < experts_active <= experts_total");
  }
  if (moe.router != "softmax" && moe.router != "sigmoid") {
    throw std::invalid_argument("MoE layer: unknown router '" + moe.router + "'");
  }
  if (shared < 0 || hidden <= 0 || d <= 0) throw std::invalid_argument("MoE layer: bad shapes");
}

double SwitchAuxLoss(const MoeShape& shape, const int64_t* counts, const double* score_sums,
                     int64_t tokens) {
  if (tokens <= 0) return 0.0;
  double acc = 0;
  for (int e = 0; e < shape.experts; ++e) acc += static_cast<double>(counts[e]) * score_sums[e];
  const double N = static_cast<double>(tokens);
  return shape.aux_coef * shape.experts * acc / (N * shape.top_k * N);
}

double PieceAuxCoef(const MoeShape& shape, int n, int64_t tokens) {
  if (!shape.aux_loss || tokens <= 0) return 0.0;
  return shape.aux_coef * (static_cast<double>(n) / static_cast<double>(tokens));
}

template <typename T>
void UpdateSelectionBias(T* bias, const int64_t* counts, int experts, double rate) {
  if (experts <= 0) return;
  int64_t total = 0;
  for (int e = 0; e < experts; ++e) total += counts[e];
  // Compare c_i·E with Σc instead of c_i with the mean so that "exactly average" is exact.
  for (int e = 0; e < experts; ++e) {
    const int64_t lhs = counts[e] * experts;
    const double sign = lhs < total ? 1.0 : (lhs > total ? -1.0 : 0.0);
    bias[e] = static_cast<T>(bias[e] + rate * sign);
  }
}

template void UpdateSelectionBias<float>(float*, const int64_t*, int, double);
template void UpdateSelectionBias<double>(double*, const int64_t*, int, double);

}  // namespace moelab
