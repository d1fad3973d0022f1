// The host optimizer ops (core/model/optimizer_ops.h): the element loops of AdamW and Muon as
// their defining equations, Newton–Schulz from kernels/cpu. Loops over more than 2^16 elements
// are split over the OpenMP threads; each element's arithmetic does not depend on the split, so
// results are the same bits for every thread count. A host backend has no weight copy: the ops
// ignore `copy`.
#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "core/model/optimizer_ops.h"
#include "kernels/cpu/newton_schulz.h"
#include "kernels/cpu/sum_squares.h"

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

namespace {

struct HostAdamWTable final : OptimizerOps::AdamWTable {
  std::vector<AdamWTensor> tensors;
};

struct HostMuonBank final : OptimizerOps::MuonBank {
  std::vector<MuonTensor> tensors;
  std::vector<MuonBankShape> shapes;
  std::vector<float> values;
  cpu::NewtonSchulzWorkspace<float> ws;
  size_t workspace_bytes() const override { return ws.bytes(); }
};

class HostOptimizerOps final : public OptimizerOps {
 public:
  BackendMemory& memory() override { return Host(); }

  std::unique_ptr<AdamWTable> MakeAdamWTable(const std::vector<AdamWTensor>& tensors) override {
    auto t = std::make_unique<HostAdamWTable>();
    t->tensors = tensors;
    return t;
  }

  void AdamWStep(const AdamWTable& table, const AdamWScalars& s, float* params, const float* grads,
                 float* m_all, float* v_all, WeightCopy*) override {
    const float fb1 = s.b1, fb2 = s.b2, eps = s.eps;
    const float step_size = s.step_size, inv_sqrt_c2 = s.inv_sqrt_c2;
    for (const AdamWTensor& t : static_cast<const HostAdamWTable&>(table).tensors) {
      const float decay = t.decay ? s.decay : 1.0f;
      float* w = params + t.offset;
      const float* g = grads + t.offset;
      float* m = m_all + t.state_offset;
      float* v = v_all + t.state_offset;
      const long n = static_cast<long>(t.size);
#pragma omp parallel for simd schedule(static) if (n > 65536)
      for (long i = 0; i < n; ++i) {
        m[i] = fb1 * m[i] + (1.0f - fb1) * g[i];
        v[i] = fb2 * v[i] + (1.0f - fb2) * g[i] * g[i];
        const float denom = std::sqrt(v[i]) * inv_sqrt_c2 + eps;
        w[i] = w[i] * decay - step_size * m[i] / denom;
      }
    }
  }

  std::unique_ptr<MuonBank> MakeMuonBank(const std::vector<MuonTensor>& tensors,
                                         const std::vector<MuonBankShape>& shapes) override {
    auto b = std::make_unique<HostMuonBank>();
    b->tensors = tensors;
    b->shapes = shapes;
    size_t total = 0;
    for (const MuonBankShape& s : shapes) {
      total = std::max(total, s.offset + static_cast<size_t>(s.batch) * s.rows * s.cols);
    }
    b->values.assign(total, 0.0f);
    return b;
  }

  void MuonMomentum(MuonBank& bank, const float* grads, float* momentum, float mu,
                    bool nesterov) override {
    HostMuonBank& b = static_cast<HostMuonBank&>(bank);
    for (const MuonTensor& t : b.tensors) {
      const float* g = grads + t.offset;
      float* m = momentum + t.momentum_offset;
      float* u = b.values.data() + t.bank_offset;
      const long n = static_cast<long>(t.size);
      if (nesterov) {
#pragma omp parallel for simd schedule(static) if (n > 65536)
        for (long i = 0; i < n; ++i) {
          m[i] = mu * m[i] + g[i];
          u[i] = g[i] + mu * m[i];
        }
      } else {
#pragma omp parallel for simd schedule(static) if (n > 65536)
        for (long i = 0; i < n; ++i) {
          m[i] = mu * m[i] + g[i];
          u[i] = m[i];
        }
      }
    }
  }

  void NewtonSchulz(MuonBank& bank, const cpu::NewtonSchulzOptions& options) override {
    HostMuonBank& b = static_cast<HostMuonBank&>(bank);
    for (const MuonBankShape& s : b.shapes) {
      float* x = b.values.data() + s.offset;
      cpu::NewtonSchulz(x, x, s.batch, s.rows, s.cols, options, &b.ws);
    }
  }

  void MuonApply(MuonBank& bank, float* params, double lr, float decay, WeightCopy*) override {
    HostMuonBank& b = static_cast<HostMuonBank&>(bank);
    for (const MuonTensor& t : b.tensors) {
      float* w = params + t.offset;
      const float* o = b.values.data() + t.bank_offset;
      const float step_size = static_cast<float>(lr * t.scale);
      const long n = static_cast<long>(t.size);
#pragma omp parallel for simd schedule(static) if (n > 65536)
      for (long i = 0; i < n; ++i) w[i] = w[i] * decay - step_size * o[i];
    }
  }

  double SumSquares(const float* x, size_t n) override { return cpu::SumSquares(x, n); }

  void Scale(float* x, size_t n, float s) override {
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; ++i) x[i] *= s;
  }

  void ScaleRows(const std::vector<RowScale>& rows, float* arena, WeightCopy*) override {
    for (const RowScale& r : rows) {
      float* p = arena + r.offset;
      const float factor = static_cast<float>(r.factor);
      for (size_t i = 0; i < r.count; ++i) p[i] *= factor;
    }
  }
};

}  // namespace

OptimizerOps& CpuOptimizerOps() {
  static HostOptimizerOps ops;
  return ops;
}

}  // namespace moelab
