// Module-by-module gradient checks of the CPU kernels the model is built from: each backward is
// compared with central finite differences of L = Σ w ⊙ y (w fixed random), in double.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/cross_entropy.h"
#include "kernels/cpu/embedding.h"
#include "kernels/cpu/norm.h"
#include "kernels/cpu/rope.h"
#include "kernels/cpu/swiglu.h"
#include "kernels/cpu/vecmath.h"
#include "tests/core_model/gradcheck.h"

namespace moelab {
namespace {

using testing::MaxGradErr;
using testing::RandomVector;

constexpr double kTol = 1e-6;
// Finite-difference step: these objectives Σ w·y are O(10–100), so rounding noise
// (≈ 1e-16·|f|/h) needs a larger step than the model checks; the 4-point stencil's O(h⁴)
// truncation error is still negligible at 1e-3.
constexpr double kH = 1e-3;

double Dot(const std::vector<double>& a, const std::vector<double>& b) {
  return std::inner_product(a.begin(), a.end(), b.begin(), 0.0);
}

TEST(KernelGrad, RmsNorm) {
  const int n = 5, d = 12;
  auto x = RandomVector(n * d, 1), g = RandomVector(d, 2), w = RandomVector(n * d, 3);
  std::vector<double> y(n * d), rstd(n), dx(n * d, 0.5), dg(d);
  auto f = [&] {
    cpu::RmsNormForward(x.data(), g.data(), n, d, 1e-5, y.data(), rstd.data());
    return Dot(y, w);
  };
  f();
  // accumulate_dx adds onto what is there: start from 0.5 and subtract it back.
  cpu::RmsNormBackward(x.data(), g.data(), rstd.data(), w.data(), n, d, dx.data(), dg.data(), true);
  for (double& v : dx) v -= 0.5;
  EXPECT_LT(MaxGradErr(f, x.data(), dx.data(), x.size(), x.size(), 0, kH), kTol);
  EXPECT_LT(MaxGradErr(f, g.data(), dg.data(), g.size(), g.size(), 0, kH), kTol);
}

TEST(KernelGrad, RmsNormGroupsStridedInPlace) {
  // Two groups of 6 per row inside rows of stride 15 (as q|k heads sit inside the QKV buffer).
  const int n = 4, groups = 2, d = 6, ld = 15;
  auto x = RandomVector(n * ld, 21), g = RandomVector(d, 22), w = RandomVector(n * ld, 23);
  std::vector<double> y(n * ld, 0), rstd(n * groups), dg(d);
  auto f = [&] {
    cpu::RmsNormGroupsForward(x.data(), ld, y.data(), ld, n, groups, d, g.data(), 1e-5,
                              rstd.data());
    double s = 0;
    for (int r = 0; r < n; ++r)
      for (int j = 0; j < groups * d; ++j) s += y[r * ld + j] * w[r * ld + j];
    return s;
  };
  f();
  std::vector<double> dx = w;  // in place: dy in, dx out
  cpu::RmsNormGroupsBackward(x.data(), ld, g.data(), rstd.data(), dx.data(), ld, dx.data(), ld, n,
                             groups, d, dg.data());
  for (int r = 0; r < n; ++r)
    for (int j = groups * d; j < ld; ++j) dx[r * ld + j] = 0;  // untouched columns: no gradient
  EXPECT_LT(MaxGradErr(f, x.data(), dx.data(), x.size(), x.size(), 0, kH), kTol);
  EXPECT_LT(MaxGradErr(f, g.data(), dg.data(), g.size(), g.size(), 0, kH), kTol);
}

TEST(KernelGrad, RopeIsARotationAndItsInverseIsTheBackward) {
  const int seq = 6, n = 12, heads = 3, hd = 8, ld = heads * hd + 5;  // padded rows
  std::vector<double> cs(seq * hd / 2), sn(seq * hd / 2);
  cpu::RopeTables(seq, hd, 10000.0, cs.data(), sn.data());
  auto x = RandomVector(n * ld, 4), w = RandomVector(n * ld, 5);
  auto f = [&] {
    std::vector<double> y = x;
    cpu::RopeApply(y.data(), n, seq, ld, heads, hd, 0, hd, cs.data(), sn.data(), false);
    return Dot(y, w);
  };
  std::vector<double> dx = w;
  cpu::RopeApply(dx.data(), n, seq, ld, heads, hd, 0, hd, cs.data(), sn.data(), true);
  EXPECT_LT(MaxGradErr(f, x.data(), dx.data(), x.size(), x.size(), 0, kH), kTol);
  // Position 0 is the identity; the padding columns are untouched.
  std::vector<double> y = x;
  cpu::RopeApply(y.data(), n, seq, ld, heads, hd, 0, hd, cs.data(), sn.data(), false);
  for (int j = 0; j < heads * hd; ++j) EXPECT_DOUBLE_EQ(y[j], x[j]);
  for (int r = 0; r < n; ++r)
    for (int j = heads * hd; j < ld; ++j) EXPECT_EQ(y[r * ld + j], x[r * ld + j]);
  // Rotate-half pairs (i, i + hd/2): the angle of pair 0 at position p is p radians.
  const double a = x[1 * ld + 0], b = x[1 * ld + hd / 2];
  EXPECT_NEAR(y[1 * ld + 0], a * std::cos(1.0) - b * std::sin(1.0), 1e-14);
  EXPECT_NEAR(y[1 * ld + hd / 2], b * std::cos(1.0) + a * std::sin(1.0), 1e-14);
}

struct AttnCase {
  int batch, seq, heads, kv_heads, dim;
  double softcap;
};

class AttentionGrad : public ::testing::TestWithParam<AttnCase> {};

TEST_P(AttentionGrad, MatchesFiniteDifferencesAndBruteForce) {
  const AttnCase c = GetParam();
  cpu::AttentionDims a;
  a.batch = c.batch;
  a.seq = c.seq;
  a.heads = c.heads;
  a.kv_heads = c.kv_heads;
  a.qk_dim = a.v_dim = c.dim;
  a.ldq = c.heads * c.dim + 3;  // strided views, as in the fused QKV buffer
  a.ldk = a.ldv = c.kv_heads * c.dim + 1;
  a.ldo = c.heads * c.dim;
  a.scale = 1.0 / std::sqrt(c.dim);
  a.softcap = c.softcap;
  const int n = c.batch * c.seq;
  auto q = RandomVector(n * a.ldq, 6, 1.5), k = RandomVector(n * a.ldk, 7, 1.5),
       v = RandomVector(n * a.ldv, 8), w = RandomVector(n * a.ldo, 9);
  const size_t att = static_cast<size_t>(c.batch) * c.heads * c.seq * c.seq;
  std::vector<double> probs(att), capped(att), out(n * a.ldo), pmax(c.batch * c.heads);
  auto f = [&] {
    cpu::AttentionForward(a, q.data(), k.data(), v.data(), probs.data(), capped.data(), out.data(),
                          pmax.data());
    return Dot(out, w);
  };
  f();
  // Brute force: causal softmax attention, one (b, h, i) at a time.
  const int group = c.heads / c.kv_heads;
  for (int b = 0; b < c.batch; ++b) {
    for (int h = 0; h < c.heads; ++h) {
      const int g = h / group;
      double smax = -1e300;
      for (int i = 0; i < c.seq; ++i) {
        std::vector<double> s(i + 1);
        for (int j = 0; j <= i; ++j) {
          double dot = 0;
          for (int t = 0; t < c.dim; ++t)
            dot += q[(b * c.seq + i) * a.ldq + h * c.dim + t] *
                   k[(b * c.seq + j) * a.ldk + g * c.dim + t];
          s[j] = dot * a.scale;
          smax = std::max(smax, s[j]);
          if (c.softcap > 0) s[j] = c.softcap * std::tanh(s[j] / c.softcap);
        }
        const double mx = *std::max_element(s.begin(), s.end());
        double z = 0;
        for (double& x : s) z += (x = std::exp(x - mx));
        for (int t = 0; t < c.dim; ++t) {
          double o = 0;
          for (int j = 0; j <= i; ++j) o += s[j] / z * v[(b * c.seq + j) * a.ldv + g * c.dim + t];
          EXPECT_NEAR(out[(b * c.seq + i) * a.ldo + h * c.dim + t], o, 1e-12);
        }
      }
      EXPECT_NEAR(pmax[b * c.heads + h], smax, 1e-12);
    }
  }
  std::vector<double> dq(q.size(), 0), dk(k.size(), 0), dv(v.size(), 0);
  std::vector<double> scratch(cpu::AttentionScratchSize(a, omp_get_max_threads()));
  cpu::AttentionBackward(a, q.data(), k.data(), v.data(), probs.data(), capped.data(), w.data(),
                         dq.data(), dk.data(), dv.data(), scratch.data());
  EXPECT_LT(MaxGradErr(f, q.data(), dq.data(), q.size(), 400, 1, kH), kTol);
  EXPECT_LT(MaxGradErr(f, k.data(), dk.data(), k.size(), 400, 2, kH), kTol);
  EXPECT_LT(MaxGradErr(f, v.data(), dv.data(), v.size(), 400, 3, kH), kTol);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, AttentionGrad,
    ::testing::Values(AttnCase{2, 7, 2, 2, 4, 0},       // MHA, seq shorter than a tile
                      AttnCase{2, 40, 4, 2, 4, 0},      // GQA, two causal tiles, ragged
                      AttnCase{1, 9, 4, 1, 6, 0},       // MQA
                      AttnCase{2, 37, 2, 1, 4, 1.5}));  // soft-cap, ragged tiles

TEST(KernelGrad, CrossEntropyWithZLoss) {
  const int n = 6, vocab = 11;
  auto x = RandomVector(n * vocab, 10, 2.0);
  std::vector<int32_t> t = {0, 3, 10, 5, 5, 7};
  std::vector<double> scratch(2 * n);
  for (double z : {0.0, 1e-2}) {
    auto f = [&] {
      std::vector<double> y = x;
      auto r = cpu::CrossEntropy(y.data(), t.data(), n, vocab, z, false, scratch.data());
      return r.loss + r.z_loss;
    };
    std::vector<double> g = x;
    auto r = cpu::CrossEntropy(g.data(), t.data(), n, vocab, z, true, scratch.data());
    EXPECT_NEAR(r.loss + r.z_loss, f(), 1e-14);
    // Brute-force loss.
    double ce = 0, zz = 0;
    for (int i = 0; i < n; ++i) {
      double s = 0;
      for (int j = 0; j < vocab; ++j) s += std::exp(x[i * vocab + j]);
      ce += std::log(s) - x[i * vocab + t[i]];
      zz += std::log(s) * std::log(s);
    }
    EXPECT_NEAR(r.loss, ce / n, 1e-12);
    EXPECT_NEAR(r.z_loss, z * zz / n, 1e-12);
    EXPECT_LT(MaxGradErr(f, x.data(), g.data(), x.size(), x.size(), 0, kH), kTol);
  }
}

TEST(KernelGrad, EmbeddingScatterAddsRepeatedTokens) {
  const int n = 7, d = 5, vocab = 4;
  auto table = RandomVector(vocab * d, 11), w = RandomVector(n * d, 12);
  std::vector<int32_t> tok = {1, 3, 1, 0, 1, 3, 2};
  std::vector<double> out(n * d), dt(vocab * d, 0);
  auto f = [&] {
    cpu::EmbeddingForward(table.data(), tok.data(), n, d, out.data());
    return Dot(out, w);
  };
  cpu::EmbeddingBackward(tok.data(), w.data(), n, d, dt.data());
  EXPECT_LT(MaxGradErr(f, table.data(), dt.data(), table.size(), table.size(), 0, kH), kTol);
}

TEST(KernelGrad, Swiglu) {
  const int n = 6, d = 8, hidden = 10;
  auto x = RandomVector(n * d, 13), w1 = RandomVector(hidden * d, 14),
       w3 = RandomVector(hidden * d, 15), w2 = RandomVector(d * hidden, 16),
       w = RandomVector(n * d, 17);
  std::vector<double> h1(n * hidden), h3(n * hidden), act(n * hidden), y(n * d);
  auto f = [&] {
    cpu::SwigluForward(x.data(), n, d, hidden, w1.data(), w3.data(), w2.data(), h1.data(),
                       h3.data(), act.data(), y.data());
    return Dot(y, w);
  };
  f();
  std::vector<double> dx(x.size()), dw1(w1.size()), dw3(w3.size()), dw2(w2.size()),
      scratch(2 * n * hidden);
  cpu::SwigluBackward(x.data(), n, d, hidden, w1.data(), w3.data(), w2.data(), h1.data(), h3.data(),
                      act.data(), w.data(), dx.data(), dw1.data(), dw3.data(), dw2.data(),
                      scratch.data());
  EXPECT_LT(MaxGradErr(f, x.data(), dx.data(), x.size(), x.size(), 0, kH), kTol);
  EXPECT_LT(MaxGradErr(f, w1.data(), dw1.data(), w1.size(), w1.size(), 0, kH), kTol);
  EXPECT_LT(MaxGradErr(f, w3.data(), dw3.data(), w3.size(), w3.size(), 0, kH), kTol);
  EXPECT_LT(MaxGradErr(f, w2.data(), dw2.data(), w2.size(), w2.size(), 0, kH), kTol);
}

TEST(VecMath, FastExpIsAccurate) {
  double worst = 0;
  for (double x = -80; x < 80; x += 0.0137) {
    const float e = cpu::ExpFloat(static_cast<float>(x));
    const double ref = std::exp(static_cast<double>(static_cast<float>(x)));
    worst = std::max(worst, std::abs(e - ref) / ref);
  }
  EXPECT_LT(worst, 3e-7);
  EXPECT_LT(cpu::ExpFloat(-1000.0f), 1e-37f);
  // −inf is the masked attention logit: it must come out as (numerically) zero, not NaN.
  EXPECT_LT(cpu::ExpFloat(-std::numeric_limits<float>::infinity()), 1e-37f);
  EXPECT_GT(cpu::ExpFloat(1000.0f), 1e38f);
  EXPECT_TRUE(std::isnan(cpu::ExpFloat(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_EQ(cpu::ExpFloat(0.0f), 1.0f);
  // The same values through a vectorised loop (the way the kernels call it).
  std::vector<float> xs(1000), ys(1000);
  for (int i = 0; i < 1000; ++i) xs[i] = -80.0f + 0.16f * i;
#pragma omp simd
  for (int i = 0; i < 1000; ++i) ys[i] = cpu::Exp<float>(xs[i]);
  for (int i = 0; i < 1000; ++i) EXPECT_EQ(ys[i], cpu::ExpFloat(xs[i]));
}

}  // namespace
}  // namespace moelab
