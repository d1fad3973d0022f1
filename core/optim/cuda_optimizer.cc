#include "core/optim/cuda_optimizer.h"

#include <stdexcept>

#if MOELAB_HAVE_CUDA
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "core/cuda_util.h"
#include "core/optim/adamw.h"
#include "core/optim/cuda_optimizer_kernels.h"
#include "core/optim/muon.h"
#include "kernels/cpu/newton_schulz.h"
#endif

namespace moelab {

#if MOELAB_HAVE_CUDA
namespace {

using cudautil::CublasHandle;
using cudautil::DeviceBuffer;

template <typename T>
DeviceBuffer<T> ToDevice(const std::vector<T>& host) {
  DeviceBuffer<T> d;
  d.Upload(host);
  return d;
}

// AdamW over a subset of the arena; state laid out as the CPU AdamW lays it out.
class DeviceAdamW {
 public:
  DeviceAdamW(const OptimizerConfig& config, const std::vector<ParamInfo>& params)
      : config_(config) {
    std::vector<cudaopt::AdamSegment> segs;
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

  void Step(float* params, const float* grads, double lr, int64_t step) {
    const double b1 = config_.beta1, b2 = config_.beta2;
    const double c1 = 1.0 - std::pow(b1, static_cast<double>(step));
    const double c2 = 1.0 - std::pow(b2, static_cast<double>(step));
    cudaopt::LaunchAdamW(segments_.data(), num_segments_, max_size_, params, grads, m_.data(),
                         v_.data(), static_cast<float>(b1), static_cast<float>(b2),
                         static_cast<float>(lr / c1), static_cast<float>(1.0 / std::sqrt(c2)),
                         static_cast<float>(config_.eps),
                         static_cast<float>(1.0 - lr * config_.weight_decay), nullptr);
    MOELAB_CUDA(cudaGetLastError());
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
  DeviceBuffer<cudaopt::AdamSegment> segments_;
  int num_segments_ = 0;
  uint64_t max_size_ = 0;
  std::vector<float> m_host_, v_host_;
  DeviceBuffer<float> m_, v_;
  std::vector<std::pair<std::string, std::string>> groups_;
};

class CudaAdamW : public Optimizer {
 public:
  CudaAdamW(const OptimizerConfig& c, const std::vector<ParamInfo>& p) : adam_(c, p) {}
  void Step(float* params, const float* grads, double lr, int64_t step) override {
    adam_.Step(params, grads, lr, step);
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

// Strided-batched GEMM on column-major operands, fp32 or bf16 storage, fp32 accumulation.
void Gemm(bool bf16, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, float alpha,
          const void* A, int lda, long long sa, const void* B, int ldb, long long sb, float beta,
          void* C, int ldc, long long sc, int batch) {
  const cudaDataType_t t = bf16 ? CUDA_R_16BF : CUDA_R_32F;
  MOELAB_CUDA(cublasGemmStridedBatchedEx(CublasHandle(), ta, tb, m, n, k, &alpha, A, t, lda, sa, B,
                                         t, ldb, sb, &beta, C, t, ldc, sc, batch,
                                         CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

// Muon on the device: the CPU Muon's tensors, banks and state, with Newton–Schulz as batched
// cuBLAS GEMMs over each bank (all same-shape matrices in one call per product).
class CudaMuon : public Optimizer {
 public:
  CudaMuon(const OptimizerConfig& config, const std::vector<ParamInfo>& params, bool ns_bf16)
      : config_(config), bf16_(ns_bf16) {
    if (config.muon_ns_steps < 0) {
      throw std::invalid_argument("optimizer.muon_ns_steps must be >= 0");
    }
    std::vector<ParamInfo> rest;
    std::map<std::pair<int, int>, int> bank_of_shape;
    std::vector<cudaopt::MuonTensor> tensors;
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
    size_t max_bank = 0, max_gram = 0;
    for (Bank& b : banks_) {
      b.offset = total;
      const size_t elems = static_cast<size_t>(b.batch) * b.rows * b.cols;
      const size_t m = std::min(b.rows, b.cols);
      total += elems;
      max_bank = std::max(max_bank, elems);
      max_gram = std::max(max_gram, static_cast<size_t>(b.batch) * m * m);
    }
    for (size_t i = 0; i < tensors.size(); ++i)
      tensors[i].bank_offset += banks_[tensor_bank[i]].offset;
    num_tensors_ = static_cast<int>(tensors.size());
    tensors_ = ToDevice(tensors);
    momentum_host_.assign(momentum, 0.0f);
    momentum_.Resize(momentum);
    const size_t elem = bf16_ ? sizeof(__nv_bfloat16) : sizeof(float);
    bank_.Resize(total * elem);
    ping_.Resize(max_bank * elem);
    gram_.Resize(max_gram * elem);
    poly_.Resize(max_gram * elem);
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
    cudaopt::LaunchMuonMomentum(tensors_.data(), num_tensors_, max_size_, grads, momentum_.data(),
                                bank_.data(), bf16_, static_cast<float>(config_.muon_momentum),
                                config_.muon_nesterov, nullptr);
    MOELAB_CUDA(cudaGetLastError());
    const size_t elem = bf16_ ? sizeof(__nv_bfloat16) : sizeof(float);
    for (const Bank& b : banks_) NewtonSchulz(bank_.data() + b.offset * elem, b);
    cudaopt::LaunchMuonUpdate(tensors_.data(), num_tensors_, max_size_, params, bank_.data(), bf16_,
                              static_cast<float>(lr),
                              static_cast<float>(1.0 - lr * config_.weight_decay), nullptr);
    MOELAB_CUDA(cudaGetLastError());
    if (adamw_) adamw_->Step(params, grads, lr, step);
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

  // In place on `batch` row-major rows×cols matrices, i.e. column-major P (cols×rows, ld cols).
  // Wide (rows ≤ cols): G = PᵀP, P ← aP + P·(bG + cG²). Tall: G = PPᵀ, P ← aP + (bG + cG²)·P.
  // This is X ← aX + (bA + cA²)X with A = XXᵀ of the CPU kernel, iterating on the small side.
  void NewtonSchulz(unsigned char* x, const Bank& b) {
    const int steps = config_.muon_ns_steps;
    const int m = std::min(b.rows, b.cols);
    const long long elems = static_cast<long long>(b.rows) * b.cols, mm = 1LL * m * m;
    const size_t elem = bf16_ ? sizeof(__nv_bfloat16) : sizeof(float);
    const bool wide = b.rows <= b.cols;
    const int ld = b.cols;
    cudaopt::LaunchNormalizeMatrices(x, bf16_, b.batch, elems, static_cast<float>(cpu::kNsEps),
                                     nullptr);
    MOELAB_CUDA(cudaGetLastError());
    void* p = x;
    void* q = ping_.data();
    const float a = static_cast<float>(cpu::kNsA), bc = static_cast<float>(cpu::kNsB),
                c = static_cast<float>(cpu::kNsC);
    for (int s = 0; s < steps; ++s) {
      if (wide) {
        Gemm(bf16_, CUBLAS_OP_T, CUBLAS_OP_N, m, m, b.cols, 1.0f, p, ld, elems, p, ld, elems, 0.0f,
             gram_.data(), m, mm, b.batch);
      } else {
        Gemm(bf16_, CUBLAS_OP_N, CUBLAS_OP_T, m, m, b.rows, 1.0f, p, ld, elems, p, ld, elems, 0.0f,
             gram_.data(), m, mm, b.batch);
      }
      MOELAB_CUDA(cudaMemcpyAsync(poly_.data(), gram_.data(), b.batch * mm * elem,
                                  cudaMemcpyDeviceToDevice));
      Gemm(bf16_, CUBLAS_OP_N, CUBLAS_OP_N, m, m, m, c, gram_.data(), m, mm, gram_.data(), m, mm,
           bc, poly_.data(), m, mm, b.batch);
      MOELAB_CUDA(cudaMemcpyAsync(q, p, b.batch * elems * elem, cudaMemcpyDeviceToDevice));
      if (wide) {
        Gemm(bf16_, CUBLAS_OP_N, CUBLAS_OP_N, b.cols, b.rows, m, 1.0f, p, ld, elems, poly_.data(),
             m, mm, a, q, ld, elems, b.batch);
      } else {
        Gemm(bf16_, CUBLAS_OP_N, CUBLAS_OP_N, b.cols, b.rows, m, 1.0f, poly_.data(), m, mm, p, ld,
             elems, a, q, ld, elems, b.batch);
      }
      std::swap(p, q);
    }
    if (p != x) {
      MOELAB_CUDA(cudaMemcpyAsync(x, p, b.batch * elems * elem, cudaMemcpyDeviceToDevice));
    }
  }

  OptimizerConfig config_;
  bool bf16_;
  std::vector<Bank> banks_;
  DeviceBuffer<cudaopt::MuonTensor> tensors_;
  int num_tensors_ = 0;
  uint64_t max_size_ = 0;
  std::vector<float> momentum_host_;
  DeviceBuffer<float> momentum_;
  DeviceBuffer<unsigned char> bank_, ping_, gram_, poly_;  // fp32 or bf16 elements
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

void ApplyQkClipPlanOnDevice(const QkClipPlan& plan, float* device_arena) {
  if (plan.scales.empty()) return;
  std::vector<cudaopt::ScaleRange> ranges;
  uint64_t max_count = 0;
  for (const RowScale& r : plan.scales) {
    ranges.push_back({r.offset, r.count, r.factor});
    max_count = std::max<uint64_t>(max_count, r.count);
  }
  DeviceBuffer<cudaopt::ScaleRange> d = ToDevice(ranges);
  cudaopt::LaunchScaleRanges(d.data(), static_cast<int>(ranges.size()), max_count, device_arena,
                             nullptr);
  MOELAB_CUDA(cudaGetLastError());
  MOELAB_CUDA(cudaDeviceSynchronize());  // d is freed on return
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
void ApplyQkClipPlanOnDevice(const QkClipPlan&, float*) {
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
