// Attention twin against kernels/cpu/attention: MHA, GQA and MLA shapes, soft-cap, strided
// (fused-QKV) layouts; S_max against the CPU's.
#include "kernels/cpu/attention.h"

#include <gtest/gtest.h>

#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cuda/attention.h"
#include "tests/cuda_kernels/cuda_test_util.h"

namespace moelab::cuda {
namespace {

using testing::ExpectNear;
using testing::Random;
using testing::ToDevice;

struct Case {
  std::string name;
  int batch, seq, heads, kv_heads, qk_dim, v_dim;
  double softcap;
  bool fused;  // q, k, v as column slices of one buffer
};

// fp32 GEMMs in different orders (cuBLAS vs OpenBLAS) and expf vs a polynomial exp.
constexpr double kAtol = 2e-5, kRtol = 2e-4;

void RunCase(const Case& c) {
  SCOPED_TRACE(c.name);
  AttentionDims a;
  a.batch = c.batch, a.seq = c.seq, a.heads = c.heads, a.kv_heads = c.kv_heads;
  a.qk_dim = c.qk_dim, a.v_dim = c.v_dim;
  a.scale = 1.0 / std::sqrt(double(c.qk_dim));
  a.softcap = c.softcap;
  const int qw = c.heads * c.qk_dim, kw = c.kv_heads * c.qk_dim, vw = c.kv_heads * c.v_dim;
  const int rows = c.batch * c.seq;
  // Fused: one [rows, qw + kw + vw] buffer; else three separate ones.
  const int ld_all = qw + kw + vw;
  a.ldq = c.fused ? ld_all : qw;
  a.ldk = c.fused ? ld_all : kw;
  a.ldv = c.fused ? ld_all : vw;
  a.ldo = c.heads * c.v_dim;
  // Large logits so the soft-cap bites and S_max is well above the typical value.
  const auto qkv = Random(size_t(rows) * ld_all, 1, -2.0f, 2.0f);
  std::vector<float> q, k, v;
  const float *pq, *pk, *pv;
  if (c.fused) {
    pq = qkv.data(), pk = qkv.data() + qw, pv = qkv.data() + qw + kw;
  } else {
    q = Random(size_t(rows) * qw, 2, -2.0f, 2.0f);
    k = Random(size_t(rows) * kw, 3, -2.0f, 2.0f);
    v = Random(size_t(rows) * vw, 4);
    pq = q.data(), pk = k.data(), pv = v.data();
  }
  const size_t pairs = size_t(c.batch) * c.heads, ss = size_t(c.seq) * c.seq;
  std::vector<float> probs(pairs * ss, 0.0f), capped(pairs * ss, 0.0f), out(size_t(rows) * a.ldo),
      pmax(pairs);
  cpu::AttentionForward(a, pq, pk, pv, probs.data(), capped.data(), out.data(), pmax.data());
  const auto dout = Random(out.size(), 5);
  // dq/dk/dv in the input layout (fused: one buffer).
  std::vector<float> dqkv(qkv.size(), 0.0f), dq(size_t(rows) * qw, 0.0f),
      dk(size_t(rows) * kw, 0.0f), dv(size_t(rows) * vw, 0.0f);
  float* cdq = c.fused ? dqkv.data() : dq.data();
  float* cdk = c.fused ? dqkv.data() + qw : dk.data();
  float* cdv = c.fused ? dqkv.data() + qw + kw : dv.data();
  std::vector<float> scratch(cpu::AttentionScratchSize(a, 256));
  cpu::AttentionBackward(a, pq, pk, pv, probs.data(), capped.data(), dout.data(), cdq, cdk, cdv,
                         scratch.data());

  // Device.
  DeviceBuffer<float> gqkv, gq, gk, gv;
  const float *dpq, *dpk, *dpv;
  if (c.fused) {
    gqkv.Upload(qkv);
    dpq = gqkv.data(), dpk = gqkv.data() + qw, dpv = gqkv.data() + qw + kw;
  } else {
    gq.Upload(q), gk.Upload(k), gv.Upload(v);
    dpq = gq.data(), dpk = gk.data(), dpv = gv.data();
  }
  DeviceBuffer<float> gprobs(pairs * ss), gcapped(pairs * ss), gout(out.size()), gpmax(pairs);
  AttentionForward(a, dpq, dpk, dpv, gprobs.data(), gcapped.data(), gout.data(), gpmax.data());
  ExpectNear(gout.Download(), out, kAtol, kRtol, "out");
  // S_max: the max of the raw scaled logits; equal up to the GEMMs' rounding (cuBLAS and
  // OpenBLAS sum the qk_dim products in different orders), so a few ulp.
  ExpectNear(gpmax.Download(), pmax, 0, 1e-6, "S_max per (batch, head)");
  // Causal probabilities (only j ≤ i are defined on the CPU side; the GPU writes 0 above).
  const auto gp = gprobs.Download();
  for (size_t pr = 0; pr < pairs; ++pr) {
    for (int i = 0; i < c.seq; ++i) {
      for (int j = 0; j < c.seq; ++j) {
        const size_t at = pr * ss + size_t(i) * c.seq + j;
        if (j > i) {
          ASSERT_EQ(gp[at], 0.0f) << "masked prob " << pr << " " << i << " " << j;
        } else {
          ASSERT_NEAR(gp[at], probs[at], kAtol + kRtol * probs[at]) << pr << " " << i << " " << j;
        }
      }
    }
  }
  // Head maxima over the batch.
  DeviceBuffer<float> ghead(c.heads);
  AttentionMaxOverBatch(gpmax.data(), c.batch, c.heads, ghead.data());
  std::vector<float> head(c.heads, -INFINITY);
  for (int b = 0; b < c.batch; ++b)
    for (int h = 0; h < c.heads; ++h) head[h] = std::max(head[h], pmax[size_t(b) * c.heads + h]);
  ExpectNear(ghead.Download(), head, 0, 1e-6, "S_max per head");

  auto gdout = ToDevice(dout);
  DeviceBuffer<float> gdqkv, gdq, gdk, gdv, gscratch(AttentionScratchSize(a));
  float *ddq, *ddk, *ddv;
  if (c.fused) {
    gdqkv.Resize(qkv.size());
    gdqkv.Zero();
    ddq = gdqkv.data(), ddk = gdqkv.data() + qw, ddv = gdqkv.data() + qw + kw;
  } else {
    gdq.Resize(dq.size()), gdk.Resize(dk.size()), gdv.Resize(dv.size());
    ddq = gdq.data(), ddk = gdk.data(), ddv = gdv.data();
  }
  AttentionBackward(a, dpq, dpk, dpv, gprobs.data(), gcapped.data(), gdout.data(), ddq, ddk, ddv,
                    gscratch.data());
  if (c.fused) {
    ExpectNear(gdqkv.Download(), dqkv, kAtol, kRtol, "dqkv");
  } else {
    ExpectNear(gdq.Download(), dq, kAtol, kRtol, "dq");
    ExpectNear(gdk.Download(), dk, kAtol, kRtol, "dk");
    ExpectNear(gdv.Download(), dv, kAtol, kRtol, "dv");
  }

  // bf16 mode: bf16 q, k, v, dout against the fp32 CPU results. Inputs rounded to 8 mantissa
  // bits move logits of magnitude ~5 by ~1e-2, probabilities and outputs by a few 1e-2.
  constexpr double kBf16Atol = 6e-2, kBf16Rtol = 6e-2;
  // Gradients go through the softmax backward once more: twice the slack (a wrong layout or
  // head mapping still gives O(1) errors).
  constexpr double kBf16GradTol = 1.2e-1;
  auto to_bf16 = [](const float* src, size_t count) {
    std::vector<bf16> out(count);
    for (size_t i = 0; i < count; ++i) out[i] = __float2bfloat16(src[i]);
    return out;
  };
  DeviceBuffer<bf16> bqkv, bq, bk, bv;
  const bf16 *bpq, *bpk, *bpv;
  if (c.fused) {
    bqkv.Upload(to_bf16(qkv.data(), qkv.size()));
    bpq = bqkv.data(), bpk = bqkv.data() + qw, bpv = bqkv.data() + qw + kw;
  } else {
    bq.Upload(to_bf16(q.data(), q.size()));
    bk.Upload(to_bf16(k.data(), k.size()));
    bv.Upload(to_bf16(v.data(), v.size()));
    bpq = bq.data(), bpk = bk.data(), bpv = bv.data();
  }
  DeviceBuffer<bf16> bprobs(pairs * ss), bout(out.size()), bscratch(AttentionScratchSize(a));
  auto bdout = ToDevice(to_bf16(dout.data(), dout.size()));
  AttentionForwardBf16(a, bpq, bpk, bpv, gprobs.data(), bprobs.data(), gcapped.data(), bout.data(),
                       gpmax.data());
  DeviceBuffer<float> fout(out.size());
  CastToFloat(bout.data(), fout.data(), out.size());
  ExpectNear(fout.Download(), out, kBf16Atol, kBf16Rtol, "bf16 out");
  ExpectNear(gpmax.Download(), pmax, 0, 1e-2, "bf16 S_max");
  if (c.fused) {
    gdqkv.Zero();
  }
  AttentionBackwardBf16(a, bpq, bpk, bpv, gprobs.data(), bprobs.data(), gcapped.data(),
                        bdout.data(), ddq, ddk, ddv, gscratch.data(), bscratch.data());
  if (c.fused) {
    ExpectNear(gdqkv.Download(), dqkv, kBf16GradTol, kBf16GradTol, "bf16 dqkv");
  } else {
    ExpectNear(gdq.Download(), dq, kBf16GradTol, kBf16GradTol, "bf16 dq");
    ExpectNear(gdk.Download(), dk, kBf16GradTol, kBf16GradTol, "bf16 dk");
    ExpectNear(gdv.Download(), dv, kBf16GradTol, kBf16GradTol, "bf16 dv");
  }
}

TEST(CudaAttention, BadShapesAreRejectedBeforeAnyDeviceWork) {
  // Runs without a GPU: the checks come before the first CUDA call.
  AttentionDims a;
  a.batch = 1, a.seq = 8, a.heads = 6, a.kv_heads = 4, a.qk_dim = 8, a.v_dim = 8;
  a.ldq = a.ldo = 48;
  a.ldk = a.ldv = 32;
  float* none = nullptr;
  EXPECT_THROW(AttentionForward(a, none, none, none, none, none, none, none),
               std::invalid_argument);  // 6 heads over 4 kv heads
  a.kv_heads = 3, a.ldk = a.ldv = 24;
  a.ldq = 40;  // narrower than heads·qk_dim
  EXPECT_THROW(AttentionBackward(a, none, none, none, none, none, none, none, none, none, none),
               std::invalid_argument);
}

TEST(CudaAttention, MhaCausal) {
  MOELAB_REQUIRE_GPU();
  RunCase({"mha", 2, 33, 4, 4, 16, 16, 0.0, false});
}

TEST(CudaAttention, GqaCausalFused) {
  MOELAB_REQUIRE_GPU();
  RunCase({"gqa", 2, 40, 6, 2, 16, 16, 0.0, true});
}

TEST(CudaAttention, MlaShapeQkWiderThanV) {
  MOELAB_REQUIRE_GPU();
  // MLA after up-projection: qk = nope + rope = 24, v = 16, every head its own kv head.
  RunCase({"mla", 2, 31, 3, 3, 24, 16, 0.0, false});
}

TEST(CudaAttention, SoftCapKeepsRawSmax) {
  MOELAB_REQUIRE_GPU();
  RunCase({"softcap", 1, 48, 4, 2, 16, 8, 2.0, false});
}

TEST(CudaAttention, RepeatedRunsAreBitIdentical) {
  MOELAB_REQUIRE_GPU();
  // Same inputs, same GPU: forward, S_max and backward must not change in the last bit (no
  // float atomics other than the exact max; fixed cuBLAS configuration).
  AttentionDims a;
  a.batch = 2, a.seq = 64, a.heads = 4, a.kv_heads = 2, a.qk_dim = 32, a.v_dim = 32;
  a.ldq = a.ldo = 4 * 32;
  a.ldk = a.ldv = 2 * 32;
  a.scale = 1.0 / std::sqrt(32.0);
  a.softcap = 10.0;
  const int rows = a.batch * a.seq;
  auto q = ToDevice(Random(size_t(rows) * a.ldq, 1)), k = ToDevice(Random(size_t(rows) * a.ldk, 2)),
       v = ToDevice(Random(size_t(rows) * a.ldv, 3)),
       dout = ToDevice(Random(size_t(rows) * a.ldo, 4));
  const size_t pp = size_t(a.batch) * a.heads * a.seq * a.seq;
  std::vector<std::vector<float>> runs;
  for (int run = 0; run < 2; ++run) {
    DeviceBuffer<float> probs(pp), capped(pp), out(size_t(rows) * a.ldo), pmax(a.batch * a.heads),
        dq(size_t(rows) * a.ldq), dk(size_t(rows) * a.ldk), dv(size_t(rows) * a.ldv),
        scratch(AttentionScratchSize(a));
    AttentionForward(a, q.data(), k.data(), v.data(), probs.data(), capped.data(), out.data(),
                     pmax.data());
    AttentionBackward(a, q.data(), k.data(), v.data(), probs.data(), capped.data(), dout.data(),
                      dq.data(), dk.data(), dv.data(), scratch.data());
    std::vector<float> all;
    for (const DeviceBuffer<float>* b : {&out, &pmax, &dq, &dk, &dv}) {
      const auto h = b->Download();
      all.insert(all.end(), h.begin(), h.end());
    }
    runs.push_back(std::move(all));
  }
  EXPECT_EQ(runs[0], runs[1]);
}

}  // namespace
}  // namespace moelab::cuda
