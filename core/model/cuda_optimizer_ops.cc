// The CUDA optimizer ops (core/model/cuda_optimizer_ops.h): tables uploaded once, then one launch
// per op and step (Newton–Schulz: one batched call per bank shape).
#include "core/model/cuda_optimizer_ops.h"

#if MOELAB_HAVE_CUDA
#include <algorithm>
#include <cstdint>

#include "kernels/cuda/newton_schulz.h"
#include "kernels/cuda/optim.h"

namespace moelab {

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

cuda::bf16* CopyOf(WeightCopy* copy) {
  return copy ? static_cast<cuda::bf16*>(copy->data()) : nullptr;
}

struct DeviceAdamWTable final : OptimizerOps::AdamWTable {
  cuda::DeviceBuffer<cuda::AdamWSegment> segments;
  uint64_t max_size = 0;
};

struct DeviceMuonBank final : OptimizerOps::MuonBank {
  cuda::DeviceBuffer<cuda::MuonSegment> tensors;
  int num_tensors = 0;
  uint64_t max_size = 0;
  std::vector<MuonBankShape> shapes;
  bool bf16 = false;
  cuda::DeviceBuffer<unsigned char> values, workspace;  // fp32 or bf16 elements
  size_t workspace_bytes() const override { return workspace.size(); }
};

template <typename U>
void Orthogonalise(DeviceMuonBank& b, int steps) {
  U* bank = reinterpret_cast<U*>(b.values.data());
  U* workspace = reinterpret_cast<U*>(b.workspace.data());
  for (const MuonBankShape& s : b.shapes) {
    U* x = bank + s.offset;
    cuda::NewtonSchulz<U>(x, x, s.batch, s.rows, s.cols, steps, workspace);
  }
}

}  // namespace

std::unique_ptr<OptimizerOps::AdamWTable> CudaOptimizerOps::MakeAdamWTable(
    const std::vector<AdamWTensor>& tensors) {
  auto t = std::make_unique<DeviceAdamWTable>();
  std::vector<cuda::AdamWSegment> segs;
  for (const AdamWTensor& a : tensors) {
    segs.push_back({a.offset, a.size, a.state_offset, a.decay ? 1 : 0});
    t->max_size = std::max<uint64_t>(t->max_size, a.size);
  }
  t->segments.Upload(segs);
  return t;
}

void CudaOptimizerOps::AdamWStep(const AdamWTable& table, const AdamWScalars& s, float* w,
                                 const float* g, float* m, float* v, WeightCopy* copy) {
  const auto& t = static_cast<const DeviceAdamWTable&>(table);
  cuda::AdamWScalars k;
  k.step_size = s.step_size;
  k.inv_sqrt_c2 = s.inv_sqrt_c2;
  k.eps = s.eps;
  k.b1 = s.b1;
  k.b2 = s.b2;
  k.decay = s.decay;
  cuda::AdamWFused(t.segments.data(), static_cast<int>(t.segments.size()), t.max_size, w, g, m, v,
                   CopyOf(copy), k);
}

std::unique_ptr<OptimizerOps::MuonBank> CudaOptimizerOps::MakeMuonBank(
    const std::vector<MuonTensor>& tensors, const std::vector<MuonBankShape>& shapes) {
  auto b = std::make_unique<DeviceMuonBank>();
  std::vector<cuda::MuonSegment> segs;
  for (const MuonTensor& t : tensors) {
    segs.push_back({t.offset, t.size, t.momentum_offset, t.bank_offset, t.scale});
    b->max_size = std::max<uint64_t>(b->max_size, t.size);
  }
  b->num_tensors = static_cast<int>(segs.size());
  b->tensors.Upload(segs);
  b->shapes = shapes;
  b->bf16 = ns_bf16_;
  size_t total = 0, workspace = 0;
  for (const MuonBankShape& s : shapes) {
    total = std::max(total, s.offset + static_cast<size_t>(s.batch) * s.rows * s.cols);
    workspace = std::max(workspace, cuda::NewtonSchulzWorkspaceSize(s.batch, s.rows, s.cols));
  }
  const size_t elem = ns_bf16_ ? sizeof(cuda::bf16) : sizeof(float);
  b->values.Resize(total * elem);
  b->values.Zero();
  b->workspace.Resize(workspace * elem);
  return b;
}

void CudaOptimizerOps::MuonMomentum(MuonBank& bank, const float* g, float* m, float mu,
                                    bool nesterov) {
  auto& b = static_cast<DeviceMuonBank&>(bank);
  if (b.bf16) {
    cuda::MuonMomentumFused(b.tensors.data(), b.num_tensors, b.max_size, g, m,
                            reinterpret_cast<cuda::bf16*>(b.values.data()), mu, nesterov);
  } else {
    cuda::MuonMomentumFused(b.tensors.data(), b.num_tensors, b.max_size, g, m,
                            reinterpret_cast<float*>(b.values.data()), mu, nesterov);
  }
}

void CudaOptimizerOps::NewtonSchulz(MuonBank& bank, const cpu::NewtonSchulzOptions& options) {
  auto& b = static_cast<DeviceMuonBank&>(bank);
  if (b.bf16) {
    Orthogonalise<cuda::bf16>(b, options.steps);
  } else {
    Orthogonalise<float>(b, options.steps);
  }
}

void CudaOptimizerOps::MuonApply(MuonBank& bank, float* w, double lr, float decay,
                                 WeightCopy* copy) {
  auto& b = static_cast<DeviceMuonBank&>(bank);
  if (b.bf16) {
    cuda::MuonApplyFused(b.tensors.data(), b.num_tensors, b.max_size, w,
                         reinterpret_cast<const cuda::bf16*>(b.values.data()), lr, decay,
                         CopyOf(copy));
  } else {
    cuda::MuonApplyFused(b.tensors.data(), b.num_tensors, b.max_size, w,
                         reinterpret_cast<const float*>(b.values.data()), lr, decay, CopyOf(copy));
  }
}

double CudaOptimizerOps::SumSquares(const float* x, size_t n) {
  if (sum_.size() == 0) sum_.Resize(1);
  cuda::SumSquares(x, n, sum_.data());
  double host = 0;
  MOELAB_CUDA_CHECK(cudaMemcpy(&host, sum_.data(), sizeof(double), cudaMemcpyDeviceToHost));
  return host;
}

void CudaOptimizerOps::Scale(float* x, size_t n, float s) { cuda::Scale(x, n, s); }

void CudaOptimizerOps::ScaleRows(const std::vector<RowScale>& rows, float* arena,
                                 WeightCopy* copy) {
  std::vector<cuda::ScaleRange> ranges;
  for (const RowScale& r : rows)
    ranges.push_back({r.offset, r.count, static_cast<float>(r.factor)});
  cuda::ScaleRanges(ranges, arena, CopyOf(copy));
}

}  // namespace moelab
#endif
