// Global-batch balancing (MoeBatchStatsHook, issue 23): P pieces of a batch (data-parallel
// ranks, or micro-batches), each run by its own layer with the batch's aux-loss statistics
// supplied by the hook, must compute what one layer computes on the whole batch: the same aux
// loss and outputs, P times its input gradients (each piece's objective is P·Σ y·R + aux, whose
// mean over the pieces is the batch objective Σ y·R + aux) and, averaged over the pieces, its
// weight gradients. In double, so the only difference is summation order.
// Without the hook (each piece balancing its own tokens: the old per-rank aux loss) the router
// gradient differs, which the test also shows.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "core/model/cpu_moe.h"
#include "tests/common/random_fill.h"
#include "tests/common/tiny_configs.h"

namespace moelab {
namespace {

struct Case {
  std::string router = "softmax";
  int experts = 4, k = 2, shared = 1, pieces = 4;
};

constexpr int kD = 8, kHidden = 6, kTokensPerPiece = 6;

std::vector<double> Random(size_t n, double stddev, uint64_t seed) {
  return test::RandomNormal<double>(n, stddev, seed);
}

struct Setup {
  ModelConfig model;
  MoEConfig moe;
  size_t E, S, wsize;
  std::vector<double> params, x, r;
  explicit Setup(const Case& c) {
    model.d_model = kD;
    test::UseMoe(&moe, {.experts = c.experts, .top_k = c.k, .shared = c.shared, .hidden = kHidden});
    moe.router = c.router;
    moe.balance = "aux_loss";
    moe.aux_loss_coef = 0.5;  // large, so the aux term is a visible part of the router gradient
    E = c.experts;
    S = c.shared;
    wsize = static_cast<size_t>(kHidden) * kD;
    params = Random(size(), 0.4, 3);
    const size_t n = static_cast<size_t>(c.pieces) * kTokensPerPiece;
    x = Random(n * kD, 1.0, 4);
    r = Random(n * kD, 1.0, 5);
  }
  size_t size() const { return E * kD + 3 * E * wsize + 3 * S * wsize; }
  MoeWeights<double> View(std::vector<double>& v) const {
    double* p = v.data();
    double* sh = p + E * kD + 3 * E * wsize;
    return {p,
            p + E * kD,
            p + E * kD + E * wsize,
            p + E * kD + 2 * E * wsize,
            S ? sh : nullptr,
            S ? sh + S * wsize : nullptr,
            S ? sh + 2 * S * wsize : nullptr};
  }
};

struct Result {
  double aux = 0;
  std::vector<double> y, dx, grads;
};

// Forward + backward of `tokens` tokens starting at token `first`, objective scale·Σ y·R + aux.
Result Run(const Setup& s, CpuMoeLayer<double>& layer, int first, int tokens, double scale) {
  Result res;
  const size_t off = static_cast<size_t>(first) * kD, nd = static_cast<size_t>(tokens) * kD;
  std::vector<double> w = s.params;
  res.grads.assign(s.size(), 0.0);
  res.y.assign(nd, 0.0);
  res.dx.assign(nd, 0.0);
  std::vector<int64_t> counts(s.E);
  res.aux =
      layer.Forward(s.View(w), nullptr, s.x.data() + off, tokens, res.y.data(), counts.data());
  std::vector<double> dy(s.r.begin() + off, s.r.begin() + off + nd);
  for (double& v : dy) v *= scale;
  layer.Backward(s.View(w), s.View(res.grads), s.x.data() + off, dy.data(), tokens, res.dx.data());
  return res;
}

void ExpectNear(const std::vector<double>& a, const std::vector<double>& b, double tol,
                const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_NEAR(a[i], b[i], tol * (1 + std::abs(b[i]))) << what << "[" << i << "]";
  }
}

// Largest |difference| of the router gradient (the aux loss's only target).
double RouterGradDiff(const Setup& s, const std::vector<double>& a, const std::vector<double>& b) {
  double d = 0;
  for (size_t i = 0; i < s.E * kD; ++i) d = std::max(d, std::abs(a[i] - b[i]));
  return d;
}

void CheckPiecesMatchBatch(const Case& c) {
  const Setup s(c);
  const int P = c.pieces, n = P * kTokensPerPiece;
  CpuMoeLayer<double> whole(s.model, s.moe);
  const Result ref = Run(s, whole, 0, n, 1.0);
  ASSERT_GT(ref.aux, 0);

  // Pass 1 gathers the batch's statistics piece by piece (what a micro-batching loop would do
  // before the step, or what the all-reduce sums); pass 2 supplies them to every piece.
  std::vector<int64_t> counts(s.E, 0);
  std::vector<double> sums(s.E, 0.0);
  int64_t tokens = 0;
  std::vector<CpuMoeLayer<double>> layers;
  for (int p = 0; p < P; ++p) layers.emplace_back(s.model, s.moe);
  for (int p = 0; p < P; ++p) {
    layers[p].SetBatchStatsHook(
        [&](int layer, MoeBatchStats& st) {
          EXPECT_EQ(layer, 3);
          EXPECT_EQ(st.experts, c.experts);
          for (int e = 0; e < st.experts; ++e) {
            counts[e] += st.counts[e];
            sums[e] += st.score_sums[e];
          }
          tokens += *st.tokens;
        },
        3);
    Run(s, layers[p], p * kTokensPerPiece, kTokensPerPiece, P);
  }
  ASSERT_EQ(tokens, n);
  Result mean;
  mean.grads.assign(s.size(), 0.0);
  for (int p = 0; p < P; ++p) {
    layers[p].SetBatchStatsHook(
        [&](int, MoeBatchStats& st) {
          std::copy(counts.begin(), counts.end(), st.counts);
          std::copy(sums.begin(), sums.end(), st.score_sums);
          *st.tokens = tokens;
        },
        3);
    const Result r = Run(s, layers[p], p * kTokensPerPiece, kTokensPerPiece, P);
    EXPECT_NEAR(r.aux, ref.aux, 1e-14 * ref.aux) << "piece " << p;
    const size_t off = static_cast<size_t>(p) * kTokensPerPiece * kD;
    const std::vector<double> y_ref(ref.y.begin() + off, ref.y.begin() + off + r.y.size());
    const std::vector<double> dx_ref(ref.dx.begin() + off, ref.dx.begin() + off + r.dx.size());
    std::vector<double> dx = r.dx;
    for (double& v : dx) v /= P;
    ExpectNear(r.y, y_ref, 1e-14, "y");
    ExpectNear(dx, dx_ref, 1e-12, "dx");
    for (size_t i = 0; i < mean.grads.size(); ++i) mean.grads[i] += r.grads[i] / P;
  }
  ExpectNear(mean.grads, ref.grads, 1e-12, "weight gradients");

  // The old per-piece aux loss: a different objective, visibly so in the router gradient.
  Result local;
  local.grads.assign(s.size(), 0.0);
  for (int p = 0; p < P; ++p) {
    CpuMoeLayer<double> alone(s.model, s.moe);
    const Result r = Run(s, alone, p * kTokensPerPiece, kTokensPerPiece, P);
    for (size_t i = 0; i < local.grads.size(); ++i) local.grads[i] += r.grads[i] / P;
  }
  const double global_gap = RouterGradDiff(s, mean.grads, ref.grads);
  const double local_gap = RouterGradDiff(s, local.grads, ref.grads);
  std::printf(
      "%s top-%d, %d pieces: router gradient vs the whole batch %.2e (per-piece aux "
      "loss: %.2e)\n",
      c.router.c_str(), c.k, P, global_gap, local_gap);
  EXPECT_GT(local_gap, 1e3 * std::max(global_gap, 1e-15));
}

TEST(MoeBatchStats, PiecesWithBatchStatisticsMatchTheWholeBatchSoftmax) {
  CheckPiecesMatchBatch(Case{});
}

TEST(MoeBatchStats, PiecesWithBatchStatisticsMatchTheWholeBatchSigmoidTop1) {
  CheckPiecesMatchBatch(Case{.router = "sigmoid", .k = 1, .shared = 0, .pieces = 2});
}

}  // namespace
}  // namespace moelab
