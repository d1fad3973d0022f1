// The reference side of the fused-attention tests (flash_attention_test.cc on a GPU,
// flash_emulation_test.cc on the CPU emulation): bf16-representable random inputs in one host
// buffer, kernels/cpu/attention in double on them, the log-sum-exp in double, and the comparison
// of a candidate's results with the stated tolerances.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "kernels/cpu/attention.h"
#include "kernels/cuda/attention.h"
#include "tests/cuda_kernels/cuda_test_util.h"

namespace moelab::cuda::testing {

struct FlashCase {
  std::string name;
  int batch, seq, heads, kv_heads, qk_dim, v_dim;
  double softcap;
  bool fused;  // q, k, v as column slices of one buffer (and dq, dk, dv of one gradient)
};

inline float RoundBf16(float x) { return __bfloat162float(__float2bfloat16(x)); }

struct FlashReference {
  explicit FlashReference(const FlashCase& c) {
    a.batch = c.batch, a.seq = c.seq, a.heads = c.heads, a.kv_heads = c.kv_heads;
    a.qk_dim = c.qk_dim, a.v_dim = c.v_dim;
    a.scale = 1.0 / std::sqrt(double(c.qk_dim));
    a.softcap = c.softcap;
    fused = c.fused;
    qw = c.heads * c.qk_dim, kw = c.kv_heads * c.qk_dim, vw = c.kv_heads * c.v_dim;
    a.ldq = a.ldk = a.ldv = c.fused ? qw + kw + vw : 0;
    if (!c.fused) a.ldq = qw, a.ldk = kw, a.ldv = vw;
    a.ldo = c.heads * c.v_dim;
    rows = long(c.batch) * c.seq;
    // Separate layout: [rows·qw | rows·kw | rows·vw]; fused: [rows, qw + kw + vw].
    q_off = 0, k_off = c.fused ? qw : rows * qw, v_off = c.fused ? qw + kw : rows * (qw + kw);
    total = size_t(rows) * (qw + kw + vw);
    // Logits of a few units (S_max well above the typical logit; a soft-cap bites), values
    // exactly representable in bf16 so that the CPU sees what the GPU sees.
    x = Random(total, 7 + c.seq, -2.0f, 2.0f);
    for (float& v : x) v = RoundBf16(v);
    dout = Random(size_t(rows) * a.ldo, 11 + c.seq);
    for (float& v : dout) v = RoundBf16(v);
    const std::vector<double> xd(x.begin(), x.end()), doutd(dout.begin(), dout.end());

    const size_t pairs = size_t(c.batch) * c.heads, ss = size_t(c.seq) * c.seq;
    std::vector<double> probs(pairs * ss), capped(pairs * ss);
    out.resize(size_t(rows) * a.ldo), pmax.resize(pairs), dx.assign(total, 0.0);
    cpu::AttentionForward<double>(a, xd.data() + q_off, xd.data() + k_off, xd.data() + v_off,
                                  probs.data(), capped.data(), out.data(), pmax.data());
    std::vector<double> scratch(cpu::AttentionScratchSize(a, 256));
    cpu::AttentionBackward<double>(a, xd.data() + q_off, xd.data() + k_off, xd.data() + v_off,
                                   probs.data(), capped.data(), doutd.data(), dx.data() + q_off,
                                   dx.data() + k_off, dx.data() + v_off, scratch.data());
    // log Σ_{j ≤ i} exp(s'_ij) per (b, h, i): what the fused forward keeps.
    const int S = c.seq, group = c.heads / c.kv_heads;
    lse.resize(pairs * S);
    std::vector<double> s(S);
    for (int b = 0; b < c.batch; ++b) {
      for (int h = 0; h < c.heads; ++h) {
        for (int i = 0; i < S; ++i) {
          double m = -INFINITY;
          for (int j = 0; j <= i; ++j) {
            double dot = 0;
            for (int e = 0; e < c.qk_dim; ++e) {
              dot += xd[q_off + (long(b) * S + i) * a.ldq + h * c.qk_dim + e] *
                     xd[k_off + (long(b) * S + j) * a.ldk + (h / group) * c.qk_dim + e];
            }
            s[j] = dot * a.scale;
            if (a.softcap > 0) s[j] = a.softcap * std::tanh(s[j] / a.softcap);
            m = std::max(m, s[j]);
          }
          double sum = 0;
          for (int j = 0; j <= i; ++j) sum += std::exp(s[j] - m);
          lse[(size_t(b) * c.heads + h) * S + i] = m + std::log(sum);
        }
      }
    }
  }

  // The gradient columns of q (k, v) out of a buffer in the input layout.
  template <typename V>
  V Slice(const V& all, long off, int width) const {
    V s;
    for (long r = 0; r < rows; ++r) {
      const long at = fused ? r * a.ldq + off : off + r * width;
      s.insert(s.end(), all.begin() + at, all.begin() + at + width);
    }
    return s;
  }

  // A candidate's out, lse, pair max and dx (dq, dk, dv in the input layout), all as floats.
  void Expect(const std::vector<float>& got_out, const std::vector<float>& got_lse,
              const std::vector<float>& got_pmax, const std::vector<float>& got_dx) const {
    ExpectForward(got_out, got_lse, got_pmax);
    ExpectGrads(got_dx);
  }
  void ExpectForward(const std::vector<float>& got_out, const std::vector<float>& got_lse,
                     const std::vector<float>& got_pmax) const {
    ExpectBf16Near(got_out, out, "out");
    // LSE and raw S_max: the same (exact) bf16 products summed in fp32 by the tensor cores vs in
    // double: up to 192 terms of magnitude ≤ 4, so ~1e-5; a mask or index error moves them ~0.1.
    ExpectNear(got_lse, ToFloat(lse), 2e-4, 2e-4, "lse");
    ExpectNear(got_pmax, ToFloat(pmax), 1e-4, 1e-4, "S_max per (batch, head)");
  }
  void ExpectGrads(const std::vector<float>& got_dx) const {
    ExpectBf16Near(Slice(got_dx, q_off, qw), Slice(dx, q_off, qw), "dq");
    ExpectBf16Near(Slice(got_dx, k_off, kw), Slice(dx, k_off, kw), "dk");
    ExpectBf16Near(Slice(got_dx, v_off, vw), Slice(dx, v_off, vw), "dv");
  }

  static std::vector<float> ToFloat(const std::vector<double>& x) { return {x.begin(), x.end()}; }
  // bf16 products with fp32 accumulation against double: entries within 1e-2 relative, plus
  // 1e-2 of the tensor's largest entry absolute (entries near 0 after cancellation carry the
  // rounding of their larger terms), plus 1e-5 for tensors that are 0 up to rounding (dq and dk
  // of a single-token sequence).
  static void ExpectBf16Near(const std::vector<float>& got, const std::vector<double>& want,
                             const std::string& what) {
    double max_abs = 0;
    for (double v : want) max_abs = std::max(max_abs, std::abs(v));
    ExpectNear(got, ToFloat(want), 1e-2 * max_abs + 1e-5, 1e-2, what);
  }

  AttentionDims a;
  bool fused = false;
  int qw = 0, kw = 0, vw = 0;
  long rows = 0, q_off = 0, k_off = 0, v_off = 0;
  size_t total = 0;
  std::vector<float> x, dout;              // inputs (bf16-representable)
  std::vector<double> out, lse, pmax, dx;  // reference results
};

// Element conversions for the emulation tests' host-side buffers (float or bf16 inputs).
inline float ToFloat(float x) { return x; }
inline float ToFloat(bf16 x) { return __bfloat162float(x); }
template <typename T>
T FromFloat(float x) {
  if constexpr (std::is_same_v<T, float>) {
    return x;
  } else {
    return __float2bfloat16(x);
  }
}
// Each element of v (float or double) as a T (through float).
template <typename T, typename V>
std::vector<T> FromFloats(const std::vector<V>& v) {
  std::vector<T> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = FromFloat<T>(float(v[i]));
  return out;
}

// The emulation tests' host buffers in the kernels' input type T: the reference's inputs x (q, k,
// v at its offsets) and dout, the CPU forward's out and LSE (what the backward reads), the outputs
// poisoned with NaN (S_max with −∞, as the launchers fill it) so that an entry no kernel writes
// shows.
template <typename T>
struct FlashEmulationBuffers {
  explicit FlashEmulationBuffers(const FlashReference& ref)
      : x(FromFloats<T>(ref.x)),
        dout(FromFloats<T>(ref.dout)),
        ref_out(FromFloats<T>(ref.out)),
        out(ref.out.size(), FromFloat<T>(kNan)),
        ref_lse(ref.lse.begin(), ref.lse.end()),
        lse(ref.lse.size(), kNan),
        pmax(ref.pmax.size(), -INFINITY),
        d(ref.lse.size(), kNan),
        dx(ref.total, kNan),
        q(x.data() + ref.q_off),
        k(x.data() + ref.k_off),
        v(x.data() + ref.v_off),
        dq(dx.data() + ref.q_off),
        dk(dx.data() + ref.k_off),
        dv(dx.data() + ref.v_off) {}
  FlashEmulationBuffers(const FlashEmulationBuffers&) = delete;
  FlashEmulationBuffers& operator=(const FlashEmulationBuffers&) = delete;
  std::vector<float> OutAsFloat() const {
    std::vector<float> f(out.size());
    for (size_t i = 0; i < out.size(); ++i) f[i] = ToFloat(out[i]);
    return f;
  }

  static constexpr float kNan = std::numeric_limits<float>::quiet_NaN();
  std::vector<T> x, dout, ref_out, out;
  std::vector<float> ref_lse, lse, pmax, d, dx;  // d: the backward's row dots Σ dO·O
  const T *q, *k, *v;
  float *dq, *dk, *dv;
};

// A case with one exact answer (head dims 64): every q·k is 64·(0.5·−0.5) = −16, every logit
// −16·0.125 = −2, so P is 1/(i + 1) on each allowed key, out is exactly v (all ones),
// LSE = −2 + log(i + 1) and S_max = −2. Rows past S in the last query tile score 0 on unmasked
// keys and must not reach S_max.
struct UniformFlashCase {
  static constexpr int kD = 64;
  explicit UniformFlashCase(int S)
      : q(size_t(S) * kD, FromFloat<bf16>(0.5f)),
        k(size_t(S) * kD, FromFloat<bf16>(-0.5f)),
        v(size_t(S) * kD, FromFloat<bf16>(1.0f)),
        out(size_t(S) * kD),
        lse(S),
        pmax(1, -INFINITY) {
    a.batch = 1, a.seq = S, a.heads = 1, a.kv_heads = 1, a.qk_dim = kD, a.v_dim = kD;
    a.ldq = a.ldk = a.ldv = a.ldo = kD;
    a.scale = 0.125;
  }
  void Expect() const {
    EXPECT_EQ(pmax[0], -2.0f);
    for (int i = 0; i < a.seq; ++i) EXPECT_NEAR(lse[i], -2.0 + std::log(i + 1.0), 1e-5) << i;
    for (const bf16& o : out) EXPECT_EQ(ToFloat(o), 1.0f);
  }

  AttentionDims a;
  std::vector<bf16> q, k, v, out;
  std::vector<float> lse, pmax;
};

}  // namespace moelab::cuda::testing
