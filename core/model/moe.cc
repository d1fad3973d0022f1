#include "core/model/moe.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "core/dist/communicator.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/moe_experts.h"
#include "kernels/cpu/moe_routing.h"
#include "kernels/cpu/swiglu.h"

namespace moelab {

namespace {

// Rows per GEMM in the router's row-chunked GEMMs. Fixed, so that the chunking (and with it
// every rounding) does not depend on the thread count.
constexpr int kRouterChunk = 256;

// C[n, cols] (= or +=) A[n, inner]·op(B), computed as fixed row chunks in a static OpenMP loop.
// Inside the loop OpenBLAS-openmp runs single-threaded, so the result is bit-identical for any
// thread count (a lone threaded GEMM splits, and rounds, by the thread count).
template <typename T>
void RowChunkedGemm(bool trans_b, int n, int cols, int inner, const T* a, const T* b, int ldb, T* c,
                    bool accumulate) {
  const int chunks = (n + kRouterChunk - 1) / kRouterChunk;
#pragma omp parallel for schedule(static)
  for (int i = 0; i < chunks; ++i) {
    const long r0 = static_cast<long>(i) * kRouterChunk;
    const int rows = static_cast<int>(std::min<long>(kRouterChunk, n - r0));
    cpu::Gemm(false, trans_b, rows, cols, inner, T(1), a + r0 * inner, inner, b, ldb,
              accumulate ? T(1) : T(0), c + r0 * cols, cols);
  }
}

// Row chunks of a shared expert in the expert-parallel schedule: about kSharedChunkRows rows
// each (the size of a routed expert's block at n = 2048, E = 8, k = 2), at most kMaxChunks so
// that the partial weight gradients stay small. A function of n only, never of the thread count.
constexpr int kSharedChunkRows = 512;
constexpr int kMaxSharedChunks = 8;
int SharedChunks(int n) {
  return std::clamp((n + kSharedChunkRows - 1) / kSharedChunkRows, 1, kMaxSharedChunks);
}

// Per thread: the trainer sets it on the thread that runs the model (tests run several ranks as
// threads of one process).
thread_local Communicator* g_expert_parallel = nullptr;

template <typename T>
void GrowTo(std::vector<T>& v, size_t n) {
  if (v.size() < n) v.resize(n);
}

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

template <typename T>
MoeLayer<T>::MoeLayer(const ModelConfig& model, const MoEConfig& moe)
    : shape_(model, moe), exchange_(&Host(), shape_.experts) {
  counts_.assign(shape_.experts, 0);
  offsets_.assign(shape_.experts + 1, 0);
  expert_count_ = shape_.experts;
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
void MoeLayer<T>::CheckShard(const Communicator* ep) const {
  if (expert_count_ == shape_.experts) return;
  const int J = ep ? shape_.experts / ep->world_size() : shape_.experts;
  if (!ep || expert_first_ != ep->rank() * J || expert_count_ != J) {
    throw std::logic_error(
        "MoeLayer: the sharded experts are not this rank's expert-parallel block");
  }
}

template <typename T>
size_t MoeLayer<T>::workspace_bytes() const {
  const size_t reals = logits_.size() + scores_.size() + gates_.size() + dgates_.size() +
                       xe_.size() + ye_.size() + dxe_.size() + h1_.size() + h3_.size() +
                       act_.size() + sh1_.size() + sh3_.size() + sact_.size() + sy_.size() +
                       scratch_.size() + shared_partial_.size() + xr_.size() + yr_.size() +
                       dxr_.size();
  const size_t ints = topk_.size() + row_token_.size() + slot_row_.size();
  return reals * sizeof(T) + ints * sizeof(int) + (counts_.size() + offsets_.size()) * 8 +
         exchange_.workspace_bytes();
}

template <typename T>
void MoeLayer<T>::Reserve(int n) {
  if (n <= capacity_) return;
  const size_t nn = n, nk = nn * shape_.top_k, E = shape_.experts, d = shape_.d, H = shape_.hidden,
               S = shape_.shared;
  logits_.resize(nn * E);
  scores_.resize(nn * E);
  topk_.resize(nk);
  gates_.resize(nk);
  dgates_.resize(nk);
  row_token_.resize(nk);
  slot_row_.resize(nk);
  xe_.resize(nk * d);
  ye_.resize(nk * d);
  dxe_.resize(nk * d);
  h1_.resize(nk * H);
  h3_.resize(nk * H);
  act_.resize(nk * H);
  sh1_.resize(S * nn * H);
  sh3_.resize(S * nn * H);
  sact_.resize(S * nn * H);
  sy_.resize(S > 1 ? (S - 1) * nn * d : 0);
  scratch_.resize((nk + S * nn) * 2 * H);
  const int chunks = SharedChunks(n);
  shared_partial_.resize(chunks > 1 ? S * chunks * 3 * H * d : 0);
  capacity_ = n;
}

// In the expert-parallel schedule one dynamic OpenMP loop runs, as tasks: the shared experts
// in fixed row chunks (listed first, being the largest), the routed experts, and in backward
// the router weight gradient (smallest, last), so the small tasks fill in behind the large ones
// and there is one fork/join per direction. Every task writes disjoint outputs and runs its
// GEMMs single-threaded (OpenBLAS-openmp does inside a parallel region), and the chunking
// depends on n only, so results are bit-identical whichever thread takes which task and for any
// thread count. Shared expert 0 writes y (dx) itself, the others write aside into sy_.
template <typename T>
void MoeLayer<T>::ExpertForward(const MoeWeights<T>& w, const T* x, T* y) {
  const int n = n_, d = shape_.d, H = shape_.hidden;
  const long wsize = static_cast<long>(H) * d, snh = static_cast<long>(n) * H;
  const long nd = static_cast<long>(n) * d;
  const int chunks = SharedChunks(n), chunk_rows = (n + chunks - 1) / chunks;
  auto shared = [&](int s, int r0, int rows) {
    T* out = s == 0 ? y : sy_.data() + (s - 1) * nd;
    const long hoff = s * snh + static_cast<long>(r0) * H;
    cpu::SwigluForward(x + static_cast<long>(r0) * d, rows, d, H, w.shared_w1 + s * wsize,
                       w.shared_w3 + s * wsize, w.shared_w2 + s * wsize, sh1_.data() + hoff,
                       sh3_.data() + hoff, sact_.data() + hoff, out + static_cast<long>(r0) * d);
  };
  // Held expert j (0 … expert_count_−1) is expert expert_first_ + j: its weights are block j,
  // its rows those of that expert.
  const int64_t* held_offsets = offsets_.data() + expert_first_;
  auto routed = [&](int j) {
    cpu::MoeExpertForward(j, xe_.data(), held_offsets, d, H, w.w1, w.w3, w.w2, h1_.data(),
                          h3_.data(), act_.data(), ye_.data());
  };
  if (expert_parallel_) {
    const int shared_tasks = shape_.shared * chunks;
#pragma omp parallel for schedule(dynamic, 1)
    for (int task = 0; task < shared_tasks + expert_count_; ++task) {
      if (task < shared_tasks) {
        const int r0 = (task % chunks) * chunk_rows;
        shared(task / chunks, r0, std::min(chunk_rows, n - r0));
      } else {
        routed(task - shared_tasks);
      }
    }
  } else {
    for (int j = 0; j < expert_count_; ++j) routed(j);
    for (int s = 0; s < shape_.shared; ++s) shared(s, 0, n);
  }
}

template <typename T>
void MoeLayer<T>::ExpertBackward(const MoeWeights<T>& w, const MoeWeights<T>& g, const T* x,
                                 const T* dy, T* dx) {
  const int n = n_, d = shape_.d, H = shape_.hidden;
  const long wsize = static_cast<long>(H) * d, snh = static_cast<long>(n) * H;
  const long nd = static_cast<long>(n) * d;
  // Routed rows (n·k, or the rows received for the owned experts under expert parallelism).
  const long nk = offsets_[shape_.experts];
  const int chunks = expert_parallel_ ? SharedChunks(n) : 1;
  const int chunk_rows = (n + chunks - 1) / chunks;
  // Shared expert s, rows r0..r0+rows (chunk c). Its weight gradients are per-chunk partial
  // sums (reduced below in chunk order) unless there is a single chunk. Scratch: routed experts
  // use the first n·k rows, shared expert s rows n·k + s·n + r0 onwards, so tasks never share.
  auto shared = [&](int s, int c, int r0, int rows) {
    T *dw1 = g.shared_w1 + s * wsize, *dw3 = g.shared_w3 + s * wsize,
      *dw2 = g.shared_w2 + s * wsize;
    if (chunks > 1) {
      dw1 = shared_partial_.data() + (static_cast<long>(s) * chunks + c) * 3 * wsize;
      dw3 = dw1 + wsize;
      dw2 = dw3 + wsize;
    }
    const long hoff = s * snh + static_cast<long>(r0) * H;
    const long xoff = static_cast<long>(r0) * d;
    cpu::SwigluBackward(x + xoff, rows, d, H, w.shared_w1 + s * wsize, w.shared_w3 + s * wsize,
                        w.shared_w2 + s * wsize, sh1_.data() + hoff, sh3_.data() + hoff,
                        sact_.data() + hoff, dy + xoff,
                        (s == 0 ? dx : sy_.data() + (s - 1) * nd) + xoff, dw1, dw3, dw2,
                        scratch_.data() + (nk + s * static_cast<long>(n) + r0) * 2 * H);
  };
  const int64_t* held_offsets = offsets_.data() + expert_first_;  // as in ExpertForward
  auto routed = [&](int j) {
    cpu::MoeExpertBackward(j, xe_.data(), held_offsets, d, H, w.w1, w.w3, w.w2, h1_.data(),
                           h3_.data(), act_.data(), ye_.data(), dxe_.data(), g.w1, g.w3, g.w2,
                           scratch_.data());
  };
  // d router = dzᵀ·x sums over tokens: one GEMM, never split (the split would change the sum).
  auto router = [&]() {
    cpu::Gemm(true, false, shape_.experts, d, n, T(1), logits_.data(), shape_.experts, x, d, T(0),
              g.router, d);
  };
  if (expert_parallel_) {
    const int shared_tasks = shape_.shared * chunks;
#pragma omp parallel for schedule(dynamic, 1)
    for (int task = 0; task < shared_tasks + expert_count_ + 1; ++task) {
      if (task < shared_tasks) {
        const int c = task % chunks, r0 = c * chunk_rows;
        shared(task / chunks, c, r0, std::min(chunk_rows, n - r0));
      } else if (task < shared_tasks + expert_count_) {
        routed(task - shared_tasks);
      } else {
        router();
      }
    }
    if (chunks > 1) {
      // g.shared = Σ_c partial_c, summed in chunk order for every element.
      for (int s = 0; s < shape_.shared; ++s) {
        const T* part = shared_partial_.data() + static_cast<long>(s) * chunks * 3 * wsize;
        T* outs[3] = {g.shared_w1 + s * wsize, g.shared_w3 + s * wsize, g.shared_w2 + s * wsize};
        for (int m = 0; m < 3; ++m) {
          T* out = outs[m];
#pragma omp parallel for schedule(static)
          for (long i = 0; i < wsize; ++i) {
            T acc = part[m * wsize + i];
            for (int c = 1; c < chunks; ++c) acc += part[(c * 3L + m) * wsize + i];
            out[i] = acc;
          }
        }
      }
    }
  } else {
    for (int j = 0; j < expert_count_; ++j) routed(j);
    for (int s = 0; s < shape_.shared; ++s) shared(s, 0, 0, n);
    router();
  }
}

template <typename T>
double MoeLayer<T>::Forward(const MoeWeights<T>& w, const T* bias, const T* x, int n, T* y,
                            int64_t* counts) {
  Reserve(n);
  n_ = n;
  if (n == 0) {
    std::fill(counts_.begin(), counts_.end(), int64_t{0});
    if (counts) std::copy(counts_.begin(), counts_.end(), counts);
    return shape_.aux_loss ? AuxLoss(0) : 0.0;  // the hook is collective: join it with no tokens
  }
  const int E = shape_.experts, k = shape_.top_k, d = shape_.d;
  const long nk = static_cast<long>(n) * k;

  // Route.
  RowChunkedGemm(/*trans_b=*/true, n, E, d, x, w.router, d, logits_.data(), false);
  cpu::MoeRoute(logits_.data(), n, E, k, shape_.sigmoid, bias, shape_.route_scale, scores_.data(),
                topk_.data(), gates_.data(), counts_.data());
  const double aux = shape_.aux_loss ? AuxLoss(n) : 0.0;
  if (counts) std::copy(counts_.begin(), counts_.end(), counts);

  // Dispatch.
  cpu::MoeDispatchPlan(topk_.data(), n, E, k, offsets_.data(), row_token_.data(), slot_row_.data());
  cpu::MoeGather(x, d, row_token_.data(), nk, xe_.data());

  // ExpertCompute, routed and shared. Under expert parallelism the routed experts run on the
  // rows received for the owned experts (swapped in), and their outputs go back to their tokens.
  Communicator* ep = g_expert_parallel;
  ep_active_ = ep != nullptr;
  CheckShard(ep);
  if (ep) {
    EpPlan(*ep);
    exchange_.ToOwners(*ep, xe_.data(), xr_.data(), sizeof(T) * shape_.d);
    std::swap(xe_, xr_);
    std::swap(offsets_, ep_offsets_);
    std::swap(ye_, yr_);
  }
  ExpertForward(w, x, y);
  if (ep) {
    std::swap(xe_, xr_);
    std::swap(offsets_, ep_offsets_);
    std::swap(ye_, yr_);
    exchange_.FromOwners(*ep, yr_.data(), ye_.data(), sizeof(T) * shape_.d);
  }
  // Extra shared experts were written aside; add them in expert order.
  const long nd = static_cast<long>(n) * d;
  for (int s = 1; s < shape_.shared; ++s) {
    const T* extra = sy_.data() + (s - 1) * nd;
    for (long i = 0; i < nd; ++i) y[i] += extra[i];
  }

  // Combine.
  cpu::MoeCombine(ye_.data(), slot_row_.data(), gates_.data(), n, k, d, y, shape_.shared > 0);
  return aux;
}

template <typename T>
void MoeLayer<T>::Backward(const MoeWeights<T>& w, const MoeWeights<T>& g, const T* x, const T* dy,
                           int n, T* dx) {
  if (n != n_) throw std::invalid_argument("MoeLayer::Backward: n differs from Forward's");
  const int E = shape_.experts, k = shape_.top_k, d = shape_.d, H = shape_.hidden;
  const long wsize = static_cast<long>(H) * d;
  if (n == 0) {  // no tokens: every gradient is zero
    std::fill(g.router, g.router + static_cast<long>(E) * d, T(0));
    for (T* p : {g.w1, g.w3, g.w2}) std::fill(p, p + expert_count_ * wsize, T(0));
    if (shape_.shared > 0) {
      for (T* p : {g.shared_w1, g.shared_w3, g.shared_w2})
        std::fill(p, p + shape_.shared * wsize, T(0));
    }
    return;
  }

  // Combine backward: gate gradients, and the expert-output gradients written over the saved
  // expert outputs (each row is read before it is overwritten).
  cpu::MoeCombineBackward(dy, ye_.data(), slot_row_.data(), gates_.data(), n, k, d, ye_.data(),
                          dgates_.data());

  // Route backward (gates and aux loss -> logits; the logits buffer is reused for dz). It only
  // needs the gate gradients, so the router weight gradient can run with the experts.
  // With the batch's statistics (AuxLoss) this piece's share of the batch objective's gradient
  // is coef·E·f_i/N per token and score; the data-parallel mean multiplies it by N/n, so the
  // kernel (which forms coef·E·f_i/n from counts and n) gets coef·n/N. n/N is 1 exactly in one
  // process, so that gradient keeps its bits.
  const bool aux = shape_.aux_loss && batch_tokens_ > 0;
  const double aux_coef = PieceAuxCoef(shape_, n, batch_tokens_);
  cpu::MoeRouteBackward(scores_.data(), topk_.data(), dgates_.data(),
                        aux ? batch_counts_.data() : counts_.data(), n, E, k, shape_.sigmoid,
                        shape_.route_scale, aux_coef, logits_.data());

  // ExpertCompute backward, routed and shared, and the router weight gradient; the first shared
  // expert's dx lands in dx. Under expert parallelism the output gradients travel to the owners
  // and the input gradients come back (the reverse of Forward's exchanges).
  Communicator* ep = ep_active_ ? g_expert_parallel : nullptr;
  if (ep_active_ && ep == nullptr) {
    throw std::logic_error("MoeLayer::Backward: expert parallelism was switched off after Forward");
  }
  if (ep) {
    exchange_.ToOwners(*ep, ye_.data(), yr_.data(), sizeof(T) * shape_.d);
    std::swap(xe_, xr_);
    std::swap(offsets_, ep_offsets_);
    std::swap(ye_, yr_);
    std::swap(dxe_, dxr_);
  }
  ExpertBackward(w, g, x, dy, dx);
  if (ep) {
    std::swap(xe_, xr_);
    std::swap(offsets_, ep_offsets_);
    std::swap(ye_, yr_);
    std::swap(dxe_, dxr_);
    exchange_.FromOwners(*ep, dxr_.data(), dxe_.data(), sizeof(T) * shape_.d);
  }
  const long nd = static_cast<long>(n) * d;
  for (int s = 1; s < shape_.shared; ++s) {
    const T* extra = sy_.data() + (s - 1) * nd;
    for (long i = 0; i < nd; ++i) dx[i] += extra[i];
  }

  // Dispatch backward: each token adds its k row gradients in slot order.
  cpu::MoeGatherBackward(dxe_.data(), slot_row_.data(), n, k, d, dx,
                         /*accumulate=*/shape_.shared > 0);

  // Router dx, after the experts' (dx is theirs while they run).
  RowChunkedGemm(/*trans_b=*/false, n, d, E, logits_.data(), w.router, d, dx, true);
}

template <typename T>
double MoeLayer<T>::AuxLoss(int n) {
  const int E = shape_.experts;
  batch_counts_.assign(counts_.begin(), counts_.end());
  score_sums_.assign(E, 0.0);
  // P's numerators: the normalised scores (softmax: the score; sigmoid: s_i/Σ_j s_j, nothing
  // where every score underflowed), summed per expert serially in token order (reproducible).
  for (int t = 0; t < n; ++t) {
    const T* s = scores_.data() + static_cast<long>(t) * E;
    double sum = 1.0;
    if (shape_.sigmoid) {
      sum = 0;
      for (int e = 0; e < E; ++e) sum += s[e];
      if (!(sum > 0)) continue;
    }
    for (int e = 0; e < E; ++e) score_sums_[e] += static_cast<double>(s[e]) / sum;
  }
  batch_tokens_ = n;
  if (batch_hook_) {
    MoeBatchStats stats{E, batch_counts_.data(), score_sums_.data(), &batch_tokens_};
    batch_hook_(moe_layer_, stats);
  }
  return SwitchAuxLoss(shape_, batch_counts_.data(), score_sums_.data(), batch_tokens_);
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

// Expert parallelism: the exchange's plan (core/model/expert_exchange.h) from this rank's
// dispatch offsets, and the owned rows' buffers (routed activations and backward scratch
// included) grown to the rows this rank will receive.
template <typename T>
void MoeLayer<T>::EpPlan(Communicator& ep) {
  exchange_.Plan(ep, offsets_.data());
  ep_offsets_ = exchange_.owned_offsets();
  const size_t R = exchange_.owned_rows(), H = shape_.hidden, d = shape_.d;
  const size_t local = static_cast<size_t>(n_) * shape_.top_k;
  for (std::vector<T>* v : {&xr_, &yr_, &dxr_}) GrowTo(*v, R * d);
  for (std::vector<T>* v : {&h1_, &h3_, &act_}) GrowTo(*v, R * H);
  GrowTo(scratch_, (std::max(R, local) + static_cast<size_t>(shape_.shared) * n_) * 2 * H);
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

template class MoeLayer<float>;
template class MoeLayer<double>;
template void UpdateSelectionBias<float>(float*, const int64_t*, int, double);
template void UpdateSelectionBias<double>(double*, const int64_t*, int, double);

}  // namespace moelab
