// The CPU MoE ops (core/model/cpu_moe.h): core/model/moe_layer.h's steps over kernels/cpu.
#include "core/model/cpu_moe.h"

#include <algorithm>
#include <stdexcept>

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

// Row chunks of a shared expert in the task-parallel schedule: about kSharedChunkRows rows
// each (the size of a routed expert's block at n = 2048, E = 8, k = 2), at most kMaxChunks so
// that the partial weight gradients stay small. A function of n only, never of the thread count.
constexpr int kSharedChunkRows = 512;
constexpr int kMaxSharedChunks = 8;
int SharedChunks(int n) {
  return std::clamp((n + kSharedChunkRows - 1) / kSharedChunkRows, 1, kMaxSharedChunks);
}

template <typename T>
void GrowTo(std::vector<T>& v, size_t n) {
  if (v.size() < n) v.resize(n);
}

}  // namespace

template <typename T>
CpuMoeExperts<T>::CpuMoeExperts(const ModelConfig& model, const MoEConfig& moe)
    : shape_(model, moe) {
  counts_.assign(shape_.experts, 0);
  offsets_.assign(shape_.experts + 1, 0);
}

template <typename T>
size_t CpuMoeExperts<T>::workspace_bytes() const {
  const size_t reals = logits_.size() + scores_.size() + gates_.size() + dgates_.size() +
                       xe_.size() + ye_.size() + dxe_.size() + h1_.size() + h3_.size() +
                       act_.size() + sh1_.size() + sh3_.size() + sact_.size() + sy_.size() +
                       scratch_.size() + shared_partial_.size() + xr_.size() + yr_.size() +
                       dxr_.size();
  const size_t ints = topk_.size() + row_token_.size() + slot_row_.size();
  return reals * sizeof(T) + ints * sizeof(int) + (counts_.size() + offsets_.size()) * 8;
}

template <typename T>
void CpuMoeExperts<T>::Reserve(int n, bool) {
  n_ = n;
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

template <typename T>
void CpuMoeExperts<T>::Route(const T* router, const T* bias, const T* x, int n,
                             int64_t* counts_out) {
  const int E = shape_.experts, d = shape_.d;
  RowChunkedGemm(/*trans_b=*/true, n, E, d, x, router, d, logits_.data(), false);
  cpu::MoeRoute(logits_.data(), n, E, shape_.top_k, shape_.sigmoid, bias, shape_.route_scale,
                scores_.data(), topk_.data(), gates_.data(), counts_.data());
  if (counts_out) std::copy(counts_.begin(), counts_.end(), counts_out);
  batch_counts_ = false;
}

template <typename T>
void CpuMoeExperts<T>::AuxStatistics(int64_t* counts, double* score_sums) {
  const int E = shape_.experts, n = n_;
  std::copy(counts_.begin(), counts_.end(), counts);
  std::fill(score_sums, score_sums + E, 0.0);
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
    for (int e = 0; e < E; ++e) score_sums[e] += static_cast<double>(s[e]) / sum;
  }
}

template <typename T>
void CpuMoeExperts<T>::SetAuxCounts(const int64_t* batch_counts) {
  batch_counts_ = batch_counts != nullptr;
  if (batch_counts_) aux_counts_.assign(batch_counts, batch_counts + shape_.experts);
}

template <typename T>
const int64_t* CpuMoeExperts<T>::Dispatch(const T* x) {
  const int E = shape_.experts, k = shape_.top_k;
  cpu::MoeDispatchPlan(topk_.data(), n_, E, k, offsets_.data(), row_token_.data(),
                       slot_row_.data());
  cpu::MoeGather(x, shape_.d, row_token_.data(), static_cast<int64_t>(n_) * k, xe_.data());
  return offsets_.data();
}

template <typename T>
MoeRowBuffers CpuMoeExperts<T>::LocalRows() {
  return {xe_.data(), ye_.data(), dxe_.data(), sizeof(T) * shape_.d};
}

// The owned rows' buffers, and the routed activations and backward scratch grown to them.
template <typename T>
MoeRowBuffers CpuMoeExperts<T>::OwnedRows(int64_t rows) {
  const size_t R = rows, H = shape_.hidden, d = shape_.d;
  const size_t local = static_cast<size_t>(n_) * shape_.top_k;
  for (std::vector<T>* v : {&xr_, &yr_, &dxr_}) GrowTo(*v, R * d);
  for (std::vector<T>* v : {&h1_, &h3_, &act_}) GrowTo(*v, R * H);
  GrowTo(scratch_, (std::max(R, local) + static_cast<size_t>(shape_.shared) * n_) * 2 * H);
  return {xr_.data(), yr_.data(), dxr_.data(), sizeof(T) * d};
}

template <typename T>
typename CpuMoeExperts<T>::Rows CpuMoeExperts<T>::RowsOf(const MoeRoutedRows& rows) {
  if (rows.owned) {
    return {xr_.data(), yr_.data(), dxr_.data(), rows.offsets, rows.count, rows.total};
  }
  return {xe_.data(),      ye_.data(),     dxe_.data(),
          offsets_.data(), shape_.experts, offsets_[shape_.experts]};
}

// In the task-parallel schedule one dynamic OpenMP loop runs, as tasks: the shared experts
// in fixed row chunks (listed first, being the largest), the routed experts, and in backward
// the router weight gradient (smallest, last), so the small tasks fill in behind the large ones
// and there is one fork/join per direction. Every task writes disjoint outputs and runs its
// GEMMs single-threaded (OpenBLAS-openmp does inside a parallel region), and the chunking
// depends on n only, so results are bit-identical whichever thread takes which task and for any
// thread count. Shared expert 0 writes y (dx) itself, the others write aside into sy_.
template <typename T>
void CpuMoeExperts<T>::ExpertsForward(const MoeWeights<T>& w, const T* x,
                                      const MoeRoutedRows& routed_rows, T* y) {
  const Rows r = RowsOf(routed_rows);
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
  // Held expert j (0 … r.count−1): its weights are block j, its rows those of r.offsets[j].
  auto routed = [&](int j) {
    cpu::MoeExpertForward(j, r.x, r.offsets, d, H, w.w1, w.w3, w.w2, h1_.data(), h3_.data(),
                          act_.data(), r.y);
  };
  if (task_parallel_) {
    const int shared_tasks = shape_.shared * chunks;
#pragma omp parallel for schedule(dynamic, 1)
    for (int task = 0; task < shared_tasks + r.count; ++task) {
      if (task < shared_tasks) {
        const int r0 = (task % chunks) * chunk_rows;
        shared(task / chunks, r0, std::min(chunk_rows, n - r0));
      } else {
        routed(task - shared_tasks);
      }
    }
  } else {
    for (int j = 0; j < r.count; ++j) routed(j);
    for (int s = 0; s < shape_.shared; ++s) shared(s, 0, n);
  }
  // Extra shared experts were written aside; add them in expert order.
  for (int s = 1; s < shape_.shared; ++s) {
    const T* extra = sy_.data() + (s - 1) * nd;
    for (long i = 0; i < nd; ++i) y[i] += extra[i];
  }
}

template <typename T>
void CpuMoeExperts<T>::Combine(T* y) {
  cpu::MoeCombine(ye_.data(), slot_row_.data(), gates_.data(), n_, shape_.top_k, shape_.d, y,
                  shape_.shared > 0);
}

// Gate gradients, and the expert-output gradients written over the saved expert outputs (each
// row is read before it is overwritten).
template <typename T>
void CpuMoeExperts<T>::CombineBackward(const T* dy) {
  cpu::MoeCombineBackward(dy, ye_.data(), slot_row_.data(), gates_.data(), n_, shape_.top_k,
                          shape_.d, ye_.data(), dgates_.data());
}

// Gates and aux loss -> logits; the logits buffer is reused for dz. The router weight gradient
// then runs with the experts (ExpertsBackward).
template <typename T>
void CpuMoeExperts<T>::RouteBackward(double aux_coef) {
  cpu::MoeRouteBackward(scores_.data(), topk_.data(), dgates_.data(),
                        batch_counts_ ? aux_counts_.data() : counts_.data(), n_, shape_.experts,
                        shape_.top_k, shape_.sigmoid, shape_.route_scale, aux_coef, logits_.data());
}

template <typename T>
void CpuMoeExperts<T>::ExpertsBackward(const MoeWeights<T>& w, const MoeWeights<T>& g, const T* x,
                                       const T* dy, const MoeRoutedRows& routed_rows, T* dx) {
  const Rows r = RowsOf(routed_rows);
  const int n = n_, d = shape_.d, H = shape_.hidden;
  const long wsize = static_cast<long>(H) * d, snh = static_cast<long>(n) * H;
  const long nd = static_cast<long>(n) * d;
  // Routed rows (n·k, or the rows received for the owned experts under expert parallelism).
  const long nk = r.total;
  const int chunks = task_parallel_ ? SharedChunks(n) : 1;
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
  auto routed = [&](int j) {  // as in ExpertsForward
    cpu::MoeExpertBackward(j, r.x, r.offsets, d, H, w.w1, w.w3, w.w2, h1_.data(), h3_.data(),
                           act_.data(), r.y, r.dx, g.w1, g.w3, g.w2, scratch_.data());
  };
  // d router = dzᵀ·x sums over tokens: one GEMM, never split (the split would change the sum).
  auto router = [&]() {
    cpu::Gemm(true, false, shape_.experts, d, n, T(1), logits_.data(), shape_.experts, x, d, T(0),
              g.router, d);
  };
  if (task_parallel_) {
    const int shared_tasks = shape_.shared * chunks;
#pragma omp parallel for schedule(dynamic, 1)
    for (int task = 0; task < shared_tasks + r.count + 1; ++task) {
      if (task < shared_tasks) {
        const int c = task % chunks, r0 = c * chunk_rows;
        shared(task / chunks, c, r0, std::min(chunk_rows, n - r0));
      } else if (task < shared_tasks + r.count) {
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
    for (int j = 0; j < r.count; ++j) routed(j);
    for (int s = 0; s < shape_.shared; ++s) shared(s, 0, 0, n);
    router();
  }
  for (int s = 1; s < shape_.shared; ++s) {
    const T* extra = sy_.data() + (s - 1) * nd;
    for (long i = 0; i < nd; ++i) dx[i] += extra[i];
  }
}

// Each token adds its k row gradients in slot order, then the router's dx.
template <typename T>
void CpuMoeExperts<T>::DispatchBackward(const T* router, T* dx) {
  const int n = n_, d = shape_.d;
  cpu::MoeGatherBackward(dxe_.data(), slot_row_.data(), n, shape_.top_k, d, dx,
                         /*accumulate=*/shape_.shared > 0);
  RowChunkedGemm(/*trans_b=*/false, n, d, shape_.experts, logits_.data(), router, d, dx, true);
}

template class CpuMoeExperts<float>;
template class CpuMoeExperts<double>;

}  // namespace moelab
