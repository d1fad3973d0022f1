// Fused (flash) attention against the CPU attention in double (tests/cuda_kernels/
// flash_reference.h): output, log-sum-exp, raw S_max, dQ/dK/dV, at shapes whose sequence is not a
// multiple of the 64-row tile, MHA/GQA/MQA, MLA's unequal head dims, soft-cap, fused-QKV
// strides, bf16 and fp32 inputs; outputs poisoned with NaN first; the backward bitwise
// reproducible; and a micro-benchmark of both implementations (mma, wmma) against the reference
// path. Every shape runs on every implementation (FlashShapes, instantiated as Wmma/, Mma/ and
// Mma64/: the GPU check runs the Mma/ and Mma64/ tests in their own processes, so that a faulting
// opt-in kernel cannot fail the default ones; the full shape: flash_full_shape_test.cc). RoPE fused
// into the mma kernels (FlashRope) bit for bit against RopeApplyQk around the plain kernels. The
// same kernels also run on the CPU emulation (flash_emulation_test.cc,
// flash_forward_mma_emulation_test.cc, flash_backward_mma_emulation_test.cc,
// flash_rope_emulation_test.cc).
#include "kernels/cuda/flash_attention.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "kernels/cpu/rope.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/rope.h"
#include "tests/common/test_util.h"
#include "tests/cuda_kernels/cuda_test_util.h"
#include "tests/cuda_kernels/flash_reference.h"

namespace moelab::cuda {
namespace {

using testing::FlashCase;
using testing::FlashReference;
using testing::Random;

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

// The kernels' selection of one implementation, or (bool) with the tuned mma kernels on or off.
KernelSelection FlashKernels(FlashKernel kernel) {
  KernelSelection k;
  k.attention_mma = kernel != FlashKernel::kWmma;
  k.attention_mma64 = kernel == FlashKernel::kMma64;
  return k;
}
KernelSelection FlashKernels(bool mma) {
  return FlashKernels(mma ? FlashKernel::kMma : FlashKernel::kWmma);
}

template <typename T>
void RunCase(const FlashCase& c) {
  SCOPED_TRACE(c.name);
  const FlashReference ref(c);
  const AttentionDims& a = ref.a;
  std::string why;
  ASSERT_TRUE(FlashAttentionSupported(a, sizeof(T), &why)) << why;
  const long q_off = ref.q_off, k_off = ref.k_off, v_off = ref.v_off;
  const size_t pairs = size_t(c.batch) * c.heads;
  auto gx = testing::ToDevice(Convert<T>(ref.x));
  auto gdout = testing::ToDevice(Convert<T>(ref.dout));
  DeviceBuffer<T> gout(ref.out.size());
  DeviceBuffer<float> glse(ref.lse.size()), gpmax(pairs), gdx(ref.total),
      gscratch(FlashAttentionScratchSize(a));
  Poison(gout), Poison(glse), Poison(gpmax), Poison(gdx), Poison(gscratch);
  FlashAttentionForward<T>(a, gx.data() + q_off, gx.data() + k_off, gx.data() + v_off, gout.data(),
                           glse.data(), gpmax.data());
  FlashAttentionBackward<T>(a, gx.data() + q_off, gx.data() + k_off, gx.data() + v_off, gout.data(),
                            glse.data(), gdout.data(), gdx.data() + q_off, gdx.data() + k_off,
                            gdx.data() + v_off, gscratch.data());
  const auto got_out = Download(gout), got_dx = Download(gdx);
  ref.Expect(got_out, Download(glse), Download(gpmax), got_dx);

  // Deterministic: a second forward + backward into freshly poisoned buffers, bit for bit.
  DeviceBuffer<T> gout2(ref.out.size());
  DeviceBuffer<float> glse2(ref.lse.size()), gpmax2(pairs), gdx2(ref.total);
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

TEST(CudaFlashAttention, MmaForwardRefusesAMisalignedOut) {
  // Runs without a GPU: the check comes before any device work. The mma forward writes out in
  // 8-byte pairs, so an out off by one float would fault on the device.
  const ScopedKernelSelection use(FlashKernels(true));
  AttentionDims a;
  a.batch = 1, a.seq = 8, a.heads = 2, a.kv_heads = 2, a.qk_dim = a.v_dim = 64;
  a.ldq = a.ldk = a.ldv = a.ldo = 128;
  alignas(16) static float buf[8];
  try {
    FlashAttentionForward<float>(a, buf, buf, buf, buf + 1, nullptr, nullptr);
    ADD_FAILURE() << "a misaligned out accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("out is not 16-byte aligned"), std::string::npos)
        << e.what();
  }
}

// The shapes on each implementation: Wmma/ (the default), Mma/ and Mma64/ (opt-in:
// attention_kernel "mma", the tuned mma kernels, and "mma64", the first ones).
class FlashShapes : public ::testing::TestWithParam<FlashKernel> {};

TEST_P(FlashShapes, Mha64OddLength) {
  MOELAB_REQUIRE_GPU();
  const ScopedKernelSelection use(FlashKernels(GetParam()));
  RunCase<bf16>({"mha 64, S=100", 2, 100, 3, 3, 64, 64, 0.0, false});
}

TEST_P(FlashShapes, Gqa128FusedQkvFp32Inputs) {
  MOELAB_REQUIRE_GPU();
  const ScopedKernelSelection use(FlashKernels(GetParam()));
  RunCase<float>({"gqa 128 fused fp32, S=130", 1, 130, 4, 2, 128, 128, 0.0, true});
}

TEST_P(FlashShapes, MqaSoftCapKeepsRawSmax) {
  MOELAB_REQUIRE_GPU();
  const ScopedKernelSelection use(FlashKernels(GetParam()));
  // Logits up to ~8 against a cap of 3: the raw S_max lies well above what the softmax saw.
  RunCase<bf16>({"mqa softcap 3, S=77", 2, 77, 4, 1, 64, 64, 3.0, false});
}

TEST_P(FlashShapes, MlaUnequalHeadDims) {
  MOELAB_REQUIRE_GPU();
  const ScopedKernelSelection use(FlashKernels(GetParam()));
  RunCase<bf16>({"mla 48/32, S=65", 2, 65, 2, 2, 48, 32, 0.0, false});
  RunCase<float>({"mla 192/128 softcap, S=70", 1, 70, 2, 2, 192, 128, 5.0, false});
  RunCase<bf16>({"96/64 gqa, S=64", 1, 64, 4, 2, 96, 64, 0.0, true});
}

TEST_P(FlashShapes, TinyAndSingleTokenSequences) {
  MOELAB_REQUIRE_GPU();
  const ScopedKernelSelection use(FlashKernels(GetParam()));
  RunCase<bf16>({"32/32, S=1", 3, 1, 2, 1, 32, 32, 0.0, false});
  RunCase<float>({"16/16 softcap, S=17", 2, 17, 2, 2, 16, 16, 2.0, false});
}

INSTANTIATE_TEST_SUITE_P(Wmma, FlashShapes, ::testing::Values(FlashKernel::kWmma));
INSTANTIATE_TEST_SUITE_P(Mma, FlashShapes, ::testing::Values(FlashKernel::kMma));
INSTANTIATE_TEST_SUITE_P(Mma64, FlashShapes, ::testing::Values(FlashKernel::kMma64));

// RoPE given to the mma kernels (FlashRope, on un-rotated fp32 q and k) against the model's
// unfused sequence on the same inputs: RopeApplyQk on q and k, the plain kernels, RopeApplyQk⁻¹
// on dq and dk. Out, LSE, S_max, dq, dk and dv equal to the bit (the rotation is the rope
// kernel's own arithmetic, rope::RotatePair, before the same bf16 rounding). The model's layout:
// q | k | v columns of one buffer.
void RunRopeCase(const FlashCase& c) {
  SCOPED_TRACE(c.name);
  ASSERT_TRUE(c.fused && c.qk_dim == c.v_dim);
  const ScopedKernelSelection use(FlashKernels(true));
  const FlashReference ref(c);
  const AttentionDims& a = ref.a;
  std::string why;
  ASSERT_TRUE(FlashRopeSupported(a, sizeof(float), c.qk_dim, &why)) << why;
  const int D = c.qk_dim, n = c.batch * c.seq;
  std::vector<float> cos(size_t(c.seq) * D / 2), sin(cos.size());
  cpu::RopeTables(c.seq, D, 10000.0, cos.data(), sin.data());
  auto gcos = testing::ToDevice(cos), gsin = testing::ToDevice(sin);
  const FlashRope rope{gcos.data(), gsin.data(), D};
  const std::vector<float> x0 = Random(ref.total, 3);  // fp32 values: not bf16-exact
  const size_t pairs = size_t(c.batch) * c.heads;
  struct Run {
    std::vector<float> out, lse, pmax, dx;
  };
  auto run = [&](bool fused) {
    auto gx = testing::ToDevice(x0);
    auto gdout = testing::ToDevice(ref.dout);
    DeviceBuffer<float> gout(ref.out.size()), glse(ref.lse.size()), gpmax(pairs), gdx(ref.total),
        gscratch(FlashAttentionScratchSize(a));
    Poison(gout), Poison(glse), Poison(gpmax), Poison(gdx), Poison(gscratch);
    auto slices = [&](float* x) {
      return std::pair{cpu::RopeSlice<float>{x + ref.q_off, int(a.ldq), c.heads, D, 0},
                       cpu::RopeSlice<float>{x + ref.k_off, int(a.ldk), c.kv_heads, D, 0}};
    };
    if (!fused) {
      const auto [q, k] = slices(gx.data());
      cuda::RopeApplyQk(q, k, n, c.seq, D, gcos.data(), gsin.data(), /*inverse=*/false);
    }
    const FlashRope* r = fused ? &rope : nullptr;
    float* x = gx.data();
    FlashAttentionForward<float>(a, x + ref.q_off, x + ref.k_off, x + ref.v_off, gout.data(),
                                 glse.data(), gpmax.data(), nullptr, r);
    FlashAttentionBackward<float>(a, x + ref.q_off, x + ref.k_off, x + ref.v_off, gout.data(),
                                  glse.data(), gdout.data(), gdx.data() + ref.q_off,
                                  gdx.data() + ref.k_off, gdx.data() + ref.v_off, gscratch.data(),
                                  nullptr, r);
    if (!fused) {
      const auto [dq, dk] = slices(gdx.data());
      cuda::RopeApplyQk(dq, dk, n, c.seq, D, gcos.data(), gsin.data(), /*inverse=*/true);
    }
    return Run{gout.Download(), glse.Download(), gpmax.Download(), gdx.Download()};
  };
  const Run separate = run(false), fused = run(true);
  auto same_bits = [](const std::vector<float>& u, const std::vector<float>& w) {
    return u.size() == w.size() && std::memcmp(u.data(), w.data(), u.size() * sizeof(float)) == 0;
  };
  EXPECT_TRUE(same_bits(fused.out, separate.out)) << "out";
  EXPECT_TRUE(same_bits(fused.lse, separate.lse)) << "lse";
  EXPECT_TRUE(same_bits(fused.pmax, separate.pmax)) << "S_max";
  EXPECT_TRUE(same_bits(fused.dx, separate.dx)) << "dq | dk | dv";
}

TEST(CudaFlashAttention, FusedRopeEqualsRopeKernelsAroundTheKernels) {
  MOELAB_REQUIRE_GPU();
  RunRopeCase({"rope gqa 64, S=130", 2, 130, 4, 2, 64, 64, 0.0, true});
  RunRopeCase({"rope mha 128 softcap 3, S=70", 1, 70, 2, 2, 128, 128, 3.0, true});
  RunRopeCase({"rope 16/16, S=17", 2, 17, 2, 2, 16, 16, 0.0, true});
}

// Where RoPE cannot be fused the launchers refuse it with the reason (no GPU needed: the checks
// come before any device work): bf16 q and k (cp.async tiles), the wmma kernels, MLA's shapes.
TEST(CudaFlashAttention, FusedRopeRefusedWhereTheKernelsCannotApplyIt) {
  AttentionDims a;
  a.batch = 1, a.seq = 8, a.heads = 2, a.kv_heads = 2, a.qk_dim = 64, a.v_dim = 64;
  a.ldq = a.ldk = a.ldv = a.ldo = 128;
  std::string why;
  {
    const ScopedKernelSelection use(FlashKernels(true));
    EXPECT_TRUE(FlashRopeSupported(a, 4, 64, &why)) << why;
    EXPECT_FALSE(FlashRopeSupported(a, 2, 64, &why));
    EXPECT_NE(why.find("fp32"), std::string::npos) << why;
    EXPECT_FALSE(FlashRopeSupported(a, 4, 32, &why));  // a partial rotation (MLA-like)
    EXPECT_NE(why.find("rotary dims 32"), std::string::npos) << why;
    const bf16* none = nullptr;
    bf16* out = nullptr;
    const FlashRope rope{nullptr, nullptr, 64};
    try {
      FlashAttentionForward(a, none, none, none, out, nullptr, nullptr, nullptr, &rope);
      ADD_FAILURE() << "bf16 with RoPE accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("RoPE cannot be fused"), std::string::npos) << e.what();
    }
    a.qk_dim = 48, a.v_dim = 32;
    EXPECT_FALSE(FlashRopeSupported(a, 4, 48, &why));
    EXPECT_NE(why.find("qk_dim = v_dim"), std::string::npos) << why;
    a.qk_dim = a.v_dim = 64;
  }
  const ScopedKernelSelection use(FlashKernels(false));
  EXPECT_FALSE(FlashRopeSupported(a, 4, 64, &why));
  EXPECT_NE(why.find("wmma"), std::string::npos) << why;
  const float* none = nullptr;
  const FlashRope rope{nullptr, nullptr, 64};
  EXPECT_THROW(FlashAttentionBackward<float>(a, none, none, none, none, nullptr, none, nullptr,
                                             nullptr, nullptr, nullptr, nullptr, &rope),
               std::invalid_argument);
}

TEST(CudaFlashAttention, FlashRopeFollowsTheSelection) {
  EXPECT_FALSE(FlashRopeFused());  // the default, with no selection installed
  KernelSelection k;
  k.rope_fused = true;
  {
    const ScopedKernelSelection use(k);
    EXPECT_TRUE(FlashRopeFused());
  }
  EXPECT_FALSE(FlashRopeFused());  // the defaults again once the last selection is gone
}

// Micro-benchmark (prints; asserts nothing about speed): B=32, H=16, S=1024, D=64, bf16, both
// implementations of the fused kernels (attention_kernel "mma" and "wmma") against the reference
// path (cuBLAS over the full square, probabilities stored), and the mma kernels as the model calls
// them (fp32 QKV column slices, with and without RoPE fused). FLOPs counted as FlashAttention does:
// forward 4·B·H·S²·D / 2 (causal), backward 2.5× the forward.
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
  const char* kernels[] = {"mma", "wmma"};
  double f_fwd[2], f_bwd[2];
  for (int i = 0; i < 2; ++i) {
    const ScopedKernelSelection use(FlashKernels(i == 0));
    f_fwd[i] = time_ms([&] {
      FlashAttentionForward(a, x.data(), x.data(), x.data(), out.data(), lse.data(), pmax.data());
    });
    f_bwd[i] = time_ms([&] {
      FlashAttentionBackward(a, x.data(), x.data(), x.data(), out.data(), lse.data(), gy.data(),
                             dq.data(), dk.data(), dv.data(), scratch.data());
    });
    std::printf(
        "[flash %s] B=32 H=16 S=1024 D=64 bf16: forward %.3f ms (%.1f TFLOP/s), backward %.3f ms"
        " (%.1f TFLOP/s)\n",
        kernels[i], f_fwd[i], fwd_flops / f_fwd[i] / 1e9, f_bwd[i],
        2.5 * fwd_flops / f_bwd[i] / 1e9);
  }
  // The model's case for the mma kernels: fp32 q, k, v as column slices of the fused QKV
  // activation [B·S, 3·1024], fp32 out and gradients (rounded to bf16 as tiles load, so no
  // cp.async), with RoPE in the tile loads (rope "fused") and without.
  {
    const ScopedKernelSelection use(FlashKernels(true));
    AttentionDims m = a;
    m.ldq = m.ldk = m.ldv = 3 * a.ldq;
    const size_t rows = size_t(a.batch) * a.seq;
    auto qkv = testing::ToDevice(Random(rows * m.ldq, 3));
    auto fdout = testing::ToDevice(Random(rows * m.ldo, 4));
    DeviceBuffer<float> fout(rows * m.ldo), dqkv(rows * m.ldq), cs(size_t(a.seq) * a.qk_dim / 2),
        sn(cs.size());
    RopeTables<float>(a.seq, a.qk_dim, 10000.0, cs.data(), sn.data());
    const FlashRope rope{cs.data(), sn.data(), a.qk_dim};
    const float *q = qkv.data(), *k = q + a.ldq, *v = k + a.ldq;
    for (const FlashRope* r : {static_cast<const FlashRope*>(nullptr), &rope}) {
      const double fwd = time_ms([&] {
        FlashAttentionForward<float>(m, q, k, v, fout.data(), lse.data(), pmax.data(), nullptr, r);
      });
      const double bwd = time_ms([&] {
        FlashAttentionBackward<float>(m, q, k, v, fout.data(), lse.data(), fdout.data(),
                                      dqkv.data(), dqkv.data() + a.ldq, dqkv.data() + 2 * a.ldq,
                                      scratch.data(), nullptr, r);
      });
      std::printf(
          "[flash mma, the model's fp32 QKV slices%s] forward %.3f ms (%.1f TFLOP/s), backward "
          "%.3f ms (%.1f TFLOP/s)\n",
          r ? " + fused RoPE" : "", fwd, fwd_flops / fwd / 1e9, bwd, 2.5 * fwd_flops / bwd / 1e9);
    }
  }
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
      "[reference] same shape: forward %.3f ms (%.1f TFLOP/s), backward %.3f ms (%.1f TFLOP/s);"
      " speed-up of mma %.2fx forward, %.2fx backward; of wmma %.2fx forward, %.2fx backward;"
      " mma over wmma %.2fx forward, %.2fx backward\n",
      r_fwd, fwd_flops / r_fwd / 1e9, r_bwd, 2.5 * fwd_flops / r_bwd / 1e9, r_fwd / f_fwd[0],
      r_bwd / f_bwd[0], r_fwd / f_fwd[1], r_bwd / f_bwd[1], f_fwd[1] / f_fwd[0],
      f_bwd[1] / f_bwd[0]);
}

}  // namespace
}  // namespace moelab::cuda
