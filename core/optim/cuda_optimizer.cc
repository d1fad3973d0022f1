#include "core/optim/cuda_optimizer.h"

#include <algorithm>
#include <cstdint>
#include <stdexcept>

#if MOELAB_HAVE_CUDA
#include <cuda_bf16.h>

#include <cmath>
#include <map>

#include "core/cuda_util.h"
#include "core/optim/adamw.h"
#include "core/optim/cuda_optimizer_kernels.h"
#include "core/optim/muon.h"
#include "kernels/cuda/newton_schulz.h"
#include "kernels/cuda/optim.h"
#endif

namespace moelab {

std::vector<std::pair<size_t, size_t>> UnwrittenSpans(
    std::vector<std::pair<size_t, size_t>> written, size_t n) {
  std::sort(written.begin(), written.end());
  std::vector<std::pair<size_t, size_t>> out;
  size_t at = 0;
  for (const auto& [begin, end] : written) {
    if (begin > at) out.push_back({at, std::min(begin, n)});
    at = std::max(at, end);
    if (at >= n) break;
  }
  if (at < n) out.push_back({at, n});
  return out;
}

#if MOELAB_HAVE_CUDA

void Bf16WeightCopy::Resize(size_t n) {
  values_.Resize(n);
  values_.Zero();
  written_.clear();
}

void Bf16WeightCopy::MarkWritten(size_t begin, size_t end) {
  if (end > begin) written_.push_back({begin, end});
}

void Bf16WeightCopy::Refresh(const float* weights) {
  for (const auto& [begin, end] : UnwrittenSpans(written_, values_.size())) {
    cuda::CastToBf16(weights + begin, values_.data() + begin, end - begin);
  }
  written_.clear();
}

namespace {

using cudautil::DeviceBuffer;

template <typename T>
DeviceBuffer<T> ToDevice(const std::vector<T>& host) {
  DeviceBuffer<T> d;
  d.Upload(host);
  return d;
}

// The span of arena elements covering `params`: [first offset, last end).
std::pair<size_t, size_t> SpanOf(const std::vector<ParamInfo>& params) {
  size_t begin = SIZE_MAX, end = 0;
  for (const ParamInfo& p : params) {
    begin = std::min(begin, p.offset);
    end = std::max(end, p.offset + p.size());
  }
  return begin < end ? std::make_pair(begin, end) : std::make_pair(size_t{0}, size_t{0});
}

// AdamW over a subset of the arena (one launch, cuda::AdamWFused); state laid out as the CPU
// AdamW lays it out.
class DeviceAdamW {
 public:
  DeviceAdamW(const OptimizerConfig& config, const std::vector<ParamInfo>& params)
      : config_(config) {
    std::vector<cuda::AdamWSegment> segs;
    uint64_t state = 0;
    for (const ParamInfo& p : params) {
      const bool decay = !ExcludedFromDecay(config, p);
      segs.push_back({p.offset, p.size(), state, decay ? 1 : 0});
      groups_.push_back({p.name, decay ? "adamw" : "adamw_no_decay"});
      max_size_ = std::max<uint64_t>(max_size_, p.size());
      state += p.size();
    }
    num_segments_ = static_cast<int>(segs.size());
    segments_ = ToDevice(segs);
    m_host_.assign(state, 0.0f);
    v_host_.assign(state, 0.0f);
    m_.Resize(state);
    v_.Resize(state);
  }

  // w16: the bf16 copy of the arena params (null: none), written in the same pass.
  void Step(float* params, const float* grads, double lr, int64_t step, cuda::bf16* w16) {
    const cuda::AdamWScalars s = cuda::MakeAdamWScalars(
        lr, config_.beta1, config_.beta2, config_.eps, config_.weight_decay, true, step);
    cuda::AdamWFused(segments_.data(), num_segments_, max_size_, params, grads, m_.data(),
                     v_.data(), w16, s);
  }

  std::vector<StateBuffer> state() { return {{"adamw.m", &m_host_}, {"adamw.v", &v_host_}}; }
  void SyncToHost() {
    if (m_.size()) m_.Download(m_host_.data(), m_host_.size());
    if (v_.size()) v_.Download(v_host_.data(), v_host_.size());
  }
  void SyncToDevice() {
    if (m_.size()) m_.Upload(m_host_.data(), m_host_.size());
    if (v_.size()) v_.Upload(v_host_.data(), v_host_.size());
  }
  const std::vector<std::pair<std::string, std::string>>& groups() const { return groups_; }

 private:
  OptimizerConfig config_;
  DeviceBuffer<cuda::AdamWSegment> segments_;
  int num_segments_ = 0;
  uint64_t max_size_ = 0;
  std::vector<float> m_host_, v_host_;
  DeviceBuffer<float> m_, v_;
  std::vector<std::pair<std::string, std::string>> groups_;
};

// What both device optimizers share: the weight copy they write and the span they own.
class CudaOptimizerBase : public Optimizer {
 public:
  explicit CudaOptimizerBase(const std::vector<ParamInfo>& params) : span_(SpanOf(params)) {}
  void WriteWeightCopy(WeightCopy* copy) override { copy_ = copy; }

 protected:
  cuda::bf16* copy() const { return copy_ ? static_cast<cuda::bf16*>(copy_->data()) : nullptr; }
  // After the launches of a Step: the copy of the span is current.
  void MarkWritten() {
    if (copy_ && span_.second > span_.first) copy_->MarkWritten(span_.first, span_.second);
  }

 private:
  std::pair<size_t, size_t> span_;
  WeightCopy* copy_ = nullptr;
};

class CudaAdamW : public CudaOptimizerBase {
 public:
  CudaAdamW(const OptimizerConfig& c, const std::vector<ParamInfo>& p)
      : CudaOptimizerBase(p), adam_(c, p) {}
  void Step(float* params, const float* grads, double lr, int64_t step) override {
    adam_.Step(params, grads, lr, step, copy());
    MarkWritten();
  }
  std::vector<StateBuffer> state() override { return adam_.state(); }
  void SyncToHost() override { adam_.SyncToHost(); }
  void SyncToDevice() override { adam_.SyncToDevice(); }
  std::vector<std::pair<std::string, std::string>> groups() const override {
    return adam_.groups();
  }

 private:
  DeviceAdamW adam_;
};

// Muon on the device: the CPU Muon's tensors, banks and state; momentum and update one launch
// each over all tensors, Newton–Schulz per bank (all its same-shape matrices as one batch,
// kernels/cuda/newton_schulz.h), in place in the bank.
class CudaMuon : public CudaOptimizerBase {
 public:
  CudaMuon(const OptimizerConfig& config, const std::vector<ParamInfo>& params, bool ns_bf16)
      : CudaOptimizerBase(params), config_(config), bf16_(ns_bf16) {
    if (config.muon_ns_steps < 0) {
      throw std::invalid_argument("optimizer.muon_ns_steps must be >= 0");
    }
    std::vector<ParamInfo> rest;
    std::map<std::pair<int, int>, int> bank_of_shape;
    std::vector<cuda::MuonSegment> tensors;
    std::vector<int> tensor_bank;
    uint64_t momentum = 0;
    for (const ParamInfo& p : params) {
      if (!p.is_hidden_matrix()) {
        rest.push_back(p);
        continue;
      }
      auto it = bank_of_shape.find({p.rows, p.cols});
      if (it == bank_of_shape.end()) {
        it = bank_of_shape.emplace(std::make_pair(p.rows, p.cols), static_cast<int>(banks_.size()))
                 .first;
        banks_.push_back({p.rows, p.cols});
      }
      Bank& bank = banks_[it->second];
      tensors.push_back({p.offset, p.size(), momentum,
                         static_cast<uint64_t>(bank.batch) * p.rows * p.cols,
                         static_cast<float>(MuonUpdateScale(config.muon_scale, p.rows, p.cols))});
      tensor_bank.push_back(it->second);
      bank.batch += p.batch;
      momentum += p.size();
      max_size_ = std::max<uint64_t>(max_size_, p.size());
    }
    uint64_t total = 0;
    size_t workspace = 0;
    for (Bank& b : banks_) {
      b.offset = total;
      total += static_cast<uint64_t>(b.batch) * b.rows * b.cols;
      workspace = std::max(workspace, cuda::NewtonSchulzWorkspaceSize(b.batch, b.rows, b.cols));
    }
    for (size_t i = 0; i < tensors.size(); ++i)
      tensors[i].bank_offset += banks_[tensor_bank[i]].offset;
    num_tensors_ = static_cast<int>(tensors.size());
    tensors_ = ToDevice(tensors);
    momentum_host_.assign(momentum, 0.0f);
    momentum_.Resize(momentum);
    const size_t elem = bf16_ ? sizeof(cuda::bf16) : sizeof(float);
    bank_.Resize(total * elem);
    workspace_.Resize(workspace * elem);
    if (!rest.empty()) adamw_ = std::make_unique<DeviceAdamW>(config, rest);
    std::map<std::string, std::string> adam_groups;
    if (adamw_) {
      for (auto& [name, group] : adamw_->groups()) adam_groups[name] = group;
    }
    for (const ParamInfo& p : params) {
      groups_.push_back({p.name, p.is_hidden_matrix() ? "muon" : adam_groups.at(p.name)});
    }
  }

  void Step(float* params, const float* grads, double lr, int64_t step) override {
    if (bf16_) {
      Orthogonalise<cuda::bf16>(params, grads, lr);
    } else {
      Orthogonalise<float>(params, grads, lr);
    }
    // optimizer.adamw_lr sets the AdamW group's peak; the schedule's factor (lr / peak) applies.
    const double adam_lr = config_.adamw_lr > 0 ? lr * config_.adamw_lr / config_.lr : lr;
    if (adamw_) adamw_->Step(params, grads, adam_lr, step, copy());
    MarkWritten();
  }

  std::vector<StateBuffer> state() override {
    std::vector<StateBuffer> out = {{"muon.momentum", &momentum_host_}};
    if (adamw_) {
      for (const StateBuffer& s : adamw_->state()) out.push_back(s);
    }
    return out;
  }
  void SyncToHost() override {
    if (momentum_.size()) momentum_.Download(momentum_host_.data(), momentum_host_.size());
    if (adamw_) adamw_->SyncToHost();
  }
  void SyncToDevice() override {
    if (momentum_.size()) momentum_.Upload(momentum_host_.data(), momentum_host_.size());
    if (adamw_) adamw_->SyncToDevice();
  }
  std::vector<std::pair<std::string, std::string>> groups() const override { return groups_; }

 private:
  struct Bank {
    int rows, cols;
    int batch = 0;
    uint64_t offset = 0;
  };

  // Momentum into the bank, Newton–Schulz on every bank, the update (and the weight copy).
  template <typename T>
  void Orthogonalise(float* params, const float* grads, double lr) {
    T* bank = reinterpret_cast<T*>(bank_.data());
    cuda::MuonMomentumFused(tensors_.data(), num_tensors_, max_size_, grads, momentum_.data(), bank,
                            static_cast<float>(config_.muon_momentum), config_.muon_nesterov);
    T* workspace = reinterpret_cast<T*>(workspace_.data());
    for (const Bank& b : banks_) {
      T* x = bank + b.offset;
      cuda::NewtonSchulz<T>(x, x, b.batch, b.rows, b.cols, config_.muon_ns_steps, workspace);
    }
    // Decay applies to every Muon matrix, as in core/optim/muon.cc.
    cuda::MuonApplyFused<T>(tensors_.data(), num_tensors_, max_size_, params, bank, lr,
                            static_cast<float>(1.0 - lr * config_.weight_decay), copy());
  }

  OptimizerConfig config_;
  bool bf16_;
  std::vector<Bank> banks_;
  DeviceBuffer<cuda::MuonSegment> tensors_;
  int num_tensors_ = 0;
  uint64_t max_size_ = 0;
  std::vector<float> momentum_host_;
  DeviceBuffer<float> momentum_;
  DeviceBuffer<unsigned char> bank_, workspace_;  // fp32 or bf16 elements
  std::unique_ptr<DeviceAdamW> adamw_;
  std::vector<std::pair<std::string, std::string>> groups_;
};

}  // namespace

std::unique_ptr<Optimizer> MakeCudaOptimizer(const OptimizerConfig& config,
                                             const std::vector<ParamInfo>& params, bool ns_bf16) {
  if (config.name == "adamw") return std::make_unique<CudaAdamW>(config, params);
  if (config.name == "muon" || config.name == "muonclip") {
    return std::make_unique<CudaMuon>(config, params, ns_bf16);
  }
  throw std::runtime_error("optimizer '" + config.name + "' is not available on cuda");
}

void ApplyQkClipPlanOnDevice(const QkClipPlan& plan, float* device_arena, void* bf16_copy) {
  if (plan.scales.empty()) return;
  std::vector<cudaopt::ScaleRange> ranges;
  uint64_t max_count = 0;
  for (const RowScale& r : plan.scales) {
    ranges.push_back({r.offset, r.count, r.factor});
    max_count = std::max<uint64_t>(max_count, r.count);
  }
  // The table in the thread's stream-ordered scratch: no allocation to outlive, so no sync.
  const size_t bytes = ranges.size() * sizeof(cudaopt::ScaleRange);
  auto* d = static_cast<cudaopt::ScaleRange*>(cuda::ThreadScratch(bytes));
  MOELAB_CUDA(cudaMemcpyAsync(d, ranges.data(), bytes, cudaMemcpyHostToDevice, nullptr));
  cudaopt::LaunchScaleRanges(d, static_cast<int>(ranges.size()), max_count, device_arena, bf16_copy,
                             nullptr);
  MOELAB_CUDA(cudaGetLastError());
}

double DeviceL2Norm(const float* device_data, size_t n) {
  return std::sqrt(DeviceSumSquares(device_data, n));
}

double DeviceSumSquares(const float* device_data, size_t n) {
  constexpr int kMaxBlocks = 1024;
  thread_local DeviceBuffer<double> partial(kMaxBlocks);
  const int blocks = cudaopt::LaunchSumSquares(device_data, n, partial.data(), kMaxBlocks, nullptr);
  MOELAB_CUDA(cudaGetLastError());
  std::vector<double> host(blocks);
  partial.Download(host.data(), blocks);
  double total = 0;
  for (double v : host) total += v;
  return total;
}

void DeviceScale(float* device_data, size_t n, float s) {
  cudaopt::LaunchScale(device_data, n, s, nullptr);
  MOELAB_CUDA(cudaGetLastError());
}

#else  // no CUDA in this build

std::unique_ptr<Optimizer> MakeCudaOptimizer(const OptimizerConfig&, const std::vector<ParamInfo>&,
                                             bool) {
  throw std::runtime_error("this moelab was built without CUDA");
}
void ApplyQkClipPlanOnDevice(const QkClipPlan&, float*, void*) {
  throw std::runtime_error("this moelab was built without CUDA");
}
double DeviceL2Norm(const float*, size_t) {
  throw std::runtime_error("this moelab was built without CUDA");
}
double DeviceSumSquares(const float*, size_t) {
  throw std::runtime_error("this moelab was built without CUDA");
}
void DeviceScale(float*, size_t, float) {
  throw std::runtime_error("this moelab was built without CUDA");
}

#endif

}  // namespace moelab
