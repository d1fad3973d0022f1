// Newton–Schulz against the exact SVD picture: NS5 maps G = U·diag(σ)·Vᵀ to
// U·diag(p⁵(σ/‖σ‖_F))·Vᵀ with p the quintic, i.e. the polar factor U·Vᵀ up to the spread the
// non-convergent coefficients leave ([0.68, 1.135] for normalised σ in [0.01, 1]).
#include "kernels/cpu/newton_schulz.h"

#include <gtest/gtest.h>

#include <Eigen/Dense>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

namespace moelab::cpu {
namespace {

using MatD = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using MatF = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

double Quintic5(double s, int steps = 5) {
  for (int i = 0; i < steps; ++i) s = kNsA * s + kNsB * s * s * s + kNsC * s * s * s * s * s;
  return s;
}

// [min, max] of p⁵ over normalised singular values in [lo, 1], by a fine log scan.
std::pair<double, double> QuinticBand(double lo) {
  double mn = 1e9, mx = -1e9;
  const int n = 20000;
  for (int k = 0; k <= n; ++k) {
    const double v = Quintic5(std::pow(lo, 1.0 - static_cast<double>(k) / n));
    mn = std::min(mn, v);
    mx = std::max(mx, v);
  }
  return {mn, mx};
}

MatD RandomOrthonormalColumns(int n, int k, std::mt19937_64& rng) {
  std::normal_distribution<double> nd;
  MatD g(n, n);
  for (int i = 0; i < g.size(); ++i) g.data()[i] = nd(rng);
  MatD q = Eigen::HouseholderQR<MatD>(g).householderQ();
  return q.leftCols(k);
}

MatD GaussianD(int r, int c, std::mt19937_64& rng) {
  std::normal_distribution<double> nd;
  MatD g(r, c);
  for (int i = 0; i < g.size(); ++i) g.data()[i] = nd(rng);
  return g;
}

MatD RunNs(const MatD& a, NewtonSchulzOptions opt = {}) {
  MatD out(a.rows(), a.cols());
  NewtonSchulz<double>(a.data(), out.data(), 1, a.rows(), a.cols(), opt);
  return out;
}

struct PolarCase {
  int rows, cols;
  double cond;
};

class NsPolarTest : public ::testing::TestWithParam<PolarCase> {};

TEST_P(NsPolarTest, MatchesPolarFactorWithinQuinticBand) {
  const PolarCase c = GetParam();
  std::mt19937_64 rng(1000 + c.rows * 7 + c.cols * 13 + static_cast<int>(c.cond));
  const int k = std::min(c.rows, c.cols);
  // σ log-spaced from 1 down to 1/cond, scaled arbitrarily (NS must not care about scale).
  Eigen::VectorXd sigma(k);
  for (int i = 0; i < k; ++i)
    sigma[i] = 3.7 * std::pow(c.cond, -static_cast<double>(i) / std::max(1, k - 1));
  const MatD u = RandomOrthonormalColumns(c.rows, k, rng);
  const MatD v = RandomOrthonormalColumns(c.cols, k, rng);
  const MatD a = u * sigma.asDiagonal() * v.transpose();
  const MatD o = RunNs(a);

  // Exact prediction: NS acts on each singular value independently (the ε of the
  // normalisation included: it moves σ̂ by ~1e-8 relative here, visible at this tolerance).
  const double norm = sigma.norm() + kNsEps;
  const Eigen::VectorXd sigma_hat = sigma / norm;
  Eigen::VectorXd predicted(k);
  for (int i = 0; i < k; ++i) predicted[i] = Quintic5(sigma_hat[i]);
  const MatD expected = u * predicted.asDiagonal() * v.transpose();
  EXPECT_LT((o - expected).cwiseAbs().maxCoeff(), 1e-10);

  // Singular values of the output (its own SVD) equal the predicted ones and lie in the band.
  Eigen::JacobiSVD<MatD> out_svd(o);
  std::vector<double> got(out_svd.singularValues().data(), out_svd.singularValues().data() + k);
  std::vector<double> want(predicted.data(), predicted.data() + k);
  std::sort(got.begin(), got.end());
  std::sort(want.begin(), want.end());
  for (int i = 0; i < k; ++i) EXPECT_NEAR(got[i], want[i], 1e-10);
  const double lo = sigma_hat.minCoeff();
  const auto [band_lo, band_hi] = QuinticBand(lo);
  EXPECT_GE(got.front(), band_lo - 1e-9);
  EXPECT_LE(got.back(), band_hi + 1e-9);
  if (lo >= 0.01) {
    EXPECT_GE(got.front(), 0.68);
    EXPECT_LE(got.back(), 1.135);
  }

  // Singular vectors: in the input's SVD basis (Eigen, independent of how A was built) the
  // output is diagonal, i.e. O = U_A·diag(σ')·V_Aᵀ, and it is within the band of U_A·V_Aᵀ.
  Eigen::JacobiSVD<MatD> in_svd(a, Eigen::ComputeThinU | Eigen::ComputeThinV);
  const MatD ua = in_svd.matrixU(), va = in_svd.matrixV();
  MatD d = ua.transpose() * o * va;
  Eigen::VectorXd diag = d.diagonal();
  d.diagonal().setZero();
  EXPECT_LT(d.cwiseAbs().maxCoeff(), 1e-9);
  for (int i = 0; i < k; ++i)
    EXPECT_NEAR(diag[i], Quintic5(in_svd.singularValues()[i] / norm), 1e-9);
  const MatD polar = ua * va.transpose();
  const double spread = std::max(std::abs(band_lo - 1), std::abs(band_hi - 1));
  Eigen::JacobiSVD<MatD> diff_svd(o - polar);
  EXPECT_LE(diff_svd.singularValues()[0], spread + 1e-9);
}

INSTANTIATE_TEST_SUITE_P(ShapesAndConditions, NsPolarTest,
                         ::testing::Values(PolarCase{32, 32, 1}, PolarCase{32, 32, 10},
                                           PolarCase{32, 32, 100}, PolarCase{16, 64, 1},
                                           PolarCase{16, 64, 10}, PolarCase{16, 64, 100},
                                           PolarCase{64, 16, 1}, PolarCase{64, 16, 10},
                                           PolarCase{64, 16, 100}, PolarCase{24, 40, 1000}),
                         [](const auto& info) {
                           return std::to_string(info.param.rows) + "x" +
                                  std::to_string(info.param.cols) + "_cond" +
                                  std::to_string(static_cast<int>(info.param.cond));
                         });

TEST(NewtonSchulz, FloatAgreesWithDouble) {
  std::mt19937_64 rng(7);
  for (auto [r, c] : {std::pair{48, 80}, std::pair{80, 48}, std::pair{64, 64}}) {
    const MatD a = GaussianD(r, c, rng);
    const MatD od = RunNs(a);
    const MatF af = a.cast<float>();
    MatF of(r, c);
    NewtonSchulz<float>(af.data(), of.data(), 1, r, c);
    EXPECT_LT((of.cast<double>() - od).cwiseAbs().maxCoeff(), 5e-5) << r << "x" << c;
  }
}

// RMS(0.2·√max(n,m)·O) = 0.2·√(Σσ'²/min(n,m)) lies in 0.2·[0.68, 1.135] ≈ [0.136, 0.227]
// whatever the shape; for Gaussian gradients nearly all σ' sit near 1, so ≈ 0.2.
TEST(NewtonSchulz, RmsMatchedUpdateIsAboutPointTwo) {
  std::mt19937_64 rng(11);
  std::normal_distribution<float> nd;
  for (auto [r, c] : {std::pair{64, 64}, std::pair{32, 128}, std::pair{128, 32},
                      std::pair{384, 384}, std::pair{384, 1536}, std::pair{1536, 384}}) {
    std::vector<float> g(static_cast<size_t>(r) * c), o(g.size());
    for (float& x : g) x = nd(rng) * 1e-3f;
    NewtonSchulz<float>(g.data(), o.data(), 1, r, c);
    double ss = 0;
    for (float x : o) ss += static_cast<double>(x) * x;
    const double rms = 0.2 * std::sqrt(static_cast<double>(std::max(r, c))) *
                       std::sqrt(ss / static_cast<double>(o.size()));
    EXPECT_GT(rms, 0.14) << r << "x" << c;
    EXPECT_LT(rms, 0.23) << r << "x" << c;
  }
}

TEST(NewtonSchulz, KernelsThreadingAndBatchingAgree) {
  std::mt19937_64 rng(3);
  std::normal_distribution<float> nd;
  for (auto [r, c] : {std::pair{40, 24}, std::pair{24, 40}}) {
    const int batch = 5;
    const size_t e = static_cast<size_t>(r) * c;
    std::vector<float> g(batch * e);
    for (float& x : g) x = nd(rng);
    // Reference: each matrix alone, full-GEMM kernel, BLAS threading.
    std::vector<float> ref(g.size());
    for (int b = 0; b < batch; ++b) {
      NewtonSchulz<float>(g.data() + b * e, ref.data() + b * e, 1, r, c,
                          {5, NsKernel::kGemm, NsThreading::kBlas});
    }
    for (NsKernel k :
         {NsKernel::kSyrkSymm, NsKernel::kSyrkFillGemm, NsKernel::kGemm, NsKernel::kGram}) {
      for (NsThreading t : {NsThreading::kAuto, NsThreading::kBatch, NsThreading::kBlas}) {
        std::vector<float> out = g;  // in place
        NewtonSchulzWorkspace<float> ws;
        NewtonSchulz<float>(out.data(), out.data(), batch, r, c, {5, k, t}, &ws);
        double worst = 0;
        for (size_t i = 0; i < out.size(); ++i)
          worst = std::max(worst, double(std::abs(out[i] - ref[i])));
        EXPECT_LT(worst, 2e-5) << r << "x" << c << " kernel " << int(k) << " threading " << int(t);
      }
    }
  }
}

// The experimental Gram-only iteration equals the plain one in exact arithmetic; in float its
// rounding grows with ‖Q‖, measured here against the double plain iteration on well- and
// ill-conditioned rectangular inputs (stable ranks like real momentum matrices).
TEST(NewtonSchulz, GramKernelMatchesPlainIteration) {
  std::mt19937_64 rng(23);
  for (auto [r, c] : {std::pair{32, 128}, std::pair{128, 32}, std::pair{48, 96}}) {
    for (double cond : {1.0, 1e2, 1e4, 1e7}) {
      const int k = std::min(r, c);
      Eigen::VectorXd sigma(k);
      for (int i = 0; i < k; ++i) sigma[i] = std::pow(cond, -static_cast<double>(i) / (k - 1));
      const MatD a = RandomOrthonormalColumns(r, k, rng) * sigma.asDiagonal() *
                     RandomOrthonormalColumns(c, k, rng).transpose();
      const MatD plain = RunNs(a);
      const MatD gram_d = RunNs(a, {5, NsKernel::kGram, NsThreading::kAuto});
      EXPECT_LT((gram_d - plain).cwiseAbs().maxCoeff(), 1e-9) << r << "x" << c << " cond " << cond;
      const MatF af = a.cast<float>();
      MatF gf(r, c), pf(r, c);
      NewtonSchulz<float>(af.data(), gf.data(), 1, r, c, {5, NsKernel::kGram, NsThreading::kAuto});
      NewtonSchulz<float>(af.data(), pf.data(), 1, r, c);
      const double err_gram = (gf.cast<double>() - plain).cwiseAbs().maxCoeff();
      const double err_plain = (pf.cast<double>() - plain).cwiseAbs().maxCoeff();
      std::printf("gram %dx%d cond %.0e: max |float - double| gram %.2e, plain %.2e\n", r, c, cond,
                  err_gram, err_plain);
      EXPECT_LT(err_gram, 1e-3) << r << "x" << c << " cond " << cond;
    }
  }
}

TEST(NewtonSchulz, SteadyStateDoesNotGrowWorkspaceAndZeroStaysZero) {
  NewtonSchulzWorkspace<float> ws;
  std::vector<float> g(6 * 32 * 48, 0.0f), o(g.size(), 1.0f);
  NewtonSchulz<float>(g.data(), o.data(), 6, 32, 48, {}, &ws);
  const size_t bytes = ws.bytes();
  EXPECT_GT(bytes, 0u);
  for (float x : o) ASSERT_EQ(x, 0.0f);
  for (int i = 0; i < 3; ++i) NewtonSchulz<float>(g.data(), o.data(), 6, 32, 48, {}, &ws);
  EXPECT_EQ(ws.bytes(), bytes);
  // A smaller shape reuses the same buffer.
  NewtonSchulz<float>(g.data(), o.data(), 2, 16, 16, {}, &ws);
  EXPECT_EQ(ws.bytes(), bytes);
}

TEST(NewtonSchulz, FlopCounts) {
  // 384×1536 (m = 384, n = 1536), one step: full GEMMs 4m²n + 2m³, SYRK/SYMM m²n + m³ + 2m²n.
  const double m = 384, n = 1536;
  EXPECT_DOUBLE_EQ(NewtonSchulzGemmFlops(1536, 384, 1), 4 * m * m * n + 2 * m * m * m);
  EXPECT_DOUBLE_EQ(NewtonSchulzSyrkFlops(384, 1536, 5), 5 * (3 * m * m * n + m * m * m));
  EXPECT_DOUBLE_EQ(NewtonSchulzGramFlops(384, 1536, 5), 3 * m * m * n + 25 * m * m * m);
}

}  // namespace
}  // namespace moelab::cpu
