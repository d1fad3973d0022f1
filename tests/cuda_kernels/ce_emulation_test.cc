// The cross-entropy kernels' own source (kernels/cuda/cross_entropy_kernels.cuh), fp32 and bf16
// logits, run on the CPU under tests/cuda_kernels/emulation/cuda_emulation.h with the launch
// shapes of kernels/cuda/elementwise.cu, against the CPU twin (kernels/cpu/cross_entropy.h) and
// against each other. Runs on every machine; nvcc's expf and the hardware only the GPU twins
// (ops_test.cc, lm_head_test.cc) can check.
// clang-format off
// The emulation first: it replaces the CUDA primitives the kernel header uses.
#include "tests/cuda_kernels/emulation/cuda_emulation.h"
#include "kernels/cuda/cross_entropy_kernels.cuh"
// clang-format on

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/cpu/cross_entropy.h"
#include "tests/cuda_kernels/emulation_test_util.h"

namespace moelab::cuda {
namespace {

using bf16 = __nv_bfloat16;
constexpr double kU = 1.0 / 256;  // bf16's unit roundoff, 2^-8 (8 significant bits)

struct Case {
  int n, vocab;
  double z, weight;
  float scale;  // logits uniform in [-scale, scale]
};

struct Result {
  double loss = 0, z_loss = 0;
  std::vector<double> rows;  // ce per row, then lse per row
  std::vector<float> grad;   // the row values after the kernel, widened to float
};

// The launches of CrossEntropyAsync: one block of kCeThreads per row, then (reduce) one of 1024
// threads for the means; without it the means are summed here in row order (1024 emulated
// threads cost seconds).
template <typename TL>
Result RunKernel(std::vector<TL> logits, const std::vector<int32_t>& targets, const Case& c,
                 bool backward, bool reduce = false) {
  std::vector<double> rows(2 * c.n + 2, std::nan(""));
  emu::Launch(dim3(c.n), ce::kCeThreads, 0, [&] {
    ce::CrossEntropyRowKernel<TL>(logits.data(), targets.data(), c.vocab, c.z, backward,
                                  1.0f / static_cast<float>(c.n), static_cast<float>(c.weight),
                                  rows.data(), rows.data() + c.n);
  });
  Result r;
  if (reduce) {
    double* result = rows.data() + 2 * c.n;
    emu::Launch(dim3(1), 1024, 0, [&] {
      ce::CrossEntropyReduceKernel(rows.data(), rows.data() + c.n, c.n, c.z, result);
    });
    r.loss = result[0], r.z_loss = result[1];
  } else {
    for (int i = 0; i < c.n; ++i) r.loss += rows[i], r.z_loss += rows[c.n + i] * rows[c.n + i];
    r.loss /= c.n, r.z_loss = c.z * r.z_loss / c.n;
  }
  r.rows.assign(rows.begin(), rows.begin() + 2 * c.n);
  for (const TL& v : logits) r.grad.push_back(static_cast<float>(v));
  return r;
}

// The CPU twin, then the gradient scaled as the model's Scale op does.
template <typename T>
Result RunCpu(const std::vector<float>& logits, const std::vector<int32_t>& targets,
              const Case& c) {
  std::vector<T> x(logits.begin(), logits.end());
  std::vector<double> rows(2 * c.n);
  const cpu::CrossEntropyResult r =
      cpu::CrossEntropy<T>(x.data(), targets.data(), c.n, c.vocab, c.z, true, rows.data());
  Result out{r.loss, r.z_loss, {}};
  for (T v : x) out.grad.push_back(static_cast<float>(v * static_cast<T>(c.weight)));
  return out;
}

struct Inputs {
  std::vector<float> logits;
  std::vector<int32_t> targets;
};

Inputs Make(const Case& c, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-c.scale, c.scale);
  std::uniform_int_distribution<int> t(0, c.vocab - 1);
  Inputs in;
  in.logits.resize(static_cast<size_t>(c.n) * c.vocab);
  for (float& v : in.logits) v = u(rng);
  for (int i = 0; i < c.n; ++i) in.targets.push_back(t(rng));
  // Row 0's target is its largest logit (the gradient's one negative entry near −inv_n).
  if (c.n > 0) {
    in.logits[in.targets[0]] = c.scale + 1;
  }
  return in;
}

using emulation_test::ToBf16;

const Case kCases[] = {
    {3, 1000, 0.0, 1.0, 8.0f},    // vocab not a multiple of the block
    {2, 37, 1e-4, 1.0, 4.0f},     // most threads hold no logit
    {2, 3000, 1e-3, 0.25, 12.0f}  // z-loss, a chunk's weight, wide logits
};

// fp32 logits against the CPU twin. Not bit for bit: both sum the exponentials in float in
// different orders (the block's strided partials and tree vs the CPU's SIMD lanes) and the CPU's
// Exp is a polynomial of ≈1 ulp; the sums (≥ 1, every term ≤ 1) agree to a few ε·log V, so the
// losses (log of the sum, in double) to ~1e-6 absolute and each gradient to ~1e-6 relative
// (ε·16 ≈ 2e-6 with margin for the exponentials).
TEST(CrossEntropyEmulation, Fp32MatchesCpuTwin) {
  for (const Case& c : kCases) {
    SCOPED_TRACE(::testing::Message() << "n " << c.n << " vocab " << c.vocab << " z " << c.z);
    const Inputs in = Make(c, 7);
    const Result got = RunKernel<float>(in.logits, in.targets, c, true, /*reduce=*/true);
    const Result want = RunCpu<float>(in.logits, in.targets, c);
    EXPECT_NEAR(got.loss, want.loss, 2e-6 * std::max(1.0, want.loss));
    EXPECT_NEAR(got.z_loss, want.z_loss, 2e-6 * std::max(1e-12, want.z_loss));
    int bad = 0;
    for (size_t j = 0; j < got.grad.size() && bad < 5; ++j) {
      const double tol = 4e-6 * std::fabs(want.grad[j]) + 1e-12;
      if (!(std::fabs(static_cast<double>(got.grad[j]) - want.grad[j]) <= tol)) {
        ADD_FAILURE() << "grad[" << j << "]: got " << got.grad[j] << ", want " << want.grad[j];
        ++bad;
      }
    }
    // Without backward the logits stay as they were and the loss is the same.
    const Result fwd = RunKernel<float>(in.logits, in.targets, c, false);
    EXPECT_EQ(fwd.rows, got.rows);
    EXPECT_TRUE(std::memcmp(fwd.grad.data(), in.logits.data(), 4 * in.logits.size()) == 0);
  }
}

// Bit-level where the order allows: on bf16-representable logits the bf16 kernel does the fp32
// kernel's float arithmetic on the same values in the same order, so each row's loss terms agree
// bit for bit and each bf16 gradient is the fp32 kernel's gradient rounded once (the gradient is
// formed in fp32, never stored in bf16 and read back).
TEST(CrossEntropyEmulation, Bf16IsFp32RoundedOnce) {
  for (const Case& c : kCases) {
    SCOPED_TRACE(::testing::Message() << "n " << c.n << " vocab " << c.vocab << " z " << c.z);
    const Inputs in = Make(c, 11);
    const std::vector<bf16> xb = ToBf16(in.logits);
    std::vector<float> widened;
    for (bf16 v : xb) widened.push_back(__bfloat162float(v));
    const Result got = RunKernel<bf16>(xb, in.targets, c, true);
    const Result f32 = RunKernel<float>(widened, in.targets, c, true);
    EXPECT_EQ(got.rows, f32.rows);
    int bad = 0;
    for (size_t j = 0; j < got.grad.size() && bad < 5; ++j) {
      const float want = __bfloat162float(__float2bfloat16(f32.grad[j]));
      if (std::memcmp(&got.grad[j], &want, 4) != 0) {
        ADD_FAILURE() << "grad[" << j << "]: got " << got.grad[j] << ", want " << want;
        ++bad;
      }
    }
  }
}

// bf16 logits (the GEMM's bf16 output) against the CPU twin on the unrounded fp32 logits: the
// error the bf16 mode adds. Rounding moves each logit by δ_j ≤ u·|x_j| ≤ u·X (X = the row's
// max |x|, u = 2^-8), so per row |Δlse| ≤ u·X and |Δce| ≤ u·(X + |x_t|); the z term moves by
// z·(2·|lse|·u·X + (u·X)²). Each softmax value moves by a factor within exp(±2·u·X), and the
// gradient is rounded once more to bf16 (u relative). Bounds per row, with 1e-5 of slack for the
// float sums.
TEST(CrossEntropyEmulation, Bf16WithinRoundingBoundOfCpu) {
  for (const Case& c : kCases) {
    SCOPED_TRACE(::testing::Message() << "n " << c.n << " vocab " << c.vocab << " z " << c.z);
    const Inputs in = Make(c, 13);
    const Result got = RunKernel<bf16>(ToBf16(in.logits), in.targets, c, true);
    const Result want = RunCpu<double>(in.logits, in.targets, c);
    double ce_bound = 0, z_bound = 0;
    std::vector<double> xmax(c.n, 0);
    for (int i = 0; i < c.n; ++i) {
      const float* row = in.logits.data() + static_cast<size_t>(i) * c.vocab;
      double m = 0, lse = 0;
      for (int j = 0; j < c.vocab; ++j) m = std::max(m, std::fabs(static_cast<double>(row[j])));
      for (int j = 0; j < c.vocab; ++j) lse += std::exp(row[j] - m);
      lse = m + std::log(lse);
      xmax[i] = m;
      ce_bound += kU * (m + std::fabs(row[in.targets[i]]));
      z_bound += 2 * std::fabs(lse) * kU * m + kU * kU * m * m;
    }
    ce_bound /= c.n;
    z_bound = c.z * z_bound / c.n;
    EXPECT_NEAR(got.loss, want.loss, ce_bound + 1e-5);
    EXPECT_NEAR(got.z_loss, want.z_loss, z_bound + 1e-5 * want.z_loss + 1e-12);
    // And not vacuously: the bound is a few per mille of the loss here.
    EXPECT_LT(ce_bound, 0.05 * want.loss);
    const double step = c.weight / c.n;  // the target's −inv_n·weight
    int bad = 0;
    for (int i = 0; i < c.n; ++i) {
      // The coefficient's (1 + 2·z·lse) moves by at most 2·z·u·X.
      const double spread = std::expm1(2 * kU * xmax[i]) + 2 * c.z * kU * xmax[i];
      for (int j = 0; j < c.vocab && bad < 5; ++j) {
        const size_t k = static_cast<size_t>(i) * c.vocab + j;
        const double soft = want.grad[k] + (j == in.targets[i] ? step : 0.0);  // p_j·coef
        const double tol = spread * std::fabs(soft) + 1.01 * kU * std::fabs(want.grad[k]) +
                           1e-5 * std::fabs(soft) + 1e-12;
        if (!(std::fabs(static_cast<double>(got.grad[k]) - want.grad[k]) <= tol)) {
          ADD_FAILURE() << "grad[" << i << "," << j << "]: got " << got.grad[k] << ", want "
                        << want.grad[k] << " (tol " << tol << ")";
          ++bad;
        }
      }
    }
  }
}

}  // namespace
}  // namespace moelab::cuda
