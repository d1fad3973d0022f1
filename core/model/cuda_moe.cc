// The CUDA MoE ops (core/model/cuda_moe.h): core/model/moe_layer.h's steps over device buffers,
// fp32 or with bf16 experts. See docs/cuda.md (Precision).
#if MOELAB_HAVE_CUDA

#include "core/model/cuda_moe.h"

#include <algorithm>
#include <map>
#include <memory>
#include <stdexcept>
#include <tuple>

#include "core/model/cuda_backend_kernels.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/grouped_gemm_device.h"
#include "kernels/cuda/moe_experts.h"
#include "kernels/cuda/moe_routing.h"
#include "kernels/cuda/swiglu.h"

namespace moelab::cudamodel {

using cuda::bf16;

namespace {

int ExpertsPathWanted() { return cuda::SelectedKernels().experts; }

// Every op brackets itself as "moe" and its phases (route, dispatch, experts, shared, combine)
// as sub-classes of it.
class MoePhases {
 public:
  MoePhases(CudaOpProfiler* profiler, const char* first)
      : scope_(profiler, "moe"), phases_(profiler) {
    phases_.Next(first);
  }
  void Next(const char* phase) { phases_.Next(phase); }

 private:
  ProfileScope scope_;
  ProfilePhases phases_;  // ends before scope_
};

}  // namespace

bool ChunkedExpertsWanted() { return ExpertsPathWanted() == 1; }
bool CudnnExpertsWanted() { return ExpertsPathWanted() == 2; }

size_t MoePaddedRows(size_t nk, int experts) {
  if (!ChunkedExpertsWanted()) return nk;
  return static_cast<size_t>(cuda::MoeChunkedRows(static_cast<int64_t>(nk), experts));
}

bool SharedExpertInputs(bool bf16, bool expert_parallel) {
  return bf16 && !expert_parallel && ExpertsPathWanted() != 0;
}

size_t MoeScratch::Bytes(const MoEConfig& e, int d, size_t rows, bool bf16, bool shared_xe) {
  const size_t nk = rows * e.experts_active, H = e.expert_hidden, S = e.shared_experts;
  const size_t swiglu = std::max(nk, rows) * 2 * H;
  const size_t f32 = rows * e.experts_total + nk;  // logits, dgates
  if (bf16) {
    const size_t padded = MoePaddedRows(nk, e.experts_total);   // the SwiGLU scratch's rows
    const size_t yp = ChunkedExpertsWanted() ? padded * d : 0;  // yp16: chunks only
    const size_t xe = shared_xe ? padded * d : 0;               // xe16
    return 4 * f32 + 2 * (nk * d + std::max(padded, rows) * 2 * H + 2 * rows * d + yp + xe);
  }
  return 4 * (f32 + nk * d + (S > 1 ? (S - 1) * rows * d : 0) + swiglu);
}

void MoeScratch::Reserve(const MoEConfig& e, int d, int rows, bool bf16, bool shared_xe) {
  if (rows <= cap) return;
  const size_t nn = rows, nk = nn * e.experts_active, H = e.expert_hidden, S = e.shared_experts;
  const size_t swiglu = std::max(nk, nn) * 2 * H;
  logits.Resize(nn * e.experts_total);
  dgates.Resize(nk);
  if (bf16) {
    dxe16.Resize(nk * d);
    const size_t padded = MoePaddedRows(nk, e.experts_total);
    scratch16.Resize(std::max(padded, nn) * 2 * H);
    yp16.Resize(ChunkedExpertsWanted() ? padded * d : 0);
    xe16.Resize(shared_xe ? padded * d : 0);
    xb16.Resize(nn * d);
    dyb16.Resize(nn * d);
  } else {
    dxe.Resize(nk * d);
    sy.Resize(S > 1 ? (S - 1) * nn * d : 0);
    scratch.Resize(swiglu);
  }
  cap = rows;
  chunked = bf16 && ChunkedExpertsWanted();
  shared_inputs = shared_xe;
}

template <typename T>
void MoeExpertActs<T>::Resize(size_t nk, size_t n, int d, int hidden, int shared, bool routed_acts,
                              size_t padded, bool paired_shared, bool keep_xe) {
  xe.Resize(keep_xe ? std::max(nk, padded) * d : 0);
  ye.Resize(nk * d);
  const size_t routed = routed_acts ? std::max(nk, padded) * hidden : 0;
  h1.Resize(routed);
  h3.Resize(routed);
  act.Resize(routed);
  sh1.Resize((paired_shared ? 2 : 1) * shared * n * hidden);
  sh3.Resize(paired_shared ? 0 : shared * n * hidden);
  sact.Resize(shared * n * hidden);
}

template <typename T>
void MoeOwnedRows<T>::Reserve(size_t rows, int d, int hidden) {
  if (rows <= capacity) return;
  const size_t cap = rows + rows / 4;  // slack: the owned rows vary from step to step
  for (cuda::DeviceBuffer<T>* b : {&x, &y, &dx}) b->Resize(cap * d);
  for (cuda::DeviceBuffer<T>* b : {&h1, &h3, &act}) b->Resize(cap * hidden);
  scratch.Resize(cap * 2 * hidden);
  capacity = cap;
}

DeviceMoe::DeviceMoe(const ModelConfig& m, const MoEConfig& e, bool bf16, MoeScratch* scratch,
                     const CudaMoeHost* host, int expert_first, int expert_count)
    : shape_(m, e),
      bf16_(bf16),
      host_(host),
      gated_shared_(bf16 && cuda::GatedFfnWanted()),
      cfg_(e),
      tmp_(scratch) {
  if (shape_.top_k > 32) throw std::invalid_argument("cuda: moe.experts_active must be <= 32");
  if (expert_first < 0 || expert_count < 1 || expert_first + expert_count > shape_.experts) {
    throw std::invalid_argument("cuda: expert shard outside the layer's experts");
  }
  counts_.Resize(shape_.experts);
  offsets_.Resize(shape_.experts + 1);
  host_offsets_.assign(shape_.experts + 1, 0);
}

std::shared_ptr<cuda::MoeExpertsCudnn> SharedCudnnExperts(int experts, int64_t rows, int d,
                                                          int hidden) {
  thread_local std::map<std::tuple<int, int64_t, int, int>, std::weak_ptr<cuda::MoeExpertsCudnn>>
      cache;
  std::weak_ptr<cuda::MoeExpertsCudnn>& slot = cache[{experts, rows, d, hidden}];
  if (std::shared_ptr<cuda::MoeExpertsCudnn> held = slot.lock()) return held;
  auto made = std::make_shared<cuda::MoeExpertsCudnn>(experts, rows, d, hidden);
  slot = made;
  return made;
}

// The cuDNN path's host side: pinned copies of the offsets [E+1] and counts [E], an event after
// each, the experts' first rows on the device, and the grouped products for each row count seen
// (a micro-batch of another size plans its own; layers of one shape share them).
struct DeviceMoe::Staging {
  // What the host function copies to the caller's counts, in stream order.
  struct CountsCopy {
    const int64_t* from = nullptr;
    int64_t* to = nullptr;
    int n = 0;
  };
  explicit Staging(int experts) : offsets(experts + 1), counts(experts), first_row(experts) {}
  cuda::PinnedBuffer<int64_t> offsets, counts;
  cuda::Event offsets_ready, counts_copied;
  CountsCopy pending;
  cuda::DeviceBuffer<int32_t> first_row;
  std::map<int64_t, std::shared_ptr<cuda::MoeExpertsCudnn>> experts;

  static void CUDART_CB CopyCounts(void* data) {
    const CountsCopy* c = static_cast<const CountsCopy*>(data);
    std::copy(c->from, c->from + c->n, c->to);
  }
};

DeviceMoe::~DeviceMoe() = default;

size_t DeviceMoe::Bytes(const MoEConfig& e, int d, size_t rows, bool bf16, bool shared_xe) {
  const size_t nk = rows * e.experts_active, H = e.expert_hidden, S = e.shared_experts;
  const size_t f32 = rows * e.experts_total + nk;  // scores, gates
  // bf16: xe, h1, h3, act sized for the chunked layout (MoePaddedRows); xe in the shared scratch
  // instead when the layer gathers it again in its backward (shared_xe).
  const size_t xrows = bf16 ? MoePaddedRows(nk, e.experts_total) : nk;
  const size_t acts = (shared_xe ? 0 : xrows * d) + nk * d + 3 * xrows * H + 3 * S * rows * H;
  const size_t ints = 3 * nk;  // topk, row_token, slot_row
  return 4 * f32 + (bf16 ? 2 : 4) * acts + 4 * ints + 8 * (2 * e.experts_total + 1);
}

double DeviceMoe::OwnedBytes(const MoEConfig& e, int d, double owned, bool bf16) {
  const double elem = bf16 ? 2 : 4, H = e.expert_hidden;
  // x, y, dx, h1, h3, act, scratch with 1/4 slack, and the exchange buffer (also 1/4), less the
  // local h1, h3, act that Bytes counts and the layer then does not keep (balanced: as many).
  return 1.25 * owned * elem * (4.0 * d + 5.0 * H) - 3.0 * owned * elem * H;
}

// f(a, o, dxe) on this mode's buffers: the expert activations, the owned rows and the expert
// input gradients, bf16 in bf16 mode, else fp32.
template <typename F>
auto DeviceMoe::InMode(F&& f) {
  return bf16_ ? f(b16_, b16_owned_, tmp_->dxe16.data()) : f(f32_, f32_owned_, tmp_->dxe.data());
}

MoeLayerParams DeviceMoe::Params(const MoeWeights<float>& w) const {
  MoeLayerParams p;
  p.router = w.router;
  p.w1 = w.w1, p.w3 = w.w3, p.w2 = w.w2;
  const bool shared = shape_.shared > 0;
  if (shared) p.s1 = w.shared_w1, p.s3 = w.shared_w3, p.s2 = w.shared_w2;
  if (bf16_) {
    p.w1b = host_->Bf16Of(w.w1), p.w3b = host_->Bf16Of(w.w3), p.w2b = host_->Bf16Of(w.w2);
    if (shared) {
      p.s1b = host_->Bf16Of(w.shared_w1), p.s3b = host_->Bf16Of(w.shared_w3);
      p.s2b = host_->Bf16Of(w.shared_w2);
    }
  }
  return p;
}

MoeLayerGrads DeviceMoe::Grads(const MoeWeights<float>& g) const {
  MoeLayerGrads grads{g.router, g.w1, g.w3, g.w2};
  if (shape_.shared > 0) grads.s1 = g.shared_w1, grads.s3 = g.shared_w3, grads.s2 = g.shared_w2;
  return grads;
}

void DeviceMoe::Reserve(int rows, bool expert_parallel) {
  ep_ = expert_parallel;
  n_ = rows;
  const bool routed_acts = !expert_parallel;  // else the owned rows hold them
  if (cap_ == 0) shared_xe_ = SharedExpertInputs(bf16_, !routed_acts);
  tmp_->Reserve(cfg_, shape_.d, rows, bf16_, shared_xe_);
  if (rows <= cap_) return;
  const size_t nn = rows, nk = nn * shape_.top_k;
  scores_.Resize(nn * shape_.experts);
  gates_.Resize(nk);
  topk_.Resize(nk);
  row_token_.Resize(nk);
  slot_row_.Resize(nk);
  if (bf16_) {
    b16_.Resize(nk, nn, shape_.d, shape_.hidden, shape_.shared, routed_acts,
                routed_acts ? MoePaddedRows(nk, shape_.experts) : 0, gated_shared_, !shared_xe_);
  } else {
    f32_.Resize(nk, nn, shape_.d, shape_.hidden, shape_.shared, routed_acts);
  }
  cap_ = rows;
  chunk_room_ = bf16_ && ChunkedExpertsWanted();
}

void DeviceMoe::Route(const float* router, const float* bias, const float* x, int n,
                      int64_t* counts_out) {
  MoePhases phase(host_->profiler(), "route");
  const int d = shape_.d, E = shape_.experts;
  // Routing stays fp32 in both modes (the expert choice is discrete: bf16 logits would flip it).
  cuda::Gemm(false, true, n, E, d, 1.0f, x, d, router, d, 0.0f, tmp_->logits.data(), E);
  cuda::MoeRoute(tmp_->logits.data(), n, E, shape_.top_k, shape_.sigmoid, bias, shape_.route_scale,
                 scores_.data(), topk_.data(), gates_.data(), counts_.data());
  batch_counts_ = false;
  cudnn_ = UseCudnn();
  device_experts_ = UseDeviceExperts();
  if (counts_out && (cudnn_ || device_experts_)) {
    StageCounts(counts_out);
  } else if (counts_out) {
    MOELAB_CUDA_CHECK(
        cudaMemcpy(counts_out, counts_.data(), sizeof(int64_t) * E, cudaMemcpyDeviceToHost));
  }
}

void DeviceMoe::AuxStatistics(int64_t* counts, double* score_sums) {
  const int E = shape_.experts;
  MOELAB_CUDA_CHECK(
      cudaMemcpy(counts, counts_.data(), sizeof(int64_t) * E, cudaMemcpyDeviceToHost));
  cuda::MoeScoreSums(scores_.data(), n_, E, shape_.sigmoid, score_sums);
}

double DeviceMoe::LocalAuxLoss(const MoeShape& shape, int n) {
  return cuda::MoeAuxLoss(scores_.data(), counts_.data(), n, shape.experts, shape.top_k,
                          shape.sigmoid, shape.aux_coef);
}

void DeviceMoe::SetAuxCounts(const int64_t* batch_counts) {
  batch_counts_ = batch_counts != nullptr;
  if (batch_counts_) {
    batch_counts_dev_.Upload(std::vector<int64_t>(batch_counts, batch_counts + shape_.experts));
  }
}

const int64_t* DeviceMoe::Dispatch(const float* x) {
  MoePhases phase(host_->profiler(), "dispatch");
  const int n = n_, d = shape_.d, E = shape_.experts;
  const int64_t nk = static_cast<int64_t>(n) * shape_.top_k;
  cuda::MoeDispatchPlan(topk_.data(), n, E, shape_.top_k, offsets_.data(), row_token_.data(),
                        slot_row_.data());
  if (cudnn_) {
    StageOffsets();
  } else if (!device_experts_) {
    cuda::DownloadOffsets(offsets_.data(), E, host_offsets_.data());
  }
  if (!bf16_) {
    cuda::MoeGather(x, d, row_token_.data(), nk, f32_.xe.data());
    return host_offsets_.data();
  }
  bf16* xb = tmp_->xb16.data();  // also the shared experts' input (ExpertsForward)
  cuda::CastToBf16(x, xb, static_cast<size_t>(n) * d);
  chunked_ = !cudnn_ && !device_experts_ && UseChunks();
  if (chunked_) {
    chunks_ = cuda::PlanMoeChunks(host_offsets_.data(), E, cuda::MoeChunkRows(nk, E));
    // Grow-only: the chunk count follows the routing, so it changes nearly every forward, and
    // a reallocation (cudaFree) would synchronise the device each time.
    if (chunk_table_.size() < chunks_.table.size()) chunk_table_.Resize(2 * chunks_.table.size());
    MOELAB_CUDA_CHECK(cudaMemcpy(chunk_table_.data(), chunks_.table.data(),
                                 sizeof(int64_t) * chunks_.table.size(), cudaMemcpyHostToDevice));
    cuda::MoeGatherChunked(xb, d, row_token_.data(), chunk_table_.data(), chunks_.count(),
                           chunks_.rows, XeBf16());
  } else {
    cuda::MoeGather(xb, d, row_token_.data(), nk, XeBf16());
  }
  return cudnn_ || device_experts_ ? nullptr : host_offsets_.data();
}

MoeRowBuffers DeviceMoe::LocalRows() {
  if (bf16_) return {XeBf16(), b16_.ye.data(), tmp_->dxe16.data(), sizeof(bf16) * shape_.d};
  return {f32_.xe.data(), f32_.ye.data(), tmp_->dxe.data(), sizeof(float) * shape_.d};
}

MoeRowBuffers DeviceMoe::OwnedRows(int64_t rows) {
  return InMode([&](auto&, auto& o, auto*) {
    o.Reserve(static_cast<size_t>(rows), shape_.d, shape_.hidden);
    return MoeRowBuffers{o.x.data(), o.y.data(), o.dx.data(), sizeof(*o.x.data()) * shape_.d};
  });
}

void DeviceMoe::ExpertsForward(const MoeWeights<float>& w, const float* x,
                               const MoeRoutedRows& rows, float* y) {
  const bool grouped = bf16_ && !chunked_ && !cudnn_ && !device_experts_;
  MoePhases phase(host_->profiler(), grouped           ? "experts grouped"
                                     : cudnn_          ? "experts cudnn"
                                     : device_experts_ ? "experts device"
                                                       : "experts");
  const MoeLayerParams p = Params(w);
  const int n = n_, d = shape_.d, H = shape_.hidden, S = shape_.shared;
  const size_t nd = static_cast<size_t>(n) * d;
  if (bf16_) {
    if (chunked_) {
      ChunkedForward(p);
    } else if (cudnn_) {
      CudnnForward(p);
    } else if (device_experts_) {
      MoeExpertActs<bf16>& a = b16_;
      cuda::MoeExpertsForwardDevice(XeBf16(), offsets_.data(), shape_.experts, d, H, p.w1b, p.w3b,
                                    p.w2b, a.h1.data(), a.h3.data(), a.act.data(), a.ye.data(),
                                    DeviceWorkspace());
    } else {
      RoutedForward(b16_, b16_owned_, rows, XeBf16(), p.w1b, p.w3b, p.w2b);
    }
    phase.Next("shared");
    SharedForwardBf16(p, tmp_->xb16.data(), y);  // the cast of x that Dispatch made
    return;
  }
  MoeExpertActs<float>& a = f32_;
  const size_t wsize = static_cast<size_t>(H) * d, snh = static_cast<size_t>(n) * H;
  RoutedForward(a, f32_owned_, rows, a.xe.data(), p.w1, p.w3, p.w2);
  phase.Next("shared");
  for (int s = 0; s < S; ++s) {
    float* out = s == 0 ? y : tmp_->sy.data() + (s - 1) * nd;
    cuda::SwigluForward(x, n, d, H, p.s1 + s * wsize, p.s3 + s * wsize, p.s2 + s * wsize,
                        a.sh1.data() + s * snh, a.sh3.data() + s * snh, a.sact.data() + s * snh,
                        out);
  }
  for (int s = 1; s < S; ++s) Add(y, tmp_->sy.data() + (s - 1) * nd, y, nd);
}

void DeviceMoe::Combine(float* y) {
  MoePhases phase(host_->profiler(), "combine");
  InMode([&](auto& a, auto&, auto*) {
    cuda::MoeCombine(a.ye.data(), slot_row_.data(), gates_.data(), n_, shape_.top_k, shape_.d, y,
                     shape_.shared > 0);
  });
}

void DeviceMoe::CombineBackward(const float* dy) {
  MoePhases phase(host_->profiler(), "combine");
  // dye overwrites ye, which the gate gradients have read first.
  InMode([&](auto& a, auto&, auto*) {
    cuda::MoeCombineBackward(dy, a.ye.data(), slot_row_.data(), gates_.data(), n_, shape_.top_k,
                             shape_.d, a.ye.data(), tmp_->dgates.data());
  });
}

void DeviceMoe::RouteBackward(double aux_coef) {
  MoePhases phase(host_->profiler(), "route");
  cuda::MoeRouteBackward(scores_.data(), topk_.data(), tmp_->dgates.data(),
                         batch_counts_ ? batch_counts_dev_.data() : counts_.data(), n_,
                         shape_.experts, shape_.top_k, shape_.sigmoid, shape_.route_scale, aux_coef,
                         tmp_->logits.data());
}

void DeviceMoe::ExpertsBackward(const MoeWeights<float>& w, const MoeWeights<float>& g,
                                const float* x, const float* dy, const MoeRoutedRows& rows,
                                float* dx) {
  const MoeLayerParams p = Params(w);
  const MoeLayerGrads grads = Grads(g);
  if (bf16_) return ExpertsBackwardBf16(p, grads, x, dy, rows, dx);
  MoePhases phase(host_->profiler(), "experts");
  const int n = n_, d = shape_.d, H = shape_.hidden, E = shape_.experts, S = shape_.shared;
  const size_t nd = static_cast<size_t>(n) * d;
  MoeExpertActs<float>& a = f32_;
  const size_t wsize = static_cast<size_t>(H) * d, snh = static_cast<size_t>(n) * H;
  RoutedBackward(a, f32_owned_, rows, a.xe.data(), p.w1, p.w3, p.w2, grads, tmp_->dxe.data(),
                 tmp_->scratch.data());
  phase.Next("shared");
  for (int s = 0; s < S; ++s) {
    cuda::SwigluBackward(x, n, d, H, p.s1 + s * wsize, p.s3 + s * wsize, p.s2 + s * wsize,
                         a.sh1.data() + s * snh, a.sh3.data() + s * snh, a.sact.data() + s * snh,
                         dy, s == 0 ? dx : tmp_->sy.data() + (s - 1) * nd, g.shared_w1 + s * wsize,
                         g.shared_w3 + s * wsize, g.shared_w2 + s * wsize, tmp_->scratch.data());
  }
  for (int s = 1; s < S; ++s) Add(dx, tmp_->sy.data() + (s - 1) * nd, dx, nd);
  phase.Next("route");
  cuda::Gemm(true, false, E, d, n, 1.0f, tmp_->logits.data(), E, x, d, 0.0f, g.router, d);
}

void DeviceMoe::ExpertsBackwardBf16(const MoeLayerParams& p, const MoeLayerGrads& g, const float* x,
                                    const float* dy, const MoeRoutedRows& rows, float* dx) {
  MoePhases phase(host_->profiler(), "route");  // the casts, as before the ops were split
  const int n = n_, d = shape_.d, E = shape_.experts, k = shape_.top_k, S = shape_.shared;
  const size_t nd = static_cast<size_t>(n) * d;
  // The forward's bf16 cast of x was scratch (another layer has used it since): cast again,
  // for the shared experts and, when the layer did not keep its gathered inputs, to gather
  // them again into the shared scratch (the forward's bits: the same x, rows and table).
  const bool regather = shared_xe_ && !rows.owned;
  if (regather || S > 0) cuda::CastToBf16(x, tmp_->xb16.data(), nd);
  if (regather) {
    phase.Next("dispatch");
    if (chunked_) {
      cuda::MoeGatherChunked(tmp_->xb16.data(), d, row_token_.data(), chunk_table_.data(),
                             chunks_.count(), chunks_.rows, XeBf16());
    } else {
      cuda::MoeGather(tmp_->xb16.data(), d, row_token_.data(), static_cast<int64_t>(n) * k,
                      XeBf16());
    }
  }
  if (chunked_) {
    phase.Next("experts");
    ChunkedBackward(p, g);
  } else if (device_experts_) {
    phase.Next("experts device");
    MoeExpertActs<bf16>& a = b16_;
    cuda::MoeExpertsBackwardDevice(XeBf16(), offsets_.data(), E, d, shape_.hidden, p.w1b, p.w3b,
                                   p.w2b, a.h1.data(), a.h3.data(), a.act.data(), a.ye.data(),
                                   tmp_->dxe16.data(), g.w1, g.w3, g.w2, tmp_->scratch16.data(),
                                   DeviceWorkspace());
  } else {
    // The cuDNN experts' backward is the grouped GEMMs' (cuDNN 9.19 has no engine for the input
    // gradients' products and no weight-gradient operation: kernels/cuda/moe_experts_cudnn.h),
    // on the offsets the forward staged.
    if (cudnn_) ReadStagedOffsets();
    phase.Next(cudnn_ ? "experts cudnn" : "experts grouped");
    RoutedBackward(b16_, b16_owned_, rows, XeBf16(), p.w1b, p.w3b, p.w2b, g, tmp_->dxe16.data(),
                   tmp_->scratch16.data());
  }
  phase.Next("shared");
  if (S > 0) {
    cuda::CastToBf16(dy, tmp_->dyb16.data(), nd);
    SharedBackwardBf16(p, g, tmp_->xb16.data(), tmp_->dyb16.data(), dx);
  }
  phase.Next("route");
  cuda::Gemm(true, false, E, d, n, 1.0f, tmp_->logits.data(), E, x, d, 0.0f, g.router, d);
}

void DeviceMoe::DispatchBackward(const float* router, float* dx) {
  MoePhases phase(host_->profiler(), "dispatch");
  const int n = n_, d = shape_.d, E = shape_.experts;
  InMode([&](auto&, auto&, auto* dxe) {
    cuda::MoeGatherBackward(dxe, slot_row_.data(), n, shape_.top_k, d, dx, shape_.shared > 0);
  });
  phase.Next("route");
  cuda::Gemm(false, false, n, d, E, 1.0f, tmp_->logits.data(), E, router, d, 1.0f, dx, d);
}

bool DeviceMoe::UseChunks() const {
  // Only without expert parallelism, and on buffers reserved for the layout (the setting may
  // have changed since). And only on 16-byte rows: the pointer-batched GEMMs take every chunk's
  // pointers as they fall, and cuBLAS's bf16 kernels for k a multiple of 8 want them 16-byte
  // aligned (the grouped GEMMs serve other widths, as without the setting).
  return bf16_ && chunk_room_ && tmp_->chunked && !ep_ && shape_.d % 8 == 0 &&
         shape_.hidden % 8 == 0 && ChunkedExpertsWanted();
}

bool DeviceMoe::UseCudnn() const { return bf16_ && !ep_ && CudnnExpertsWanted(); }

bool DeviceMoe::UseDeviceExperts() const {
  // The widths were checked before the run (cuda_supports.cc); a layer the kernels cannot take
  // keeps the grouped GEMMs rather than failing mid-run.
  return bf16_ && !ep_ && ExpertsPathWanted() == 3 &&
         cuda::DeviceGroupedGemmSupports(shape_.d, shape_.hidden);
}

void* DeviceMoe::DeviceWorkspace() {
  // Grow-only and stream-ordered: every product of every layer reuses it in turn.
  const size_t bytes = cuda::DeviceGroupedGemmWorkspaceBytes(shape_.experts);
  if (device_workspace_.size() < bytes) device_workspace_.Resize(bytes);
  return device_workspace_.data();
}

DeviceMoe::Staging& DeviceMoe::Staged() {
  if (!staging_) staging_ = std::make_unique<Staging>(shape_.experts);
  return *staging_;
}

void DeviceMoe::StageCounts(int64_t* counts_out) {
  const int E = shape_.experts;
  Staging& st = Staged();
  st.counts_copied.Wait();  // the previous forward's host copy has read the pinned counts
  MOELAB_CUDA_CHECK(cudaMemcpyAsync(st.counts.data(), counts_.data(), sizeof(int64_t) * E,
                                    cudaMemcpyDeviceToHost, nullptr));
  st.pending = {st.counts.data(), counts_out, E};
  MOELAB_CUDA_CHECK(cudaLaunchHostFunc(nullptr, Staging::CopyCounts, &st.pending));
  st.counts_copied.Record();
}

void DeviceMoe::StageOffsets() {
  const int E = shape_.experts;
  Staging& st = Staged();
  cuda::MoeFirstRows(offsets_.data(), E, st.first_row.data());
  MOELAB_CUDA_CHECK(cudaMemcpyAsync(st.offsets.data(), offsets_.data(), sizeof(int64_t) * (E + 1),
                                    cudaMemcpyDeviceToHost, nullptr));
  st.offsets_ready.Record();
}

void DeviceMoe::CudnnForward(const MoeLayerParams& p) {
  MoeExpertActs<bf16>& a = b16_;
  const int64_t nk = static_cast<int64_t>(n_) * shape_.top_k;
  std::shared_ptr<cuda::MoeExpertsCudnn>& experts = staging_->experts[nk];
  if (!experts) experts = SharedCudnnExperts(shape_.experts, nk, shape_.d, shape_.hidden);
  experts->Forward(XeBf16(), staging_->first_row.data(), p.w1b, p.w3b, p.w2b, a.h1.data(),
                   a.h3.data(), a.act.data(), a.ye.data());
}

void DeviceMoe::ReadStagedOffsets() {
  Staging& st = *staging_;
  // Copied behind the forward's dispatch plan: long done by now, so this does not stall.
  st.offsets_ready.Wait();
  host_offsets_.assign(st.offsets.data(), st.offsets.data() + shape_.experts + 1);
}

bf16* DeviceMoe::XeBf16() {
  if (!shared_xe_) return b16_.xe.data();
  if (!tmp_->shared_inputs) {
    throw std::logic_error("cuda: the MoE scratch was not reserved for shared expert inputs");
  }
  return tmp_->xe16.data();
}

void DeviceMoe::ChunkedForward(const MoeLayerParams& p) {
  MoeExpertActs<bf16>& a = b16_;
  const int d = shape_.d;
  bf16* yc = tmp_->yp16.data();
  cuda::MoeExpertsForwardChunked(XeBf16(), chunks_, d, shape_.hidden, p.w1b, p.w3b, p.w2b,
                                 a.h1.data(), a.h3.data(), a.act.data(), yc);
  cuda::MoeUnchunkRows(yc, chunk_table_.data(), chunks_.count(), chunks_.rows, d, a.ye.data());
}

void DeviceMoe::ChunkedBackward(const MoeLayerParams& p, const MoeLayerGrads& g) {
  MoeExpertActs<bf16>& a = b16_;
  const int d = shape_.d;
  bf16* dyc = tmp_->yp16.data();  // then the chunked input gradient, in place
  cuda::MoeChunkRowsOf(a.ye.data(), chunk_table_.data(), chunks_.count(), chunks_.rows, d, dyc);
  cuda::MoeExpertsBackwardChunked(XeBf16(), chunks_, shape_.experts, d, shape_.hidden, p.w1b, p.w3b,
                                  p.w2b, a.h1.data(), a.h3.data(), a.act.data(), dyc, dyc, g.w1,
                                  g.w3, g.w2, tmp_->scratch16.data());
  cuda::MoeUnchunkRows(dyc, chunk_table_.data(), chunks_.count(), chunks_.rows, d,
                       tmp_->dxe16.data());
}

template <typename T>
void DeviceMoe::RoutedForward(MoeExpertActs<T>& a, MoeOwnedRows<T>& o, const MoeRoutedRows& rows,
                              const T* xe, const T* w1, const T* w3, const T* w2) {
  const int d = shape_.d, H = shape_.hidden;
  if (!rows.owned) {
    cuda::MoeExpertsForward<T>(xe, host_offsets_.data(), shape_.experts, d, H, w1, w3, w2,
                               a.h1.data(), a.h3.data(), a.act.data(), a.ye.data());
    return;
  }
  // The held experts' offsets within the owned rows (the others own no rows here).
  cuda::MoeExpertsForward<T>(o.x.data(), rows.offsets, rows.count, d, H, w1, w3, w2, o.h1.data(),
                             o.h3.data(), o.act.data(), o.y.data());
}

template <typename T>
void DeviceMoe::RoutedBackward(MoeExpertActs<T>& a, MoeOwnedRows<T>& o, const MoeRoutedRows& rows,
                               const T* xe, const T* w1, const T* w3, const T* w2,
                               const MoeLayerGrads& g, T* dxe, T* scratch) {
  const int d = shape_.d, H = shape_.hidden;
  if (!rows.owned) {
    cuda::MoeExpertsBackward<T>(xe, host_offsets_.data(), shape_.experts, d, H, w1, w3, w2,
                                a.h1.data(), a.h3.data(), a.act.data(), a.ye.data(), dxe, g.w1,
                                g.w3, g.w2, scratch);
    return;
  }
  // The output gradients arrived in o.y; the input gradients go back from o.dx (the layer's
  // exchanges).
  cuda::MoeExpertsBackward<T>(o.x.data(), rows.offsets, rows.count, d, H, w1, w3, w2, o.h1.data(),
                              o.h3.data(), o.act.data(), o.y.data(), o.dx.data(), g.w1, g.w3, g.w2,
                              o.scratch.data());
}

// Shared expert s in bf16: h1, h3 = xb·W1ᵀ, xb·W3ᵀ (bf16), act = silu(h1)·h3 (bf16), and
// y (=, then +=) act·W2ᵀ in fp32, so the shared experts' sum never passes through bf16.
void DeviceMoe::SharedForwardBf16(const MoeLayerParams& p, const bf16* xb, float* y) {
  const int n = n_, d = shape_.d, H = shape_.hidden;
  const size_t wsize = static_cast<size_t>(H) * d, snh = static_cast<size_t>(n) * H;
  MoeExpertActs<bf16>& a = b16_;
  if (gated_shared_) {  // h13 [n, 2H] per shared expert in sh1
    for (int s = 0; s < shape_.shared; ++s) {
      cuda::GatedFfnForwardBf16(xb, n, d, H, p.s1b + s * wsize, p.s3b + s * wsize,
                                p.s2b + s * wsize, a.sh1.data() + 2 * s * snh,
                                a.sact.data() + s * snh, y, s > 0);
    }
    return;
  }
  for (int s = 0; s < shape_.shared; ++s) {
    bf16* h1 = a.sh1.data() + s * snh;
    bf16* h3 = a.sh3.data() + s * snh;
    bf16* act = a.sact.data() + s * snh;
    cuda::Gemm(false, true, n, H, d, 1.0f, xb, d, p.s1b + s * wsize, d, 0.0f, h1, H);
    cuda::Gemm(false, true, n, H, d, 1.0f, xb, d, p.s3b + s * wsize, d, 0.0f, h3, H);
    cuda::SwigluActivation(h1, h3, snh, act);
    cuda::Gemm(false, true, n, d, H, 1.0f, act, H, p.s2b + s * wsize, H, s > 0 ? 1.0f : 0.0f, y, d);
  }
}

// The twin of cuda::SwigluBackward with bf16 operands: dact = dy·W2 and dh1, dh3 in bf16 (the
// SwiGLU backward reads bf16 h1, h3), the weight gradients and dx (= for s = 0, then +=) in fp32.
void DeviceMoe::SharedBackwardBf16(const MoeLayerParams& p, const MoeLayerGrads& g, const bf16* xb,
                                   const bf16* dyb, float* dx) {
  const int n = n_, d = shape_.d, H = shape_.hidden;
  const size_t wsize = static_cast<size_t>(H) * d, snh = static_cast<size_t>(n) * H;
  MoeExpertActs<bf16>& a = b16_;
  if (gated_shared_) {  // dh13 [n, 2H] in the SwiGLU scratch (at least 2·n·H)
    for (int s = 0; s < shape_.shared; ++s) {
      const size_t w = s * wsize;
      cuda::GatedFfnBackwardBf16(xb, dyb, n, d, H, p.s1b + w, p.s3b + w, p.s2b + w,
                                 a.sh1.data() + 2 * s * snh, a.sact.data() + s * snh,
                                 tmp_->scratch16.data(), dx, s > 0, g.s1 + w, g.s3 + w, g.s2 + w);
    }
    return;
  }
  bf16* dact = tmp_->scratch16.data();  // [n,H], becomes dh1 in place
  bf16* dh3 = dact + snh;
  for (int s = 0; s < shape_.shared; ++s) {
    const size_t w = s * wsize;
    cuda::Gemm(false, false, n, H, d, 1.0f, dyb, d, p.s2b + w, H, 0.0f, dact, H);
    cuda::Gemm(true, false, d, H, n, 1.0f, dyb, d, a.sact.data() + s * snh, H, 0.0f, g.s2 + w, H);
    cuda::SwigluActivationBackward(a.sh1.data() + s * snh, a.sh3.data() + s * snh, dact, snh, dact,
                                   dh3);
    cuda::Gemm(false, false, n, d, H, 1.0f, dact, H, p.s1b + w, d, s > 0 ? 1.0f : 0.0f, dx, d);
    cuda::Gemm(true, false, H, d, n, 1.0f, dact, H, xb, d, 0.0f, g.s1 + w, d);
    cuda::Gemm(false, false, n, d, H, 1.0f, dh3, H, p.s3b + w, d, 1.0f, dx, d);
    cuda::Gemm(true, false, H, d, n, 1.0f, dh3, H, xb, d, 0.0f, g.s3 + w, d);
  }
}

template struct MoeExpertActs<float>;
template struct MoeExpertActs<bf16>;
template struct MoeOwnedRows<float>;
template struct MoeOwnedRows<bf16>;

}  // namespace moelab::cudamodel

#endif  // MOELAB_HAVE_CUDA
