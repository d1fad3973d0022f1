// GPU twins of the LM head + loss ops (Backend::LmHeadLossChunk and LmHeadLoss,
// core/model/cuda_backend.cc): CUDA fp32 against the CPU backend, and the bf16 mode (bf16 logits
// and dlogits, no fp32 logits) against CUDA fp32 on the same inputs, as one chunk and as two
// weighted chunks that accumulate dW. Skip with the reason where no GPU is usable.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "core/config.h"
#include "core/model/backend.h"
#include "tests/cuda_kernels/cuda_test_util.h"

namespace moelab {
namespace {

constexpr double kU = 1.0 / 256;  // bf16's unit roundoff, 2^-8

struct Problem {
  int n = 96, d = 64, vocab = 1000;
  double z = 1e-4;
  std::vector<float> x, w;
  std::vector<int32_t> targets;
};

Problem Make() {
  Problem p;
  p.x = cuda::testing::Random(static_cast<size_t>(p.n) * p.d, 1, -1, 1);
  p.w = cuda::testing::Random(static_cast<size_t>(p.vocab) * p.d, 2, -0.5f, 0.5f);
  for (int i = 0; i < p.n; ++i) p.targets.push_back((i * 7919) % p.vocab);
  return p;
}

struct Out {
  LossTerms terms;
  std::vector<float> dx, dw;
};

// The problem's arrays on `be` (logits and row scratch for chunks of rows_per rows), the head
// registered as the weights.
struct OnBackend {
  BackendArray<float> w, x, logits, dx, dw;
  BackendArray<int32_t> t;
  BackendArray<double> rows;
  OnBackend(Backend<float>* be, const Problem& p, int rows_per)
      : w(be), x(be), logits(be), dx(be), dw(be), t(be), rows(be) {
    w.Resize(p.w.size()), w.Upload(p.w.data(), p.w.size());
    x.Resize(p.x.size()), x.Upload(p.x.data(), p.x.size());
    t.Resize(p.n), t.Upload(p.targets.data(), p.n);
    logits.Resize(static_cast<size_t>(rows_per) * p.vocab);
    rows.Resize(2 * rows_per + 2);
    dx.Resize(p.x.size()), dw.Resize(p.w.size());
    be->SetWeights(w.data(), w.size());
    be->WeightsChanged();
  }
  Out Read(const LossTerms& terms) const {
    Out out;
    out.terms = terms;
    out.dx.resize(dx.size()), out.dw.resize(dw.size());
    dx.Download(out.dx.data(), out.dx.size());
    dw.Download(out.dw.data(), out.dw.size());
    return out;
  }
};

// The model's former OutputLoss on `be`: `chunks` equal row chunks, each weighted by its share.
Out RunChunks(Backend<float>* be, const Problem& p, int chunks) {
  const int rows_per = p.n / chunks;
  OnBackend a(be, p, rows_per);
  LossTerms terms;
  for (int k = 0; k < chunks; ++k) {
    LmHeadChunk<float> c;
    c.x = a.x.data() + static_cast<size_t>(k) * rows_per * p.d;
    c.w = a.w.data();
    c.targets = a.t.data() + k * rows_per;
    c.rows = rows_per, c.d = p.d, c.vocab = p.vocab, c.z_coef = p.z;
    c.weight = chunks == 1 ? 1.0 : 1.0 / chunks;
    c.backward = true;
    c.logits = a.logits.data();
    c.row_scratch = a.rows.data();
    c.dx = a.dx.data() + static_cast<size_t>(k) * rows_per * p.d;
    c.dw = a.dw.data();
    c.accumulate_dw = k > 0;
    const LossTerms part = be->LmHeadLossChunk(c);
    terms.loss = std::fma(c.weight, part.loss, terms.loss);  // as ComposeLmHeadLoss
    terms.z_loss = std::fma(c.weight, part.z_loss, terms.z_loss);
  }
  return a.Read(terms);
}

// The same through the whole-head op (LmHeadLoss): the backend walks the chunks.
Out RunWhole(Backend<float>* be, const Problem& p, int chunks) {
  const int rows_per = p.n / chunks;
  OnBackend a(be, p, rows_per);
  LmHeadChunk<float> all;
  all.rows = p.n, all.x = a.x.data(), all.w = a.w.data(), all.targets = a.t.data();
  all.d = p.d, all.vocab = p.vocab, all.z_coef = p.z, all.backward = true;
  all.logits = a.logits.data(), all.row_scratch = a.rows.data();
  all.dx = a.dx.data(), all.dw = a.dw.data();
  return a.Read(be->LmHeadLoss(all, rows_per));
}

std::unique_ptr<Backend<float>> Cuda(const std::string& precision) {
  RunConfig c;
  c.train.device = "cuda";
  c.train.precision = precision;
  return MakeCudaBackend(c);
}

Out RunCuda(const std::string& precision, const Problem& p, int chunks) {
  return RunChunks(Cuda(precision).get(), p, chunks);
}

double RelFrobenius(const std::vector<float>& got, const std::vector<float>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    num += (static_cast<double>(got[i]) - want[i]) * (static_cast<double>(got[i]) - want[i]);
    den += static_cast<double>(want[i]) * want[i];
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

// B = the largest Σ_k |x_ik·w_jk|: rounding x and w to bf16 moves a logit by at most 2u·B, and
// the bf16 logit itself by u·|logit| ≤ u·B, so a row's loss by at most 2·3u·B.
double LogitBound(const Problem& p) {
  double b = 0;
  for (int i = 0; i < p.n; ++i)
    for (int j = 0; j < p.vocab; ++j) {
      double s = 0;
      for (int k = 0; k < p.d; ++k) s += std::fabs(p.x[i * p.d + k] * p.w[j * p.d + k]);
      b = std::max(b, s);
    }
  return b;
}

TEST(LmHeadLossChunk, CudaFp32MatchesCpu) {
  MOELAB_REQUIRE_GPU();
  const Problem p = Make();
  const Out gpu = RunCuda("fp32", p, 2);
  const Out cpu = RunChunks(MakeCpuBackend<float>().get(), p, 2);
  EXPECT_NEAR(gpu.terms.loss, cpu.terms.loss, 1e-5 * cpu.terms.loss);
  EXPECT_NEAR(gpu.terms.z_loss, cpu.terms.z_loss, 1e-5 * cpu.terms.z_loss);
  EXPECT_LT(RelFrobenius(gpu.dx, cpu.dx), 1e-5);
  EXPECT_LT(RelFrobenius(gpu.dw, cpu.dw), 1e-5);
}

// bf16 (one chunk, and two weighted chunks accumulating dW) against fp32 on the same inputs.
// dx and dW: bf16 inputs and dlogits put a relative error of a few u on each product and on
// each softmax value; 2e-2 in the Frobenius norm is ~10u.
TEST(LmHeadLossChunk, Bf16CloseToFp32) {
  MOELAB_REQUIRE_GPU();
  const Problem p = Make();
  const Out want = RunCuda("fp32", p, 1);
  const double loss_tol = 6 * kU * LogitBound(p);
  for (int chunks : {1, 2}) {
    SCOPED_TRACE(::testing::Message() << chunks << " chunk(s)");
    const Out got = RunCuda("bf16", p, chunks);
    EXPECT_NEAR(got.terms.loss, want.terms.loss, loss_tol);
    EXPECT_NEAR(got.terms.z_loss, want.terms.z_loss, 2e-2 * want.terms.z_loss);
    EXPECT_LT(RelFrobenius(got.dx, want.dx), 2e-2);
    EXPECT_LT(RelFrobenius(got.dw, want.dw), 2e-2);
  }
  // Not vacuous: the bound is a small part of the loss (≈ log V).
  EXPECT_LT(loss_tol, 0.1 * want.terms.loss);
}

// The whole head in one op (LmHeadLoss): in bf16 the chunks' terms are summed on the device and
// read once; the sums are the host's (weight·terms in chunk order) bit for bit, and dx, dW the
// chunk ops' bits, for one, two and three chunks; fp32 composes the chunk ops (the same bits).
TEST(LmHeadLoss, SummedOnTheDeviceAsTheHostSumsTheChunks) {
  MOELAB_REQUIRE_GPU();
  const Problem p = Make();
  for (const char* precision : {"bf16", "fp32"}) {
    for (int chunks : {1, 2, 3}) {
      SCOPED_TRACE(::testing::Message() << precision << ", " << chunks << " chunk(s)");
      const Out host = RunChunks(Cuda(precision).get(), p, chunks);
      const Out device = RunWhole(Cuda(precision).get(), p, chunks);
      EXPECT_EQ(device.terms.loss, host.terms.loss);
      EXPECT_EQ(device.terms.z_loss, host.terms.z_loss);
      EXPECT_EQ(device.dx, host.dx);
      EXPECT_EQ(device.dw, host.dw);
    }
  }
}

// On the CPU (no GPU needed) the whole-head op is the chunk ops in the model's former loop.
TEST(LmHeadLoss, CpuComposesTheChunkOps) {
  const Problem p = Make();
  for (int chunks : {1, 3}) {
    SCOPED_TRACE(::testing::Message() << chunks << " chunk(s)");
    const Out whole = RunWhole(MakeCpuBackend<float>().get(), p, chunks);
    const Out each = RunChunks(MakeCpuBackend<float>().get(), p, chunks);
    EXPECT_EQ(whole.terms.loss, each.terms.loss);
    EXPECT_EQ(whole.terms.z_loss, each.terms.z_loss);
    EXPECT_EQ(whole.dx, each.dx);
    EXPECT_EQ(whole.dw, each.dw);
    EXPECT_GT(whole.terms.loss, 1.0);
  }
}

}  // namespace
}  // namespace moelab
