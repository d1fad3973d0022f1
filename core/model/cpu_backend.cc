// The CPU backend of core/model/backend.h: host memory, kernels/cpu (OpenBLAS GEMMs, OpenMP
// loops), the CPU MoE ops of core/model/cpu_moe.h. float for training, double for the
// finite-difference checks.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <new>
#include <stdexcept>
#include <type_traits>

#include "core/model/backend.h"
#include "core/model/cpu_moe.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/cross_entropy.h"
#include "kernels/cpu/embedding.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/norm.h"
#include "kernels/cpu/rope.h"
#include "kernels/cpu/sum_squares.h"
#include "kernels/cpu/swiglu.h"

namespace moelab {

namespace {

template <typename T>
class CpuBackend final : public Backend<T> {
 public:
  std::string name() const override { return "cpu"; }
  bool is_host() const override { return true; }
  // Memory: plain host memory (core/model/backend_memory.h).
  void* Allocate(size_t bytes) override { return Host().Allocate(bytes); }
  void Release(void* p) noexcept override { Host().Release(p); }
  void ToBackend(void* dst, const void* host, size_t bytes) override {
    Host().ToBackend(dst, host, bytes);
  }
  void ToHost(void* host, const void* src, size_t bytes) const override {
    Host().ToHost(host, src, bytes);
  }
  void Copy(void* dst, const void* src, size_t bytes) override { Host().Copy(dst, src, bytes); }
  void Zero(void* p, size_t bytes) override { Host().Zero(p, bytes); }

  void SetWeights(const T*, size_t) override {}
  void WeightsChanged() override {}

  void Linear(const T* x, const T* w, int n, int in, int out, T* y, bool accumulate) override {
    cpu::LinearForward(x, w, n, in, out, y, accumulate);
  }
  void LinearBackward(const T* x, const T* w, const T* dy, int n, int in, int out, T* dx, T* dw,
                      bool accumulate_dx, bool accumulate_dw) override {
    cpu::LinearBackward(x, w, dy, n, in, out, dx, dw, accumulate_dx, accumulate_dw);
  }
  void FfnForward(const T* x, int n, int d, int hidden, const T* w1, const T* w3, const T* w2,
                  T* h1, T* h3, T* act, T* y) override {
    cpu::SwigluForward(x, n, d, hidden, w1, w3, w2, h1, h3, act, y);
  }
  void FfnBackward(const T* x, int n, int d, int hidden, const T* w1, const T* w3, const T* w2,
                   const T* h1, const T* h3, const T* act, const T* dy, T* dx, T* dw1, T* dw3,
                   T* dw2, T* scratch) override {
    cpu::SwigluBackward(x, n, d, hidden, w1, w3, w2, h1, h3, act, dy, dx, dw1, dw3, dw2, scratch);
  }

  void RmsNorm(const T* x, const T* gain, int n, int d, double eps, T* y, T* rstd) override {
    cpu::RmsNormForward(x, gain, n, d, eps, y, rstd);
  }
  void RmsNormBackward(const T* x, const T* gain, const T* rstd, const T* dy, int n, int d, T* dx,
                       T* dgain, bool accumulate_dx) override {
    cpu::RmsNormBackward(x, gain, rstd, dy, n, d, dx, dgain, accumulate_dx);
  }
  void AddRmsNorm(const T* a, const T* b, T* sum, const T* gain, int n, int d, double eps, T* y,
                  T* rstd) override {
    cpu::AddRmsNormForward(a, b, sum, gain, n, d, eps, y, rstd);
  }
  void RmsNormGroups(const T* x, int ldx, T* y, int ldy, int n, int groups, int d, const T* gain,
                     double eps, T* rstd) override {
    cpu::RmsNormGroupsForward(x, ldx, y, ldy, n, groups, d, gain, eps, rstd);
  }
  void RmsNormGroupsBackward(const T* x, int ldx, const T* gain, const T* rstd, const T* dy,
                             int lddy, T* dx, int lddx, int n, int groups, int d,
                             T* dgain) override {
    cpu::RmsNormGroupsBackward(x, ldx, gain, rstd, dy, lddy, dx, lddx, n, groups, d, dgain);
  }

  // Probabilities [B,H,S,S], then (soft-capping) the capped logits.
  size_t AttentionSavedElements(const cpu::AttentionDims& a) override {
    return ProbabilitiesSaved(a);
  }
  size_t AttentionScratchElements(const cpu::AttentionDims& a) override {
    return cpu::AttentionScratchSize(a, omp_get_max_threads());
  }
  void AttentionForward(const cpu::AttentionDims& a, const T* q, const T* k, const T* v, T* saved,
                        T* out, T* pair_max) override {
    cpu::AttentionForward(a, q, k, v, saved, CappedPart(saved, a), out, pair_max);
  }
  void AttentionBackward(const cpu::AttentionDims& a, const T* q, const T* k, const T* v, const T*,
                         const T* saved, const T* dout, T* dq, T* dk, T* dv, T* scratch) override {
    cpu::AttentionBackward(a, q, k, v, saved, CappedPart(saved, a), dout, dq, dk, dv, scratch);
  }
  void HeadMax(const T* pair_max, int batch, int heads, T* head_max) override {
    for (int h = 0; h < heads; ++h) {
      T mx = -std::numeric_limits<T>::infinity();
      for (int b = 0; b < batch; ++b) mx = std::max(mx, pair_max[b * heads + h]);
      head_max[h] = mx;
    }
  }
  void Rope(T* x, int n, int seq, int ld, int heads, int head_stride, int offset, int rot_dim,
            const T* cos, const T* sin, bool inverse) override {
    cpu::RopeApply(x, n, seq, ld, heads, head_stride, offset, rot_dim, cos, sin, inverse);
  }
  void RopeQk(const cpu::RopeSlice<T>& q, const cpu::RopeSlice<T>& k, int n, int seq, int rot_dim,
              const T* cos, const T* sin, bool inverse) override {
    cpu::RopeApplyQk(q, k, n, seq, rot_dim, cos, sin, inverse);
  }
  void CopyHeads(const T* src, int lds, int src_stride, int src_off, T* dst, int ldd,
                 int dst_stride, int dst_off, int n, int heads, int width) override {
    const bool par = static_cast<long>(n) * heads * width > 65536;
#pragma omp parallel for schedule(static) if (par)
    for (int r = 0; r < n; ++r) {
      const T* s = src + static_cast<long>(r) * lds + src_off;
      T* o = dst + static_cast<long>(r) * ldd + dst_off;
      for (int h = 0; h < heads; ++h) {
        std::memcpy(o + h * dst_stride, s + h * src_stride, sizeof(T) * width);
      }
    }
  }
  void SumHeads(const T* src, int lds, int src_stride, int src_off, T* dst, int ldd, int n,
                int heads, int width) override {
    const bool par = static_cast<long>(n) * heads * width > 65536;
#pragma omp parallel for schedule(static) if (par)
    for (int r = 0; r < n; ++r) {
      const T* s = src + static_cast<long>(r) * lds + src_off;
      T* o = dst + static_cast<long>(r) * ldd;
      for (int j = 0; j < width; ++j) o[j] = 0;
      for (int h = 0; h < heads; ++h) {
        for (int j = 0; j < width; ++j) o[j] += s[h * src_stride + j];
      }
    }
  }
  void CopyRows(const T* src, int lds, T* dst, int ldd, int rows, int cols) override {
    for (int r = 0; r < rows; ++r) {
      std::memcpy(dst + static_cast<long>(r) * ldd, src + static_cast<long>(r) * lds,
                  sizeof(T) * cols);
    }
  }

  void Embedding(const T* table, const int32_t* tokens, int n, int d, T* out) override {
    cpu::EmbeddingForward(table, tokens, n, d, out);
  }
  void EmbeddingBackward(const int32_t* tokens, const T* dout, int n, int d, T* dtable) override {
    cpu::EmbeddingBackward(tokens, dout, n, d, dtable);
  }
  LossTerms CrossEntropy(T* logits, const int32_t* targets, int n, int vocab, double z_coef,
                         bool backward, double* row_scratch) override {
    const cpu::CrossEntropyResult r =
        cpu::CrossEntropy(logits, targets, n, vocab, z_coef, backward, row_scratch);
    return {r.loss, r.z_loss};
  }
  LossTerms LmHeadLossChunk(const LmHeadChunk<T>& c) override {
    return ComposeLmHeadLossChunk<T>(*this, c);
  }
  void Add(const T* a, const T* b, T* out, size_t count) override {
    const long n = static_cast<long>(count);
#pragma omp parallel for simd schedule(static) if (n > 65536)
    for (long i = 0; i < n; ++i) out[i] = a[i] + b[i];
  }

  std::unique_ptr<MoeExperts<T>> MakeMoeExperts(const ModelConfig& m, const MoEConfig& e, int,
                                                int) override {
    return std::make_unique<CpuMoeExperts<T>>(m, e);
  }

  double SumSquares(const T* x, size_t n) override { return cpu::SumSquares(x, n); }
  void Scale(T* x, size_t n, T s) override {
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; ++i) x[i] *= s;
  }
  void ScaledSum(const T* g, double w, bool first, T* acc, size_t count) override {
    const T wt = static_cast<T>(w);
    const long n = static_cast<long>(count);
    if (first) {
#pragma omp parallel for simd schedule(static)
      for (long i = 0; i < n; ++i) acc[i] = wt * g[i];
    } else {
#pragma omp parallel for simd schedule(static)
      for (long i = 0; i < n; ++i) acc[i] += wt * g[i];
    }
  }
  void FinishScaledSum(const T* acc, double w, T* g, size_t count) override {
    const T wt = static_cast<T>(w);
    const long n = static_cast<long>(count);
#pragma omp parallel for simd schedule(static)
    for (long i = 0; i < n; ++i) g[i] = acc[i] + wt * g[i];
  }
  void ScaleRows(const std::vector<RowScale>& rows, T* arena) override {
    if constexpr (std::is_same_v<T, float>) {
      CpuOptimizerOps().ScaleRows(rows, arena, nullptr);
    } else {
      for (const RowScale& r : rows) {
        T* p = arena + r.offset;
        for (size_t i = 0; i < r.count; ++i) p[i] *= static_cast<T>(r.factor);
      }
    }
  }
};

}  // namespace

template <typename T>
std::unique_ptr<Backend<T>> MakeCpuBackend() {
  return std::make_unique<CpuBackend<T>>();
}

template std::unique_ptr<Backend<float>> MakeCpuBackend<float>();
template std::unique_ptr<Backend<double>> MakeCpuBackend<double>();

}  // namespace moelab
