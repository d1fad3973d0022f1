// Fused (flash) attention against the CPU attention in double: output, log-sum-exp, raw S_max,
// dQ/dK/dV, at shapes whose sequence is not a multiple of the 64-row tile, MHA/GQA/MQA, MLA's
// unequal head dims, soft-cap, fused-QKV strides, bf16 and fp32 inputs; outputs poisoned with NaN
// first; the backward bitwise reproducible; and a micro-benchmark against the reference path.
#include "kernels/cuda/flash_attention.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cpu/attention.h"
#include "kernels/cuda/attention.h"
#include "tests/cuda_kernels/cuda_test_util.h"

namespace moelab::cuda {
namespace {

using testing::ExpectNear;
using testing::Random;

struct Case {
  std::string name;
  int batch, seq, heads, kv_heads, qk_dim, v_dim;
  double softcap;
  bool fused;        // q, k, v as column slices of one buffer (and dq, dk, dv of one gradient)
  bool bf16_inputs;  // T = bf16, else T = float (rounded to bf16 on load)
};

float RoundBf16(float x) { return __bfloat162float(__float2bfloat16(x)); }

double MaxAbs(const std::vector<double>& x) {
  double m = 0;
  for (double v : x) m = std::max(m, std::abs(v));
  return m;
}

std::vector<float> ToFloat(const std::vector<double>& x) { return {x.begin(), x.end()}; }

// bf16 products with fp32 accumulation against the double reference: entries within 1e-2
// relative, plus 1e-2 of the tensor's largest entry absolute (entries near 0 after cancellation
// carry the rounding of their larger terms), plus 1e-5 for tensors that are 0 up to rounding
// (dq and dk of a single-token sequence).
void ExpectBf16Near(const std::vector<float>& got, const std::vector<double>& want,
                    const std::string& what) {
  ExpectNear(got, ToFloat(want), 1e-2 * MaxAbs(want) + 1e-5, 1e-2, what);
}

// log Σ_{j ≤ i} exp(s'_ij) per (b, h, i): the quantity the fused forward keeps, in double.
std::vector<double> ReferenceLse(const AttentionDims& a, const std::vector<double>& q,
                                 const std::vector<double>& k, long q_off, long k_off) {
  const int S = a.seq, group = a.heads / a.kv_heads;
  std::vector<double> lse(size_t(a.batch) * a.heads * S);
  std::vector<double> s(S);
  for (int b = 0; b < a.batch; ++b) {
    for (int h = 0; h < a.heads; ++h) {
      for (int i = 0; i < S; ++i) {
        double m = -INFINITY;
        for (int j = 0; j <= i; ++j) {
          double dot = 0;
          for (int c = 0; c < a.qk_dim; ++c) {
            dot += q[q_off + (long(b) * S + i) * a.ldq + h * a.qk_dim + c] *
                   k[k_off + (long(b) * S + j) * a.ldk + (h / group) * a.qk_dim + c];
          }
          s[j] = dot * a.scale;
          if (a.softcap > 0) s[j] = a.softcap * std::tanh(s[j] / a.softcap);
          m = std::max(m, s[j]);
        }
        double sum = 0;
        for (int j = 0; j <= i; ++j) sum += std::exp(s[j] - m);
        lse[(size_t(b) * a.heads + h) * S + i] = m + std::log(sum);
      }
    }
  }
  return lse;
}

template <typename T>
std::vector<T> Convert(const std::vector<float>& x) {
  std::vector<T> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = static_cast<T>(x[i]);
  return out;
}
template <>
std::vector<bf16> Convert<bf16>(const std::vector<float>& x) {
  std::vector<bf16> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = __float2bfloat16(x[i]);
  return out;
}
std::vector<float> Download(const DeviceBuffer<float>& d) { return d.Download(); }
std::vector<float> Download(const DeviceBuffer<bf16>& d) {
  const auto h = d.Download();
  std::vector<float> out(h.size());
  for (size_t i = 0; i < h.size(); ++i) out[i] = __bfloat162float(h[i]);
  return out;
}

template <typename T>
void Poison(DeviceBuffer<T>& d) {
  d.Upload(Convert<T>(std::vector<float>(d.size(), std::numeric_limits<float>::quiet_NaN())));
}

AttentionDims MakeDims(const Case& c) {
  AttentionDims a;
  a.batch = c.batch, a.seq = c.seq, a.heads = c.heads, a.kv_heads = c.kv_heads;
  a.qk_dim = c.qk_dim, a.v_dim = c.v_dim;
  a.scale = 1.0 / std::sqrt(double(c.qk_dim));
  a.softcap = c.softcap;
  const int qw = c.heads * c.qk_dim, kw = c.kv_heads * c.qk_dim, vw = c.kv_heads * c.v_dim;
  a.ldq = c.fused ? qw + kw + vw : qw;
  a.ldk = c.fused ? qw + kw + vw : kw;
  a.ldv = c.fused ? qw + kw + vw : vw;
  a.ldo = c.heads * c.v_dim;
  return a;
}

template <typename T>
void RunCase(const Case& c) {
  SCOPED_TRACE(c.name);
  const AttentionDims a = MakeDims(c);
  std::string why;
  ASSERT_TRUE(FlashAttentionSupported(a, sizeof(T), &why)) << why;
  const int qw = c.heads * c.qk_dim, kw = c.kv_heads * c.qk_dim, vw = c.kv_heads * c.v_dim;
  const long rows = long(c.batch) * c.seq;
  // q, k, v in one host buffer either way; separate layout: [rows·qw | rows·kw | rows·vw].
  const long q_off = 0, k_off = c.fused ? qw : rows * qw,
             v_off = c.fused ? qw + kw : rows * (qw + kw);
  const size_t total = size_t(rows) * (qw + kw + vw);
  // Logits of a few units (S_max well above the typical logit; the soft-cap bites), values
  // exactly representable in bf16 so that the CPU sees what the GPU sees.
  auto x = Random(total, 7 + c.seq, -2.0f, 2.0f);
  for (float& v : x) v = RoundBf16(v);
  auto dout = Random(size_t(rows) * a.ldo, 11 + c.seq);
  for (float& v : dout) v = RoundBf16(v);
  const std::vector<double> xd(x.begin(), x.end()), doutd(dout.begin(), dout.end());

  const size_t pairs = size_t(c.batch) * c.heads, ss = size_t(c.seq) * c.seq;
  std::vector<double> probs(pairs * ss), capped(pairs * ss), out(size_t(rows) * a.ldo), pmax(pairs),
      dx(total, 0.0);
  cpu::AttentionForward<double>(a, xd.data() + q_off, xd.data() + k_off, xd.data() + v_off,
                                probs.data(), capped.data(), out.data(), pmax.data());
  std::vector<double> scratch(cpu::AttentionScratchSize(a, 256));
  cpu::AttentionBackward<double>(a, xd.data() + q_off, xd.data() + k_off, xd.data() + v_off,
                                 probs.data(), capped.data(), doutd.data(), dx.data() + q_off,
                                 dx.data() + k_off, dx.data() + v_off, scratch.data());
  const auto lse = ReferenceLse(a, xd, xd, q_off, k_off);

  auto gx = testing::ToDevice(Convert<T>(x));
  auto gdout = testing::ToDevice(Convert<T>(dout));
  DeviceBuffer<T> gout(out.size());
  DeviceBuffer<float> glse(lse.size()), gpmax(pairs), gdx(total),
      gscratch(FlashAttentionScratchSize(a));
  Poison(gout), Poison(glse), Poison(gpmax), Poison(gdx), Poison(gscratch);
  FlashAttentionForward<T>(a, gx.data() + q_off, gx.data() + k_off, gx.data() + v_off, gout.data(),
                           glse.data(), gpmax.data());
  const auto got_out = Download(gout);
  ExpectBf16Near(got_out, out, "out");
  // LSE and raw S_max: the same (exact) bf16 products summed by the tensor cores in fp32 vs in
  // double: up to 192 terms of magnitude ≤ 4, so ~1e-5; a mask or index error moves them by ~0.1.
  ExpectNear(Download(glse), ToFloat(lse), 2e-4, 2e-4, "lse");
  ExpectNear(Download(gpmax), ToFloat(pmax), 1e-4, 1e-4, "S_max per (batch, head)");

  FlashAttentionBackward<T>(a, gx.data() + q_off, gx.data() + k_off, gx.data() + v_off, gout.data(),
                            glse.data(), gdout.data(), gdx.data() + q_off, gdx.data() + k_off,
                            gdx.data() + v_off, gscratch.data());
  const auto got_dx = Download(gdx);
  auto slice = [&](const std::vector<float>& all, long off, int width) {
    std::vector<float> s;  // the columns [off, off + width) of each row (fused), or a block
    for (long r = 0; r < rows; ++r) {
      const long at = c.fused ? r * a.ldq + off : off + r * width;
      s.insert(s.end(), all.begin() + at, all.begin() + at + width);
    }
    return s;
  };
  auto dslice = [&](const std::vector<double>& all, long off, int width) {
    std::vector<double> s;
    for (long r = 0; r < rows; ++r) {
      const long at = c.fused ? r * a.ldq + off : off + r * width;
      s.insert(s.end(), all.begin() + at, all.begin() + at + width);
    }
    return s;
  };
  ExpectBf16Near(slice(got_dx, q_off, qw), dslice(dx, q_off, qw), "dq");
  ExpectBf16Near(slice(got_dx, k_off, kw), dslice(dx, k_off, kw), "dk");
  ExpectBf16Near(slice(got_dx, v_off, vw), dslice(dx, v_off, vw), "dv");

  // Deterministic: a second forward + backward into freshly poisoned buffers, bit for bit.
  DeviceBuffer<T> gout2(out.size());
  DeviceBuffer<float> glse2(lse.size()), gpmax2(pairs), gdx2(total);
  Poison(gout2), Poison(glse2), Poison(gpmax2), Poison(gdx2);
  FlashAttentionForward<T>(a, gx.data() + q_off, gx.data() + k_off, gx.data() + v_off, gout2.data(),
                           glse2.data(), gpmax2.data());
  FlashAttentionBackward<T>(a, gx.data() + q_off, gx.data() + k_off, gx.data() + v_off,
                            gout2.data(), glse2.data(), gdout.data(), gdx2.data() + q_off,
                            gdx2.data() + k_off, gdx2.data() + v_off, gscratch.data());
  auto same_bits = [](const std::vector<float>& u, const std::vector<float>& w) {
    return u.size() == w.size() && std::memcmp(u.data(), w.data(), u.size() * sizeof(float)) == 0;
  };
  EXPECT_TRUE(same_bits(Download(gout2), got_out)) << "out differs between runs";
  EXPECT_TRUE(same_bits(Download(gpmax2), Download(gpmax))) << "S_max differs between runs";
  EXPECT_TRUE(same_bits(Download(gdx2), got_dx)) << "dq/dk/dv differ between runs";
}

TEST(CudaFlashAttention, UnsupportedShapesAreRefusedWithTheReason) {
  // Runs without a GPU: the checks come before any device work.
  AttentionDims a;
  a.batch = 1, a.seq = 8, a.heads = 2, a.kv_heads = 2, a.qk_dim = 40, a.v_dim = 40;
  a.ldq = a.ldk = a.ldv = a.ldo = 80;
  std::string why;
  EXPECT_FALSE(FlashAttentionSupported(a, 2, &why));
  EXPECT_NE(why.find("40"), std::string::npos) << why;
  a.qk_dim = a.v_dim = 64, a.ldq = a.ldk = a.ldv = a.ldo = 129;  // rows not 16-byte aligned
  EXPECT_FALSE(FlashAttentionSupported(a, 2, &why));
  a.ldq = a.ldk = a.ldv = a.ldo = 128;
  EXPECT_TRUE(FlashAttentionSupported(a, 2, &why)) << why;
  a.kv_heads = 3;  // 2 heads over 3 kv heads
  const bf16* none = nullptr;
  bf16* out = nullptr;
  EXPECT_THROW(FlashAttentionForward(a, none, none, none, out, nullptr, nullptr),
               std::invalid_argument);
  a.kv_heads = 2, a.qk_dim = a.v_dim = 40;
  EXPECT_THROW(FlashAttentionBackward(a, none, none, none, none, nullptr, none, nullptr, nullptr,
                                      nullptr, nullptr),
               std::invalid_argument);
}

TEST(CudaFlashAttention, Mha64OddLength) {
  MOELAB_REQUIRE_GPU();
  RunCase<bf16>({"mha 64, S=100", 2, 100, 3, 3, 64, 64, 0.0, false, true});
}

TEST(CudaFlashAttention, Gqa128FusedQkvFp32Inputs) {
  MOELAB_REQUIRE_GPU();
  RunCase<float>({"gqa 128 fused fp32, S=130", 1, 130, 4, 2, 128, 128, 0.0, true, false});
}

TEST(CudaFlashAttention, MqaSoftCapKeepsRawSmax) {
  MOELAB_REQUIRE_GPU();
  // Logits up to ~8 against a cap of 3: the raw S_max lies well above what the softmax saw.
  RunCase<bf16>({"mqa softcap 3, S=77", 2, 77, 4, 1, 64, 64, 3.0, false, true});
}

TEST(CudaFlashAttention, MlaUnequalHeadDims) {
  MOELAB_REQUIRE_GPU();
  RunCase<bf16>({"mla 48/32, S=65", 2, 65, 2, 2, 48, 32, 0.0, false, true});
  RunCase<float>({"mla 192/128 softcap, S=70", 1, 70, 2, 2, 192, 128, 5.0, false, false});
  RunCase<bf16>({"96/64 gqa, S=64", 1, 64, 4, 2, 96, 64, 0.0, true, true});
}

TEST(CudaFlashAttention, TinyAndSingleTokenSequences) {
  MOELAB_REQUIRE_GPU();
  RunCase<bf16>({"32/32, S=1", 3, 1, 2, 1, 32, 32, 0.0, false, true});
  RunCase<float>({"32/32, S=17", 2, 17, 2, 2, 32, 32, 2.0, false, false});
}

// Micro-benchmark (prints; asserts nothing about speed): B=32, H=16, S=1024, D=64, bf16, against
// the reference path (cuBLAS over the full square, probabilities stored). FLOPs counted as
// FlashAttention does: forward 4·B·H·S²·D / 2 (causal), backward 2.5× the forward.
TEST(CudaFlashAttention, BenchmarkAgainstReferencePath) {
  MOELAB_REQUIRE_GPU();
  AttentionDims a;
  a.batch = 32, a.seq = 1024, a.heads = 16, a.kv_heads = 16, a.qk_dim = 64, a.v_dim = 64;
  a.ldq = a.ldk = a.ldv = a.ldo = 16 * 64;
  a.scale = 0.125;
  const size_t n = size_t(a.batch) * a.seq * a.ldq, pairs = size_t(a.batch) * a.heads;
  auto x = testing::ToDevice(Convert<bf16>(Random(n, 1)));
  auto gy = testing::ToDevice(Convert<bf16>(Random(n, 2)));
  DeviceBuffer<bf16> out(n);
  DeviceBuffer<float> lse(FlashAttentionScratchSize(a)), pmax(pairs), dq(n), dk(n), dv(n),
      scratch(FlashAttentionScratchSize(a));
  const double fwd_flops = 4.0 * a.batch * a.heads * double(a.seq) * a.seq * a.qk_dim / 2;
  auto time_ms = [](auto&& f) {
    f();  // warm-up
    MOELAB_CUDA_CHECK(cudaDeviceSynchronize());
    const int reps = 5;
    const auto t0 = std::chrono::steady_clock::now();
    for (int r = 0; r < reps; ++r) f();
    MOELAB_CUDA_CHECK(cudaDeviceSynchronize());
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
               .count() /
           reps;
  };
  const double f_fwd = time_ms([&] {
    FlashAttentionForward(a, x.data(), x.data(), x.data(), out.data(), lse.data(), pmax.data());
  });
  const double f_bwd = time_ms([&] {
    FlashAttentionBackward(a, x.data(), x.data(), x.data(), out.data(), lse.data(), gy.data(),
                           dq.data(), dk.data(), dv.data(), scratch.data());
  });
  std::printf(
      "[flash] B=32 H=16 S=1024 D=64 bf16: forward %.3f ms (%.1f TFLOP/s), backward %.3f ms"
      " (%.1f TFLOP/s)\n",
      f_fwd, fwd_flops / f_fwd / 1e9, f_bwd, 2.5 * fwd_flops / f_bwd / 1e9);
  // The reference path needs [B,H,S,S] probabilities (fp32 + bf16) and an fp32 scratch: 6 GiB.
  const size_t square = AttentionScratchSize(a);
  DeviceBuffer<float> probs(square), rscratch(square);
  DeviceBuffer<bf16> probs16(square), rscratch16(square);
  const double r_fwd = time_ms([&] {
    AttentionForwardBf16(a, x.data(), x.data(), x.data(), probs.data(), probs16.data(), nullptr,
                         out.data(), pmax.data());
  });
  const double r_bwd = time_ms([&] {
    AttentionBackwardBf16(a, x.data(), x.data(), x.data(), probs.data(), probs16.data(), nullptr,
                          gy.data(), dq.data(), dk.data(), dv.data(), rscratch.data(),
                          rscratch16.data());
  });
  std::printf(
      "[reference] same shape: forward %.3f ms (%.1f TFLOP/s), backward %.3f ms"
      " (%.1f TFLOP/s); fused speed-up %.2fx forward, %.2fx backward\n",
      r_fwd, fwd_flops / r_fwd / 1e9, r_bwd, 2.5 * fwd_flops / r_bwd / 1e9, r_fwd / f_fwd,
      r_bwd / f_bwd);
}

}  // namespace
}  // namespace moelab::cuda
