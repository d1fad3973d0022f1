// The device optimizer's kernels (kernels/cuda/optim_kernels.cuh) run on the CPU under
// tests/cuda_kernels/emulation/cuda_emulation.h: the fused AdamW and Muon's momentum and update
// are bit-equal to the CPU optimizers' equations (core/optim/adamw.cc, muon.cc) evaluated one
// IEEE operation at a time, and within a few ulps of the CPU optimizers themselves (GCC contracts
// some of their products and sums into FMAs: -ffp-contract=fast is its C++ default); the bf16
// weight copy they write is the round-to-nearest-even cast of the updated weight. What only a GPU
// can show (tests/cuda_kernels/optim_test.cc, tests/cuda_model/cuda_optimizer_test.cc): nvcc's
// code for the intrinsics, the launches, cuBLAS's Newton–Schulz.
// clang-format off
// The emulation first: it replaces the CUDA primitives the kernel header uses.
#include "tests/cuda_kernels/emulation/cuda_emulation.h"
#include "kernels/cuda/optim_kernels.cuh"
// clang-format on

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <random>
#include <vector>

#include "core/config.h"
#include "core/model/model.h"
#include "core/optim/adamw.h"
#include "core/optim/muon.h"
#include "kernels/cpu/newton_schulz.h"

namespace moelab::cuda::optim {
namespace {

ParamInfo Param(const std::string& name, ParamKind kind, size_t offset, int rows, int cols,
                int batch = 1) {
  ParamInfo p;
  p.name = name, p.kind = kind, p.layer = 0, p.offset = offset;
  p.rows = rows, p.cols = cols, p.batch = batch;
  return p;
}

std::vector<float> Random(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> x(n);
  for (float& v : x) v = normal(rng);
  return x;
}

uint32_t Bits(float x) {
  uint32_t b;
  std::memcpy(&b, &x, 4);
  return b;
}
uint16_t Bits(bf16 x) {
  uint16_t b;
  std::memcpy(&b, &x, 2);
  return b;
}
// Round to nearest even, from the bits (independent of cuda_bf16.h's conversion).
uint16_t RoundToBf16(float x) {
  const uint32_t b = Bits(x);
  return static_cast<uint16_t>((b + 0x7fffu + ((b >> 16) & 1u)) >> 16);
}

// max |a − b| ≤ rel · max |b|: the CPU optimizers' FMA contractions against rounded operations.
void ExpectCloseToCpu(const std::vector<float>& a, const std::vector<float>& b, double rel,
                      const char* what) {
  ASSERT_EQ(a.size(), b.size());
  double diff = 0, scale = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::fabs(static_cast<double>(a[i]) - b[i]));
    scale = std::max(scale, std::fabs(static_cast<double>(b[i])));
  }
  EXPECT_LE(diff, rel * scale) << what;
}

// Launch shape for the emulation: few threads and blocks, so the grid-stride loops wrap.
constexpr int kEmuThreads = 64;
constexpr unsigned kEmuBlocks = 2;

// A decayed matrix, a gap of 16 elements nothing may touch, a norm gain (no decay), and a
// tensor larger than the emulated grid.
const std::vector<ParamInfo> kAdamParams = {Param("w", ParamKind::kAttnQ, 0, 8, 16),
                                            Param("g", ParamKind::kNorm, 144, 1, 16),
                                            Param("e", ParamKind::kEmbedding, 160, 30, 17)};
constexpr size_t kAdamTotal = 160 + 30 * 17;

TEST(OptimEmulation, FusedAdamWIsTheCpuAdamWAndWritesTheRoundedCopy) {
  OptimizerConfig cfg;
  cfg.lr = 1e-2;
  cfg.weight_decay = 0.1;
  std::vector<float> w = Random(kAdamTotal, 1), cpu_w = w;
  AdamW cpu(cfg, kAdamParams);
  std::vector<AdamWSegment> segs;
  uint64_t state = 0;
  for (const ParamInfo& p : kAdamParams) {
    segs.push_back({p.offset, p.size(), state, ExcludedFromDecay(cfg, p) ? 0 : 1});
    state += p.size();
  }
  std::vector<float> m(state, 0.0f), v(state, 0.0f), ref_w = w, ref_m = m, ref_v = v;
  const bf16 sentinel = __float2bfloat16(12345.0f);
  std::vector<bf16> w16(kAdamTotal, sentinel);
  for (int64_t step = 1; step <= 3; ++step) {
    const std::vector<float> g = Random(kAdamTotal, 10 + static_cast<uint32_t>(step), 0.1f);
    cpu.Step(cpu_w.data(), g.data(), cfg.lr, step);
    const AdamWScalars s =
        MakeAdamWScalars(cfg.lr, cfg.beta1, cfg.beta2, cfg.eps, cfg.weight_decay, true, step);
    emu::Launch(dim3(kEmuBlocks, segs.size()), kEmuThreads, 0, [&] {
      AdamWFusedKernel(segs.data(), w.data(), g.data(), m.data(), v.data(), w16.data(), s);
    });
    // adamw.cc's loop, one rounded operation at a time.
    for (const AdamWSegment& seg : segs) {
      const float decay = seg.decay ? s.decay : 1.0f;
      for (size_t i = 0; i < seg.size; ++i) {
        float& wi = ref_w[seg.offset + i];
        float& mi = ref_m[seg.state_offset + i];
        float& vi = ref_v[seg.state_offset + i];
        const float gi = g[seg.offset + i];
        mi = __fadd_rn(__fmul_rn(s.b1, mi), __fmul_rn(1.0f - s.b1, gi));
        vi = __fadd_rn(__fmul_rn(s.b2, vi), __fmul_rn(__fmul_rn(1.0f - s.b2, gi), gi));
        const float denom = __fadd_rn(__fmul_rn(std::sqrt(vi), s.inv_sqrt_c2), s.eps);
        wi = __fsub_rn(__fmul_rn(wi, decay), __fdiv_rn(__fmul_rn(s.step_size, mi), denom));
      }
    }
  }
  for (size_t i = 0; i < kAdamTotal; ++i) {
    ASSERT_EQ(Bits(w[i]), Bits(ref_w[i])) << "weight " << i;
    const bool gap = i >= 128 && i < 144;
    ASSERT_EQ(Bits(w16[i]), gap ? Bits(sentinel) : RoundToBf16(w[i])) << "bf16 copy " << i;
  }
  const std::vector<StateBuffer> cs = cpu.state();
  for (size_t i = 0; i < state; ++i) {
    ASSERT_EQ(Bits(m[i]), Bits(ref_m[i])) << "m " << i;
    ASSERT_EQ(Bits(v[i]), Bits(ref_v[i])) << "v " << i;
  }
  ExpectCloseToCpu(w, cpu_w, 1e-6, "weights vs AdamW");
  ExpectCloseToCpu(m, *cs[0].data, 1e-6, "m vs AdamW");
  ExpectCloseToCpu(v, *cs[1].data, 1e-6, "v vs AdamW");
  // Without a copy (fp32 mode) the same fp32 update.
  std::vector<float> w2 = Random(kAdamTotal, 1), m2(state, 0.0f), v2(state, 0.0f);
  const std::vector<float> g = Random(kAdamTotal, 11, 0.1f);
  const AdamWScalars s =
      MakeAdamWScalars(cfg.lr, cfg.beta1, cfg.beta2, cfg.eps, cfg.weight_decay, true, 1);
  emu::Launch(dim3(kEmuBlocks, segs.size()), kEmuThreads, 0, [&] {
    AdamWFusedKernel(segs.data(), w2.data(), g.data(), m2.data(), v2.data(), nullptr, s);
  });
  std::vector<float> w3 = Random(kAdamTotal, 1), m3(state, 0.0f), v3(state, 0.0f);
  std::vector<bf16> unused(kAdamTotal);
  emu::Launch(dim3(kEmuBlocks, segs.size()), kEmuThreads, 0, [&] {
    AdamWFusedKernel(segs.data(), w3.data(), g.data(), m3.data(), v3.data(), unused.data(), s);
  });
  for (size_t i = 0; i < kAdamTotal; ++i) ASSERT_EQ(Bits(w2[i]), Bits(w3[i])) << i;
}

// The CPU Muon over its hidden matrices (two banks: two 8×12 matrices, a stack of 3 12×8),
// reproduced as CudaMuon launches it: the momentum kernel into an fp32 bank, the CPU's own
// Newton–Schulz on each bank, the update kernel writing the weights and their bf16 copy.
TEST(OptimEmulation, MuonMomentumAndUpdateAreTheCpuMuon) {
  for (const bool nesterov : {true, false}) {
    SCOPED_TRACE(nesterov ? "nesterov" : "plain momentum");
    OptimizerConfig cfg;
    cfg.name = "muon";
    cfg.lr = 2e-2;
    cfg.weight_decay = 0.1;
    cfg.muon_nesterov = nesterov;
    const std::vector<ParamInfo> params = {Param("a", ParamKind::kAttnQ, 0, 8, 12),
                                           Param("b", ParamKind::kAttnO, 96, 12, 8, 3),
                                           Param("c", ParamKind::kAttnK, 96 + 288, 8, 12)};
    const size_t total = 96 + 288 + 96;
    // The CPU Muon's layout: banks by shape in order of appearance, tensors in bank order.
    const std::vector<MuonSegment> segs = {
        {0, 96, 0, 0, static_cast<float>(MuonUpdateScale(cfg.muon_scale, 8, 12))},
        {96, 288, 96, 192, static_cast<float>(MuonUpdateScale(cfg.muon_scale, 12, 8))},
        {384, 96, 384, 96, static_cast<float>(MuonUpdateScale(cfg.muon_scale, 8, 12))}};
    struct BankShape {
      size_t offset;
      int batch, rows, cols;
    };
    const std::vector<BankShape> banks = {{0, 2, 8, 12}, {192, 3, 12, 8}};
    Muon cpu(cfg, params);
    std::vector<float> w = Random(total, 2), cpu_w = w, ref_w = w, mom(total, 0.0f), ref_mom = mom,
                       bank(total), ref_bank(total);
    std::vector<bf16> w16(total);
    cpu::NewtonSchulzOptions ns;
    ns.steps = cfg.muon_ns_steps;
    cpu::NewtonSchulzWorkspace<float> ws;
    for (int64_t step = 1; step <= 3; ++step) {
      const double lr = cfg.lr / step;
      const std::vector<float> g = Random(total, 20 + static_cast<uint32_t>(step), 0.1f);
      cpu.Step(cpu_w.data(), g.data(), lr, step);
      emu::Launch(dim3(kEmuBlocks, segs.size()), kEmuThreads, 0, [&] {
        MuonMomentumFusedKernel(segs.data(), g.data(), mom.data(), bank.data(),
                                static_cast<float>(cfg.muon_momentum), nesterov);
      });
      // muon.cc's loops, one rounded operation at a time.
      const float mu = static_cast<float>(cfg.muon_momentum);
      for (const MuonSegment& t : segs) {
        for (size_t i = 0; i < t.size; ++i) {
          const float gi = g[t.offset + i];
          float& mi = ref_mom[t.momentum_offset + i];
          mi = __fadd_rn(__fmul_rn(mu, mi), gi);
          ref_bank[t.bank_offset + i] = nesterov ? __fadd_rn(gi, __fmul_rn(mu, mi)) : mi;
        }
      }
      for (size_t i = 0; i < total; ++i) ASSERT_EQ(Bits(bank[i]), Bits(ref_bank[i])) << i;
      for (const BankShape& b : banks) {
        float* x = bank.data() + b.offset;
        cpu::NewtonSchulz(x, x, b.batch, b.rows, b.cols, ns, &ws);
      }
      const float decay = static_cast<float>(1.0 - lr * cfg.weight_decay);
      emu::Launch(dim3(kEmuBlocks, segs.size()), kEmuThreads, 0, [&] {
        MuonApplyFusedKernel(segs.data(), w.data(), bank.data(), lr, decay, w16.data());
      });
      for (const MuonSegment& t : segs) {
        const float step_size = static_cast<float>(lr * t.scale);
        for (size_t i = 0; i < t.size; ++i) {
          float& wi = ref_w[t.offset + i];
          wi = __fsub_rn(__fmul_rn(wi, decay), __fmul_rn(step_size, bank[t.bank_offset + i]));
        }
      }
    }
    const std::vector<float>& cpu_mom = *cpu.state()[0].data;
    for (size_t i = 0; i < total; ++i) {
      ASSERT_EQ(Bits(w[i]), Bits(ref_w[i])) << "weight " << i;
      ASSERT_EQ(Bits(mom[i]), Bits(ref_mom[i])) << "momentum " << i;
      ASSERT_EQ(Bits(w16[i]), RoundToBf16(w[i])) << "bf16 copy " << i;
    }
    ExpectCloseToCpu(mom, cpu_mom, 1e-6, "momentum vs Muon");
    // Newton–Schulz's quintic amplifies the banks' last-place differences.
    ExpectCloseToCpu(w, cpu_w, 1e-5, "weights vs Muon");
  }
}

// The bf16 bank (bf16 Newton–Schulz): the momentum kernel writes the rounding of the fp32 NS
// input, the update widens it back exactly.
TEST(OptimEmulation, MuonBf16BankIsTheRoundedFp32Bank) {
  const std::vector<MuonSegment> segs = {{0, 200, 0, 0, 1.5f}, {200, 56, 200, 200, 0.75f}};
  const size_t total = 256;
  const std::vector<float> g = Random(total, 3, 0.1f), m0 = Random(total, 4, 0.1f);
  std::vector<float> m32 = m0, m16 = m0, bank32(total);
  std::vector<bf16> bank16(total);
  for (const bool nesterov : {true, false}) {
    emu::Launch(dim3(kEmuBlocks, segs.size()), kEmuThreads, 0, [&] {
      MuonMomentumFusedKernel(segs.data(), g.data(), m32.data(), bank32.data(), 0.95f, nesterov);
    });
    emu::Launch(dim3(kEmuBlocks, segs.size()), kEmuThreads, 0, [&] {
      MuonMomentumFusedKernel(segs.data(), g.data(), m16.data(), bank16.data(), 0.95f, nesterov);
    });
    for (size_t i = 0; i < total; ++i) {
      ASSERT_EQ(Bits(m16[i]), Bits(m32[i])) << i;
      ASSERT_EQ(Bits(bank16[i]), RoundToBf16(bank32[i])) << i;
    }
  }
  std::vector<float> w = Random(total, 5), want = w;
  const double lr = 0.01;
  const float decay = 0.999f;
  for (const MuonSegment& t : segs) {
    const float step_size = static_cast<float>(lr * t.scale);
    for (size_t i = 0; i < t.size; ++i) {
      want[t.offset + i] =
          __fsub_rn(__fmul_rn(want[t.offset + i], decay),
                    __fmul_rn(step_size, __bfloat162float(bank16[t.bank_offset + i])));
    }
  }
  emu::Launch(dim3(kEmuBlocks, segs.size()), kEmuThreads, 0, [&] {
    MuonApplyFusedKernel(segs.data(), w.data(), bank16.data(), lr, decay, nullptr);
  });
  for (size_t i = 0; i < total; ++i) ASSERT_EQ(Bits(w[i]), Bits(want[i])) << i;
}

}  // namespace
}  // namespace moelab::cuda::optim
