// Optimizer arithmetic on the device against core/optim (AdamW, Muon with Newton–Schulz) and
// QK-Clip's row scaling against core/optim/qk_clip (exact), plus the clip's defining property
// on device: after scaling, the same batch's max logit equals τ.
#include "kernels/cuda/optim.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/config.h"
#include "core/model/model.h"
#include "core/optim/adamw.h"
#include "core/optim/muon.h"
#include "core/optim/qk_clip_plan.h"
#include "kernels/cpu/newton_schulz.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/newton_schulz.h"
#include "tests/cuda_kernels/cuda_test_util.h"

namespace moelab::cuda {
namespace {

using testing::ExpectNear;
using testing::Random;
using testing::ToDevice;

ParamInfo Param(const std::string& name, ParamKind kind, int layer, size_t offset, int rows,
                int cols, int batch = 1) {
  ParamInfo p;
  p.name = name, p.kind = kind, p.layer = layer, p.offset = offset;
  p.rows = rows, p.cols = cols, p.batch = batch;
  return p;
}

TEST(CudaOptim, AdamWMatchesCpuOverSteps) {
  MOELAB_REQUIRE_GPU();
  OptimizerConfig cfg;
  cfg.lr = 1e-2;
  cfg.weight_decay = 0.1;
  // One decayed matrix and one norm gain (no decay).
  const std::vector<ParamInfo> params = {Param("w", ParamKind::kAttnQ, 0, 0, 8, 16),
                                         Param("g", ParamKind::kNorm, 0, 128, 1, 16)};
  const size_t total = 144;
  auto w = Random(total, 1);
  AdamW cpu_opt(cfg, params);
  auto gw = ToDevice(w);
  DeviceBuffer<float> gm(total), gv(total), gg(total);
  gm.Zero();
  gv.Zero();
  for (int64_t step = 1; step <= 3; ++step) {
    const auto g = Random(total, 10 + static_cast<uint32_t>(step));
    cpu_opt.Step(w.data(), g.data(), cfg.lr, step);
    gg.Upload(g);
    for (const ParamInfo& p : params) {
      const AdamWScalars s = MakeAdamWScalars(cfg.lr, cfg.beta1, cfg.beta2, cfg.eps,
                                              cfg.weight_decay, !ExcludedFromDecay(cfg, p), step);
      AdamWUpdate(gw.data() + p.offset, gg.data() + p.offset, gm.data() + p.offset,
                  gv.data() + p.offset, p.size(), s);
    }
  }
  // The CPU loop's operations in the same order without FMA: expected bit-equal; 1 ulp allowed.
  ExpectNear(gw.Download(), w, 1e-9, 2.5e-7, "adamw weights");
}

TEST(CudaOptim, FusedAdamWMatchesCpuAndWritesTheBf16Copy) {
  MOELAB_REQUIRE_GPU();
  OptimizerConfig cfg;
  cfg.lr = 1e-2;
  cfg.weight_decay = 0.1;
  // A decayed matrix, a norm gain (no decay) and a large embedding-like tensor (several blocks
  // per segment); a gap of 16 elements between the first two that nothing may touch.
  const std::vector<ParamInfo> params = {Param("w", ParamKind::kAttnQ, 0, 0, 8, 16),
                                         Param("g", ParamKind::kNorm, 0, 144, 1, 16),
                                         Param("e", ParamKind::kEmbedding, -1, 160, 300, 40)};
  const size_t total = 160 + 300 * 40;
  auto w = Random(total, 1);
  const auto w0 = w;
  AdamW cpu_opt(cfg, params);
  std::vector<AdamWSegment> segs;
  uint64_t state = 0, max_size = 0;
  for (const ParamInfo& p : params) {
    segs.push_back({p.offset, p.size(), state, ExcludedFromDecay(cfg, p) ? 0 : 1});
    state += p.size();
    max_size = std::max<uint64_t>(max_size, p.size());
  }
  auto gsegs = ToDevice(segs);
  auto gw = ToDevice(w);
  DeviceBuffer<float> gm(state), gv(state), gg(total);
  DeviceBuffer<bf16> gw16(total);
  gm.Zero();
  gv.Zero();
  gw16.Zero();
  for (int64_t step = 1; step <= 3; ++step) {
    auto g = Random(total, 10 + static_cast<uint32_t>(step));
    for (size_t i = 128; i < 144; ++i) g[i] = 0;  // the gap: no parameter there
    cpu_opt.Step(w.data(), g.data(), cfg.lr, step);
    gg.Upload(g);
    const AdamWScalars s =
        MakeAdamWScalars(cfg.lr, cfg.beta1, cfg.beta2, cfg.eps, cfg.weight_decay, true, step);
    AdamWFused(gsegs.data(), static_cast<int>(segs.size()), max_size, gw.data(), gg.data(),
               gm.data(), gv.data(), gw16.data(), s);
  }
  const auto got = gw.Download();
  ExpectNear(got, w, 1e-9, 2.5e-7, "fused adamw weights");
  for (size_t i = 128; i < 144; ++i) EXPECT_EQ(got[i], w0[i]) << "gap element " << i << " moved";
  // The copy is the rounding of the updated masters, element for element (gap: never written).
  const auto w16 = gw16.Download();
  for (size_t i = 0; i < total; ++i) {
    const float want = (i >= 128 && i < 144) ? 0.0f : __bfloat162float(__float2bfloat16(got[i]));
    ASSERT_EQ(__bfloat162float(w16[i]), want) << "bf16 copy at " << i;
  }
}

// Whole products (small m) and the symmetric tile path (min_tile 8: 2–4 tiles per side, and a
// bank at the default tile: 256 = 2 tiles of 128).
TEST(CudaNewtonSchulz, WideTallAndSquareBanksMatchCpu) {
  MOELAB_REQUIRE_GPU();
  struct Case {
    int rows, cols, min_tile;
  };
  for (auto [rows, cols, min_tile] :
       {Case{16, 40, kNsMinTile}, Case{40, 16, kNsMinTile}, Case{24, 24, kNsMinTile},
        Case{16, 40, 8}, Case{40, 16, 8}, Case{24, 24, 8}, Case{32, 72, 8}, Case{256, 320, 128},
        Case{320, 256, 128}}) {
    const int batch = 3;
    const size_t size = size_t(batch) * rows * cols;
    const auto in = Random(size, 20 + rows);
    std::vector<float> out(size);
    cpu::NewtonSchulzOptions opt;
    opt.kernel = cpu::NsKernel::kGemm;  // the same formulation as the GPU's
    cpu::NewtonSchulz(in.data(), out.data(), batch, rows, cols, opt);
    auto gin = ToDevice(in);
    DeviceBuffer<float> gout(size), ws(NewtonSchulzWorkspaceSize(batch, rows, cols));
    NewtonSchulz(gin.data(), gout.data(), batch, rows, cols, 5, ws.data(), nullptr, min_tile);
    const std::string what = "ns " + std::to_string(rows) + "x" + std::to_string(cols) +
                             " min_tile " + std::to_string(min_tile);
    // NS5 on a unit-norm input: GEMM rounding differences stay ~1e-6.
    ExpectNear(gout.Download(), out, 1e-5, 1e-4, what);
    // In place, as the optimizer calls it.
    NewtonSchulz(gin.data(), gin.data(), batch, rows, cols, 5, ws.data(), nullptr, min_tile);
    ExpectNear(gin.Download(), out, 1e-5, 1e-4, what + " in place");
    // bf16 bank: bf16 iterates, fp32 accumulation.
    std::vector<bf16> bin(size);
    for (size_t i = 0; i < size; ++i) bin[i] = __float2bfloat16(in[i]);
    auto gbin = ToDevice(bin);
    DeviceBuffer<bf16> gbout(size), bws(NewtonSchulzWorkspaceSize(batch, rows, cols));
    NewtonSchulz(gbin.data(), gbout.data(), batch, rows, cols, 5, bws.data(), nullptr, min_tile);
    DeviceBuffer<float> back(size);
    CastToFloat(gbout.data(), back.data(), size);
    ExpectNear(back.Download(), out, 3e-2, 5e-2, what + " bf16");
  }
}

TEST(CudaOptim, MuonStepMatchesCpu) {
  MOELAB_REQUIRE_GPU();
  OptimizerConfig cfg;
  cfg.name = "muon";
  cfg.lr = 2e-2;
  const int rows = 24, cols = 40;
  const std::vector<ParamInfo> params = {
      Param("layers.0.attn.wq", ParamKind::kAttnQ, 0, 0, rows, cols)};
  const size_t n = size_t(rows) * cols;
  auto w = Random(n, 30);
  Muon cpu_opt(cfg, params);
  cpu::NewtonSchulzOptions ns;
  ns.kernel = cpu::NsKernel::kGemm;
  cpu_opt.set_ns_options(ns);
  auto gw = ToDevice(w);
  DeviceBuffer<float> gm(n), gu(n), gg(n), ws(NewtonSchulzWorkspaceSize(1, rows, cols));
  gm.Zero();
  const float scale = static_cast<float>(MuonUpdateScale(cfg.muon_scale, rows, cols));
  for (int64_t step = 1; step <= 3; ++step) {
    const auto g = Random(n, 40 + static_cast<uint32_t>(step));
    cpu_opt.Step(w.data(), g.data(), cfg.lr, step);
    gg.Upload(g);
    MuonMomentum(gg.data(), gm.data(), gu.data(), n, static_cast<float>(cfg.muon_momentum),
                 cfg.muon_nesterov);
    NewtonSchulz(gu.data(), gu.data(), 1, rows, cols, cfg.muon_ns_steps, ws.data());
    MuonApply(gw.data(), gu.data(), n, static_cast<float>(1.0 - cfg.lr * cfg.weight_decay),
              static_cast<float>(cfg.lr * scale));
  }
  ExpectNear(gw.Download(), w, 1e-5, 1e-4, "muon weights");
}

TEST(CudaQkClip, ScaleRowsEqualsCpuClipExactly) {
  MOELAB_REQUIRE_GPU();
  RunConfig cfg;
  cfg.model.layers = 1;
  cfg.model.heads = 4;
  cfg.model.kv_heads = 0;  // MHA
  cfg.model.d_model = 32;
  cfg.model.head_dim = 8;
  cfg.optimizer.qk_clip_tau = 5.0;
  cfg.optimizer.qk_clip_alpha = 0.5;
  const int hd = 8, d = 32, heads = 4;
  const std::vector<ParamInfo> params = {
      Param("layers.0.attn.wq", ParamKind::kAttnQ, 0, 0, heads * hd, d),
      Param("layers.0.attn.wk", ParamKind::kAttnK, 0, size_t(heads) * hd * d, heads * hd, d)};
  auto arena = Random(2 * size_t(heads) * hd * d, 50);
  auto garena = ToDevice(arena);
  const std::vector<float> s_max = {3.0f, 7.5f, 5.0f, 12.0f};  // heads 1 and 3 exceed τ
  const QkClipPlan plan = PlanQkClip(cfg, params, s_max, 1);
  ApplyQkClipPlan(plan, arena.data());
  const std::vector<ClipEvent>& events = plan.events;
  ASSERT_EQ(events.size(), 2u);
  std::vector<RowScale> spans;
  for (int h = 0; h < heads; ++h) {
    if (!(s_max[h] > cfg.optimizer.qk_clip_tau)) continue;
    const double gamma = cfg.optimizer.qk_clip_tau / s_max[h];
    const double alpha = cfg.optimizer.qk_clip_alpha;
    spans.push_back({garena.data(), h * hd, hd, d, static_cast<float>(std::pow(gamma, alpha))});
    spans.push_back({garena.data() + params[1].offset, h * hd, hd, d,
                     static_cast<float>(std::pow(gamma, 1.0 - alpha))});
  }
  ScaleRows(spans);
  EXPECT_EQ(garena.Download(), arena);  // one multiply per element by the same float: exact
}

TEST(CudaQkClip, ClippedHeadsMaxLogitEqualsTau) {
  MOELAB_REQUIRE_GPU();
  // q = x·Wqᵀ, k = x·Wkᵀ on the device, S_max from the attention forward, clip, recompute.
  const int batch = 2, seq = 32, heads = 4, hd = 16, d = 64;
  const int rows = batch * seq;
  const double tau = 4.0;
  auto x = ToDevice(Random(size_t(rows) * d, 60));
  auto wq = ToDevice(Random(size_t(heads) * hd * d, 61, -0.6f, 0.6f));
  auto wk = ToDevice(Random(size_t(heads) * hd * d, 62, -0.6f, 0.6f));
  auto v = ToDevice(Random(size_t(rows) * heads * hd, 63));
  AttentionDims a;
  a.batch = batch, a.seq = seq, a.heads = heads, a.kv_heads = heads, a.qk_dim = hd, a.v_dim = hd;
  a.ldq = a.ldk = a.ldv = a.ldo = heads * hd;
  a.scale = 1.0 / std::sqrt(double(hd));
  DeviceBuffer<float> q(size_t(rows) * heads * hd), k(q.size()), out(q.size()),
      probs(size_t(batch) * heads * seq * seq), pmax(size_t(batch) * heads), smax(heads);
  auto s_max = [&] {
    LinearForward(x.data(), wq.data(), rows, d, heads * hd, q.data());
    LinearForward(x.data(), wk.data(), rows, d, heads * hd, k.data());
    AttentionForward(a, q.data(), k.data(), v.data(), probs.data(), static_cast<float*>(nullptr),
                     out.data(), pmax.data());
    AttentionMaxOverBatch(pmax.data(), batch, heads, smax.data());
    return smax.Download();
  };
  const auto before = s_max();
  std::vector<RowScale> spans;
  int clipped = 0;
  for (int h = 0; h < heads; ++h) {
    if (!(before[h] > tau)) continue;
    ++clipped;
    const double gamma = tau / before[h];
    spans.push_back({wq.data(), h * hd, hd, d, static_cast<float>(std::pow(gamma, 0.5))});
    spans.push_back({wk.data(), h * hd, hd, d, static_cast<float>(std::pow(gamma, 0.5))});
  }
  ASSERT_GT(clipped, 0) << "test inputs should push some head above tau";
  ScaleRows(spans);
  const auto after = s_max();
  for (int h = 0; h < heads; ++h) {
    if (before[h] > tau) {
      // Logits scale by γ^α·γ^(1−α) = γ up to the rounding of the scaled weights and GEMMs.
      EXPECT_NEAR(after[h], tau, 1e-5 * tau) << "head " << h;
    } else {
      EXPECT_EQ(after[h], before[h]) << "head " << h;
    }
  }
}

}  // namespace
}  // namespace moelab::cuda
