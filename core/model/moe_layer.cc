#include "core/model/moe_layer.h"

#include <algorithm>
#include <stdexcept>
#include <utility>

#include "core/comm/communicator.h"

namespace moelab {

template <typename T>
MoeLayer<T>::MoeLayer(const ModelConfig& model, const MoEConfig& moe,
                      std::unique_ptr<MoeExperts<T>> experts, BackendMemory* memory,
                      int expert_first, int expert_count)
    : shape_(model, moe),
      experts_(std::move(experts)),
      memory_(memory),
      exchange_(memory, shape_.experts) {
  if (!experts_) throw std::invalid_argument("MoeLayer: no MoE ops");
  expert_count_ = shape_.experts;
  if (expert_count >= 0) SetExpertShard(expert_first, expert_count);
}

template <typename T>
void MoeLayer<T>::SetExpertShard(int first, int count) {
  if (first < 0 || count < 1 || first + count > shape_.experts) {
    throw std::invalid_argument("MoeLayer: expert shard outside the layer's experts");
  }
  expert_first_ = first;
  expert_count_ = count;
}

template <typename T>
Communicator* MoeLayer<T>::ExpertGroup() const {
  Communicator* ep = MoeExpertParallel();
  if (expert_count_ == shape_.experts) return ep;
  const int J = ep ? shape_.experts / ep->world_size() : shape_.experts;
  if (!ep || expert_first_ != ep->rank() * J || expert_count_ != J) {
    throw std::logic_error(
        "MoeLayer: the sharded experts are not this rank's expert-parallel block");
  }
  return ep;
}

template <typename T>
size_t MoeLayer<T>::workspace_bytes() const {
  return experts_->workspace_bytes() + (memory_->is_host() ? exchange_.workspace_bytes() : 0);
}

template <typename T>
double MoeLayer<T>::Forward(const MoeWeights<T>& w, const T* bias, const T* x, int n, T* y,
                            int64_t* counts) {
  n_ = n;
  if (n == 0) {
    if (counts) std::fill(counts, counts + shape_.experts, int64_t{0});
    return shape_.aux_loss ? AuxLoss(0) : 0.0;  // the hook is collective: join it with no tokens
  }
  Communicator* ep = ExpertGroup();
  ep_active_ = ep != nullptr;
  experts_->Reserve(n, ep_active_);
  experts_->Route(w.router, bias, x, n, counts);
  const double aux = shape_.aux_loss ? AuxLoss(n) : 0.0;
  const int64_t* offsets = experts_->Dispatch(x);

  // The experts, routed and shared. Under expert parallelism the routed experts run on the rows
  // received for the held experts, and their outputs go back to their tokens.
  rows_ = MoeRoutedRows{};
  if (ep) {
    if (!offsets) throw std::logic_error("MoeLayer: expert parallelism needs the host offsets");
    exchange_.Plan(*ep, offsets);
    const MoeRowBuffers owned = experts_->OwnedRows(exchange_.owned_rows());
    const MoeRowBuffers local = experts_->LocalRows();
    exchange_.ToOwners(*ep, local.x, owned.x, local.row_bytes);
    rows_ = {exchange_.owned_offsets().data() + expert_first_, expert_count_,
             exchange_.owned_rows(), true};
    experts_->ExpertsForward(w, x, rows_, y);
    exchange_.FromOwners(*ep, owned.y, local.y, local.row_bytes);
  } else {
    experts_->ExpertsForward(w, x, rows_, y);
  }
  experts_->Combine(y);
  return aux;
}

template <typename T>
void MoeLayer<T>::Backward(const MoeWeights<T>& w, const MoeWeights<T>& g, const T* x, const T* dy,
                           int n, T* dx) {
  if (n != n_) throw std::invalid_argument("MoeLayer::Backward: n differs from Forward's");
  if (n == 0) return ZeroGrads(g);

  // Combine backward (gate gradients; expert-output gradients over the saved outputs), then the
  // route backward. With the batch's statistics (AuxLoss) this piece's share of the batch
  // objective's gradient is coef·E·f_i/N per token and score; the data-parallel mean multiplies
  // it by N/n, so the ops (which form coef·E·f_i/n from counts and n) get coef·n/N. n/N is 1
  // exactly in one process, so that gradient keeps its bits.
  experts_->CombineBackward(dy);
  experts_->RouteBackward(PieceAuxCoef(shape_, n, batch_tokens_));

  // The experts' backward and the router weight gradient. Under expert parallelism the output
  // gradients travel to the owners and the input gradients come back (the reverse of Forward's
  // exchanges, with its plan).
  if (ep_active_) {
    Communicator* ep = MoeExpertParallel();
    if (ep == nullptr) {
      throw std::logic_error(
          "MoeLayer::Backward: expert parallelism was switched off after Forward");
    }
    const MoeRowBuffers owned = experts_->OwnedRows(exchange_.owned_rows());
    const MoeRowBuffers local = experts_->LocalRows();
    exchange_.ToOwners(*ep, local.y, owned.y, local.row_bytes);
    experts_->ExpertsBackward(w, g, x, dy, rows_, dx);
    exchange_.FromOwners(*ep, owned.dx, local.dx, local.row_bytes);
  } else {
    experts_->ExpertsBackward(w, g, x, dy, rows_, dx);
  }
  // Dispatch backward and the router's dx, after the experts' (dx is theirs while they run).
  experts_->DispatchBackward(w.router, dx);
}

template <typename T>
double MoeLayer<T>::AuxLoss(int n) {
  batch_tokens_ = n;
  if (!batch_hook_) {
    experts_->SetAuxCounts(nullptr);
    return n > 0 ? experts_->LocalAuxLoss(shape_, n) : 0.0;
  }
  const int E = shape_.experts;
  batch_counts_.assign(E, 0);
  score_sums_.assign(E, 0.0);
  if (n > 0) experts_->AuxStatistics(batch_counts_.data(), score_sums_.data());
  MoeBatchStats stats{E, batch_counts_.data(), score_sums_.data(), &batch_tokens_};
  batch_hook_(moe_layer_, stats);
  if (n > 0) experts_->SetAuxCounts(batch_counts_.data());
  return SwitchAuxLoss(shape_, batch_counts_.data(), score_sums_.data(), batch_tokens_);
}

template <typename T>
void MoeLayer<T>::ZeroGrads(const MoeWeights<T>& g) {
  const size_t d = shape_.d, wsize = static_cast<size_t>(shape_.hidden) * d;
  memory_->Zero(g.router, sizeof(T) * shape_.experts * d);
  for (T* p : {g.w1, g.w3, g.w2}) memory_->Zero(p, sizeof(T) * expert_count_ * wsize);
  if (shape_.shared > 0) {
    for (T* p : {g.shared_w1, g.shared_w3, g.shared_w2}) {
      memory_->Zero(p, sizeof(T) * shape_.shared * wsize);
    }
  }
}

template class MoeLayer<float>;
template class MoeLayer<double>;

}  // namespace moelab
