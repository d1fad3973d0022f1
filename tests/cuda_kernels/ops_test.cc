// Embedding, RMSNorm (and the fused residual add + RMSNorm), RoPE (and q and k in one launch),
// SwiGLU and cross-entropy twins against kernels/cpu, fp32.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "kernels/cpu/cross_entropy.h"
#include "kernels/cpu/embedding.h"
#include "kernels/cpu/norm.h"
#include "kernels/cpu/rope.h"
#include "kernels/cpu/swiglu.h"
#include "kernels/cuda/cross_entropy.h"
#include "kernels/cuda/embedding.h"
#include "kernels/cuda/norm.h"
#include "kernels/cuda/rope.h"
#include "kernels/cuda/swiglu.h"
#include "tests/cuda_kernels/cuda_test_util.h"

namespace moelab::cuda {
namespace {

using testing::ExpectNear;
using testing::Random;
using testing::ToDevice;

std::vector<int32_t> RandomTokens(int n, int vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> t(n);
  for (auto& x : t) x = static_cast<int32_t>(rng() % vocab);
  return t;
}

TEST(CudaEmbedding, ForwardExactBackwardSameAdditionOrder) {
  MOELAB_REQUIRE_GPU();
  const int vocab = 17, d = 40, n = 300;  // many repeats per token id
  const auto table = Random(size_t(vocab) * d, 1);
  const auto tokens = RandomTokens(n, vocab, 2);
  const auto dout = Random(size_t(n) * d, 3);
  std::vector<float> out(size_t(n) * d);
  cpu::EmbeddingForward(table.data(), tokens.data(), n, d, out.data());
  auto dtab = ToDevice(table);
  auto dtok = ToDevice(tokens);
  DeviceBuffer<float> gout(out.size());
  EmbeddingForward(dtab.data(), dtok.data(), n, d, gout.data());
  EXPECT_EQ(gout.Download(), out);  // a copy: exact

  std::vector<float> dtable = Random(size_t(vocab) * d, 4);  // backward accumulates
  auto gdtable = ToDevice(dtable);
  cpu::EmbeddingBackward(tokens.data(), dout.data(), n, d, dtable.data());
  auto gdout = ToDevice(dout);
  DeviceBuffer<char> scratch(EmbeddingScratchBytes(n));
  EmbeddingBackward(dtok.data(), gdout.data(), n, d, gdtable.data(), scratch.data());
  // Each row is summed in position order onto the old value, as on the CPU: bit-identical.
  EXPECT_EQ(gdtable.Download(), dtable);
}

TEST(CudaRmsNorm, ForwardBackwardMatchCpu) {
  MOELAB_REQUIRE_GPU();
  const int n = 300, d = 96;  // 300 rows: the dgain reduction spans several 128-row chunks
  const double eps = 1e-6;
  const auto x = Random(size_t(n) * d, 5), gain = Random(d, 6, 0.5f, 1.5f),
             dy = Random(size_t(n) * d, 7);
  std::vector<float> y(x.size()), rstd(n), dx = Random(x.size(), 8), dgain(d);
  auto gx = ToDevice(x), ggain = ToDevice(gain), gdy = ToDevice(dy), gdx = ToDevice(dx);
  cpu::RmsNormForward(x.data(), gain.data(), n, d, eps, y.data(), rstd.data());
  cpu::RmsNormBackward(x.data(), gain.data(), rstd.data(), dy.data(), n, d, dx.data(), dgain.data(),
                       /*accumulate_dx=*/true);
  DeviceBuffer<float> gy(y.size()), grstd(n), gdgain(d);
  RmsNormForward(gx.data(), ggain.data(), n, d, eps, gy.data(), grstd.data());
  RmsNormBackward(gx.data(), ggain.data(), grstd.data(), gdy.data(), n, d, gdx.data(),
                  gdgain.data(), true);
  ExpectNear(gy.Download(), y, 1e-6, 1e-5, "rmsnorm y");
  ExpectNear(grstd.Download(), rstd, 0, 1e-5, "rmsnorm rstd");
  ExpectNear(gdx.Download(), dx, 1e-5, 1e-4, "rmsnorm dx");
  ExpectNear(gdgain.Download(), dgain, 1e-4, 1e-4, "rmsnorm dgain");
}

// The fused residual add + RMSNorm (one kernel) is the add then RmsNormForward on this device bit
// for bit (same threads, same sums), and matches the CPU twin with RmsNorm's tolerances; the sum
// is one float add: exact. In place (sum = a) too, as the model may use it.
TEST(CudaRmsNorm, FusedAddEqualsAddThenNormAndMatchesCpu) {
  MOELAB_REQUIRE_GPU();
  for (int d : {96, 200, 768}) {  // each NormThreads branch; 200: a ragged last stride
    SCOPED_TRACE(d);
    const int n = 300;
    const double eps = 1e-6;
    const size_t nd = size_t(n) * d;
    const auto a = Random(nd, 21), b = Random(nd, 22), gain = Random(d, 23, 0.5f, 1.5f);
    std::vector<float> sum(nd), y(nd), rstd(n);
    cpu::AddRmsNormForward(a.data(), b.data(), sum.data(), gain.data(), n, d, eps, y.data(),
                           rstd.data());
    auto ga = ToDevice(a), gb = ToDevice(b), ggain = ToDevice(gain), gsum_in = ToDevice(sum);
    DeviceBuffer<float> gsum(nd), gy(nd), grstd(n), gy_ref(nd), grstd_ref(n);
    AddRmsNormForward(ga.data(), gb.data(), gsum.data(), ggain.data(), n, d, eps, gy.data(),
                      grstd.data());
    RmsNormForward(gsum_in.data(), ggain.data(), n, d, eps, gy_ref.data(), grstd_ref.data());
    EXPECT_EQ(gsum.Download(), sum);
    EXPECT_EQ(gy.Download(), gy_ref.Download());
    EXPECT_EQ(grstd.Download(), grstd_ref.Download());
    ExpectNear(gy.Download(), y, 1e-6, 1e-5, "fused y");
    ExpectNear(grstd.Download(), rstd, 0, 1e-5, "fused rstd");
    DeviceBuffer<float> gy2(nd), grstd2(n);
    AddRmsNormForward(ga.data(), gb.data(), ga.data(), ggain.data(), n, d, eps, gy2.data(),
                      grstd2.data());
    EXPECT_EQ(ga.Download(), sum);
    EXPECT_EQ(gy2.Download(), gy_ref.Download());
  }
}

TEST(CudaRmsNorm, GroupsOnStridedRowsMatchCpu) {
  MOELAB_REQUIRE_GPU();
  // QK-norm shape: 4 heads of 16 in rows of stride 80 (a slice of a fused projection).
  const int n = 50, groups = 4, d = 16, ld = 80;
  const auto x = Random(size_t(n) * ld, 9), gain = Random(d, 10, 0.5f, 1.5f),
             dy = Random(size_t(n) * ld, 11);
  std::vector<float> y(x.size(), 0.0f), rstd(size_t(n) * groups), dx(x.size(), 0.0f), dgain(d);
  cpu::RmsNormGroupsForward(x.data(), ld, y.data(), ld, n, groups, d, gain.data(), 1e-6,
                            rstd.data());
  cpu::RmsNormGroupsBackward(x.data(), ld, gain.data(), rstd.data(), dy.data(), ld, dx.data(), ld,
                             n, groups, d, dgain.data());
  auto gx = ToDevice(x), ggain = ToDevice(gain), gdy = ToDevice(dy);
  DeviceBuffer<float> gy(y.size()), grstd(rstd.size()), gdx(dx.size()), gdgain(d);
  gy.Zero();
  gdx.Zero();
  RmsNormGroupsForward(gx.data(), ld, gy.data(), ld, n, groups, d, ggain.data(), 1e-6,
                       grstd.data());
  RmsNormGroupsBackward(gx.data(), ld, ggain.data(), grstd.data(), gdy.data(), ld, gdx.data(), ld,
                        n, groups, d, gdgain.data());
  ExpectNear(gy.Download(), y, 1e-6, 1e-5, "groups y");
  ExpectNear(gdx.Download(), dx, 1e-5, 1e-4, "groups dx");
  ExpectNear(gdgain.Download(), dgain, 1e-4, 1e-4, "groups dgain");
}

TEST(CudaRope, ApplyAndInverseMatchCpu) {
  MOELAB_REQUIRE_GPU();
  const int seq = 12, n = 2 * seq, heads = 3, head_stride = 24, offset = 8, rot = 16;
  const int ld = heads * head_stride + 5;
  std::vector<float> cos(seq * rot / 2), sin(seq * rot / 2);
  cpu::RopeTables(seq, rot, 10000.0, cos.data(), sin.data());
  DeviceBuffer<float> gcos(cos.size()), gsin(sin.size());
  RopeTables(seq, rot, 10000.0, gcos.data(), gsin.data());
  EXPECT_EQ(gcos.Download(), cos);
  EXPECT_EQ(gsin.Download(), sin);
  for (bool inverse : {false, true}) {
    auto x = Random(size_t(n) * ld, 12);
    auto gx = ToDevice(x);
    cpu::RopeApply(x.data(), n, seq, ld, heads, head_stride, offset, rot, cos.data(), sin.data(),
                   inverse);
    RopeApply(gx.data(), n, seq, ld, heads, head_stride, offset, rot, gcos.data(), gsin.data(),
              inverse);
    // Same products and sums without FMA contraction: equal up to the last bit, allow 1 ulp.
    ExpectNear(gx.Download(), x, 1e-7, 2e-7, inverse ? "rope inverse" : "rope");
  }
}

// q's and k's heads in one launch (RopeApplyQk): the two single-slice launches bit for bit (each
// value is rotated by the same thread arithmetic), and the CPU twin within RopeApply's tolerance,
// on the model's GQA layout (q | k | v rows) and MLA's (q^R columns of qb, the shared rotary key
// of [c_kv | k^R]).
TEST(CudaRope, QkInOneLaunchEqualsTwoLaunchesAndMatchesCpu) {
  MOELAB_REQUIRE_GPU();
  const int seq = 12, n = 3 * seq;
  struct Layout {
    int rot, ldq, ldk;
    cpu::RopeSlice<float> q, k;
    bool same_buffer;
  };
  const Layout layouts[] = {
      {16, 128, 128, {nullptr, 128, 4, 16, 0}, {nullptr, 128, 2, 16, 64}, true},
      {4, 36, 14, {nullptr, 36, 3, 4, 24}, {nullptr, 14, 1, 4, 10}, false}};
  for (const Layout& L : layouts) {
    std::vector<float> cos(seq * L.rot / 2), sin(seq * L.rot / 2);
    cpu::RopeTables(seq, L.rot, 10000.0, cos.data(), sin.data());
    auto gcos = ToDevice(cos), gsin = ToDevice(sin);
    for (bool inverse : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "rot " << L.rot << (inverse ? " inverse" : ""));
      auto x = Random(size_t(n) * L.ldq, 24), y = Random(size_t(n) * L.ldk, 25);
      auto gx = ToDevice(x), gy = ToDevice(y), gx2 = ToDevice(x), gy2 = ToDevice(y);
      cpu::RopeSlice<float> q = L.q, k = L.k;
      q.x = x.data();
      k.x = L.same_buffer ? x.data() : y.data();
      cpu::RopeApplyQk(q, k, n, seq, L.rot, cos.data(), sin.data(), inverse);
      q.x = gx.data();
      k.x = L.same_buffer ? gx.data() : gy.data();
      cuda::RopeApplyQk(q, k, n, seq, L.rot, gcos.data(), gsin.data(), inverse);
      float* k2 = L.same_buffer ? gx2.data() : gy2.data();
      RopeApply(gx2.data(), n, seq, L.q.ld, L.q.heads, L.q.head_stride, L.q.offset, L.rot,
                gcos.data(), gsin.data(), inverse);
      RopeApply(k2, n, seq, L.k.ld, L.k.heads, L.k.head_stride, L.k.offset, L.rot, gcos.data(),
                gsin.data(), inverse);
      EXPECT_EQ(gx.Download(), gx2.Download());
      EXPECT_EQ(gy.Download(), gy2.Download());
      // The CPU twin may contract a·c − b·s into an FMA (GCC's default): ≤ 1 ulp apart.
      ExpectNear(gx.Download(), x, 1e-7, 2e-7, "rope qk");
      ExpectNear(gy.Download(), y, 1e-7, 2e-7, "rope qk (k)");
    }
  }
}

TEST(CudaSwiglu, ForwardBackwardMatchCpu) {
  MOELAB_REQUIRE_GPU();
  const int n = 33, d = 40, hidden = 72;
  const auto x = Random(size_t(n) * d, 13), w1 = Random(size_t(hidden) * d, 14, -0.3f, 0.3f),
             w3 = Random(size_t(hidden) * d, 15, -0.3f, 0.3f),
             w2 = Random(size_t(d) * hidden, 16, -0.3f, 0.3f), dy = Random(size_t(n) * d, 17);
  const size_t nh = size_t(n) * hidden;
  std::vector<float> h1(nh), h3(nh), act(nh), y(size_t(n) * d), dx(size_t(n) * d), dw1(w1.size()),
      dw3(w3.size()), dw2(w2.size()), scratch(2 * nh);
  cpu::SwigluForward(x.data(), n, d, hidden, w1.data(), w3.data(), w2.data(), h1.data(), h3.data(),
                     act.data(), y.data());
  cpu::SwigluBackward(x.data(), n, d, hidden, w1.data(), w3.data(), w2.data(), h1.data(), h3.data(),
                      act.data(), dy.data(), dx.data(), dw1.data(), dw3.data(), dw2.data(),
                      scratch.data());
  auto gx = ToDevice(x), gw1 = ToDevice(w1), gw3 = ToDevice(w3), gw2 = ToDevice(w2),
       gdy = ToDevice(dy);
  DeviceBuffer<float> gh1(nh), gh3(nh), gact(nh), gy(y.size()), gdx(dx.size()), gdw1(dw1.size()),
      gdw3(dw3.size()), gdw2(dw2.size()), gscratch(2 * nh);
  SwigluForward(gx.data(), n, d, hidden, gw1.data(), gw3.data(), gw2.data(), gh1.data(), gh3.data(),
                gact.data(), gy.data());
  SwigluBackward(gx.data(), n, d, hidden, gw1.data(), gw3.data(), gw2.data(), gh1.data(),
                 gh3.data(), gact.data(), gdy.data(), gdx.data(), gdw1.data(), gdw3.data(),
                 gdw2.data(), gscratch.data());
  // GEMM order and expf vs the CPU's polynomial exp: ~1e-6 relative, amplified by 3 GEMMs.
  ExpectNear(gact.Download(), act, 1e-5, 1e-4, "swiglu act");
  ExpectNear(gy.Download(), y, 1e-5, 1e-4, "swiglu y");
  ExpectNear(gdx.Download(), dx, 1e-5, 1e-4, "swiglu dx");
  ExpectNear(gdw1.Download(), dw1, 1e-5, 1e-4, "swiglu dw1");
  ExpectNear(gdw3.Download(), dw3, 1e-5, 1e-4, "swiglu dw3");
  ExpectNear(gdw2.Download(), dw2, 1e-5, 1e-4, "swiglu dw2");
}

// The bf16 mode's gated FFN (train.kernels.ffn "fused"): one gate-and-up GEMM when W3 follows W1
// (and dW3 follows dW1), two otherwise; bf16 intermediates, fp32 y, dx and weight gradients, with
// the accumulating forms. Against the fp32 CPU SwiGLU on bf16-representable inputs.
TEST(CudaGatedFfn, Bf16FusedGateAndUpMatchCpu) {
  MOELAB_REQUIRE_GPU();
  const int n = 37, d = 48, hidden = 40;
  const size_t ws = size_t(hidden) * d, nh = size_t(n) * hidden, nd = size_t(n) * d;
  auto bf16_values = [](std::vector<float> v) {
    for (float& x : v) x = __bfloat162float(__float2bfloat16(x));
    return v;
  };
  auto to_bf16 = [](const std::vector<float>& v) {
    std::vector<bf16> b(v.size());
    for (size_t i = 0; i < v.size(); ++i) b[i] = __float2bfloat16(v[i]);
    return ToDevice(b);
  };
  const auto x = bf16_values(Random(nd, 21)), dy = bf16_values(Random(nd, 22));
  const auto w13 = bf16_values(Random(2 * ws, 23, -0.3f, 0.3f));
  const auto w2 = bf16_values(Random(size_t(d) * hidden, 24, -0.3f, 0.3f));
  const std::vector<float> w1(w13.begin(), w13.begin() + ws), w3(w13.begin() + ws, w13.end());
  std::vector<float> h1(nh), h3(nh), act(nh), y(nd), dx(nd), dw1(ws), dw3(ws), dw2(ws),
      scratch(2 * nh);
  cpu::SwigluForward(x.data(), n, d, hidden, w1.data(), w3.data(), w2.data(), h1.data(), h3.data(),
                     act.data(), y.data());
  cpu::SwigluBackward(x.data(), n, d, hidden, w1.data(), w3.data(), w2.data(), h1.data(), h3.data(),
                      act.data(), dy.data(), dx.data(), dw1.data(), dw3.data(), dw2.data(),
                      scratch.data());
  auto gx = to_bf16(x), gdy = to_bf16(dy), gw13 = to_bf16(w13), gw2 = to_bf16(w2);
  // The same W3 elsewhere: not adjacent to W1, so the two-GEMM form runs.
  auto gw3_apart = to_bf16(w3);
  for (bool adjacent : {true, false}) {
    SCOPED_TRACE(adjacent ? "adjacent W1, W3" : "separate W1, W3");
    const bf16* gw1 = gw13.data();
    const bf16* gw3 = adjacent ? gw13.data() + ws : gw3_apart.data();
    DeviceBuffer<bf16> h13(2 * nh), gact(nh), dh13(2 * nh);
    DeviceBuffer<float> gy(nd), gdx(nd), gdw13(2 * ws), gdw3_apart(ws), gdw2(ws);
    Fill(gdw13.data(), 2 * ws, 7.0f);  // stale: the weight gradients are overwritten
    // y and dx accumulate onto 1 (accumulate = true) and are overwritten (false).
    for (bool accumulate : {false, true}) {
      Fill(gy.data(), nd, 1.0f);
      Fill(gdx.data(), nd, 1.0f);
      GatedFfnForwardBf16(gx.data(), n, d, hidden, gw1, gw3, gw2.data(), h13.data(), gact.data(),
                          gy.data(), accumulate);
      float* gdw3 = adjacent ? gdw13.data() + ws : gdw3_apart.data();
      GatedFfnBackwardBf16(gx.data(), gdy.data(), n, d, hidden, gw1, gw3, gw2.data(), h13.data(),
                           gact.data(), dh13.data(), gdx.data(), accumulate, gdw13.data(), gdw3,
                           gdw2.data());
      const float base = accumulate ? 1.0f : 0.0f;
      std::vector<float> want_y = y, want_dx = dx;
      for (float& v : want_y) v += base;
      for (float& v : want_dx) v += base;
      // bf16 h13, act and dact: ~2^-8 relative each, through two GEMMs.
      ExpectNear(gy.Download(), want_y, 3e-2, 3e-2, "y");
      ExpectNear(gdx.Download(), want_dx, 3e-2, 3e-2, "dx");
      const auto g13 = gdw13.Download();
      ExpectNear(std::vector<float>(g13.begin(), g13.begin() + ws), dw1, 5e-2, 3e-2, "dw1");
      ExpectNear(adjacent ? std::vector<float>(g13.begin() + ws, g13.end()) : gdw3_apart.Download(),
                 dw3, 5e-2, 3e-2, "dw3");
      ExpectNear(gdw2.Download(), dw2, 5e-2, 3e-2, "dw2");
    }
  }
}

TEST(CudaCrossEntropy, LossZLossAndGradientMatchCpu) {
  MOELAB_REQUIRE_GPU();
  const int n = 29, vocab = 1000;
  const double z = 1e-4;
  auto logits = Random(size_t(n) * vocab, 18, -4.0f, 4.0f);
  const auto targets = RandomTokens(n, vocab, 19);
  auto glogits = ToDevice(logits);
  auto gtargets = ToDevice(targets);
  std::vector<double> scratch(2 * n);
  const cpu::CrossEntropyResult want =
      cpu::CrossEntropy(logits.data(), targets.data(), n, vocab, z, true, scratch.data());
  DeviceBuffer<double> gscratch(2 * n + 2);
  const CrossEntropyResult got =
      CrossEntropy(glogits.data(), gtargets.data(), n, vocab, z, true, gscratch.data());
  // Per-row sums of exp in float (different order and exp): the loss agrees to ~1e-6 relative.
  EXPECT_NEAR(got.loss, want.loss, 2e-6 * want.loss);
  EXPECT_NEAR(got.z_loss, want.z_loss, 2e-6 * want.z_loss);
  ExpectNear(glogits.Download(), logits, 1e-8, 1e-4, "ce gradient");
  // Forward only leaves the logits alone.
  auto fresh = Random(size_t(n) * vocab, 20);
  auto gfresh = ToDevice(fresh);
  CrossEntropy(gfresh.data(), gtargets.data(), n, vocab, 0.0, false, gscratch.data());
  EXPECT_EQ(gfresh.Download(), fresh);
}

}  // namespace
}  // namespace moelab::cuda
