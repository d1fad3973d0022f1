// Newton–Schulz GEMM rate vs plain SGEMM, and one Muon step vs one AdamW step, on the shapes of
// the 6-layer dense bench config (d = 384, 6 heads, FFN 1536, vocab 512).
//
// NS rates are reported two ways (counters):
//   gemm_equiv_GFLOPs — 5·(4m²n + 2m³) per matrix, the FLOPs of the textbook three-GEMM
//                       iteration; the figure to compare with SGEMM (what the work is worth)
//   issued_GFLOPs     — 5·(m²n + m³ + 2m²n), what SYRK/SYMM actually execute
// Threads: MOELAB_BENCH_THREADS (default 2), set once for OpenMP and OpenBLAS.
// Timing: wall clock by default (the right measure on an idle machine); MOELAB_BENCH_CPU_TIME=1
// switches to process CPU time, which on a shared, oversubscribed machine still gives per-core
// rates at 1 thread (at more threads it also counts OpenMP spin-waiting).
#include <benchmark/benchmark.h>
#include <omp.h>

#include <algorithm>
#include <cstdlib>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "core/model/model.h"
#include "core/optim/adamw.h"
#include "core/optim/muon.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/newton_schulz.h"
#include "tests/common/param_list.h"

namespace {

using moelab::ParamInfo;
using moelab::ParamKind;
namespace cpu = moelab::cpu;

int BenchThreads() {
  static const int threads = [] {
    const char* env = std::getenv("MOELAB_BENCH_THREADS");
    const int t = env ? std::max(1, std::atoi(env)) : 2;
    omp_set_num_threads(t);
    return t;
  }();
  return threads;
}

void Timing(benchmark::internal::Benchmark* b) {
  const char* env = std::getenv("MOELAB_BENCH_CPU_TIME");
  if (env && std::atoi(env) != 0) {
    b->MeasureProcessCPUTime();
  } else {
    b->UseRealTime();
  }
}

std::vector<float> Random(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd;
  std::vector<float> v(n);
  for (float& x : v) x = nd(rng);
  return v;
}

// Args: rows, cols, batch, kernel (NsKernel), threading (NsThreading).
void BM_NewtonSchulz(benchmark::State& state) {
  BenchThreads();
  const int rows = state.range(0), cols = state.range(1), batch = state.range(2);
  cpu::NewtonSchulzOptions opt;
  opt.kernel = static_cast<cpu::NsKernel>(state.range(3));
  opt.threading = static_cast<cpu::NsThreading>(state.range(4));
  const size_t e = static_cast<size_t>(rows) * cols * batch;
  const std::vector<float> in = Random(e, 1);
  std::vector<float> out(e);
  cpu::NewtonSchulzWorkspace<float> ws;
  cpu::NewtonSchulz(in.data(), out.data(), batch, rows, cols, opt, &ws);  // warm workspace
  for (auto _ : state) {
    cpu::NewtonSchulz(in.data(), out.data(), batch, rows, cols, opt, &ws);
    benchmark::ClobberMemory();
  }
  const double it = static_cast<double>(state.iterations());
  state.counters["gemm_equiv_GFLOPs"] =
      benchmark::Counter(it * batch * cpu::NewtonSchulzGemmFlops(rows, cols, opt.steps) * 1e-9,
                         benchmark::Counter::kIsRate);
  const bool gram =
      opt.kernel == cpu::NsKernel::kGram && std::max(rows, cols) >= 2 * std::min(rows, cols);
  const double issued = opt.kernel == cpu::NsKernel::kGemm
                            ? cpu::NewtonSchulzGemmFlops(rows, cols, opt.steps)
                        : gram ? cpu::NewtonSchulzGramFlops(rows, cols, opt.steps)
                               : cpu::NewtonSchulzSyrkFlops(rows, cols, opt.steps);
  state.counters["issued_GFLOPs"] =
      benchmark::Counter(it * batch * issued * 1e-9, benchmark::Counter::kIsRate);
}

void NsArgs(benchmark::internal::Benchmark* b) {
  const int kSymm = static_cast<int>(cpu::NsKernel::kSyrkSymm);
  const int kFill = static_cast<int>(cpu::NsKernel::kSyrkFillGemm);
  const int kGemm = static_cast<int>(cpu::NsKernel::kGemm);
  const int kAuto = static_cast<int>(cpu::NsThreading::kAuto);
  const int kBatch = static_cast<int>(cpu::NsThreading::kBatch);
  const int kBlas = static_cast<int>(cpu::NsThreading::kBlas);
  // The banks Muon forms for the dense config: q,k,v,o of 6 layers; w1,w3; w2.
  for (auto [r, c, n] :
       {std::tuple{384, 384, 24}, std::tuple{1536, 384, 12}, std::tuple{384, 1536, 6}}) {
    for (int k : {kSymm, kFill, kGemm}) b->Args({r, c, n, k, kAuto});
    if (r != c) b->Args({r, c, n, static_cast<int>(cpu::NsKernel::kGram), kAuto});
    b->Args({r, c, n, kSymm, kBatch});
    b->Args({r, c, n, kSymm, kBlas});
  }
  // One matrix alone: only BLAS threading is possible.
  b->Args({384, 384, 1, kSymm, kAuto});
  b->Args({384, 1536, 1, kSymm, kAuto});
  b->ArgNames({"rows", "cols", "batch", "kernel", "threading"});
}
BENCHMARK(BM_NewtonSchulz)->Apply(NsArgs)->Apply(Timing)->Unit(benchmark::kMillisecond);

// Plain SGEMM C[m,n] = A[m,k]·B[k,n], threaded BLAS, the reference rate. Batch > 1 runs the
// batch like NS's batch mode (one matrix per thread) so both sides see the same parallelism.
void BM_Sgemm(benchmark::State& state) {
  BenchThreads();
  const int m = state.range(0), n = state.range(1), k = state.range(2), batch = state.range(3);
  const std::vector<float> a = Random(static_cast<size_t>(m) * k * batch, 2);
  const std::vector<float> bm = Random(static_cast<size_t>(k) * n * batch, 3);
  std::vector<float> c(static_cast<size_t>(m) * n * batch);
  auto run = [&] {
    if (batch == 1) {
      cpu::Gemm(false, false, m, n, k, 1.0f, a.data(), k, bm.data(), n, 0.0f, c.data(), n);
      return;
    }
#pragma omp parallel for schedule(static)
    for (int i = 0; i < batch; ++i) {
      cpu::Gemm(false, false, m, n, k, 1.0f, a.data() + static_cast<size_t>(i) * m * k, k,
                bm.data() + static_cast<size_t>(i) * k * n, n, 0.0f,
                c.data() + static_cast<size_t>(i) * m * n, n);
    }
  };
  run();
  for (auto _ : state) {
    run();
    benchmark::ClobberMemory();
  }
  state.counters["GFLOPs"] =
      benchmark::Counter(static_cast<double>(state.iterations()) * batch * 2.0 * m * n * k * 1e-9,
                         benchmark::Counter::kIsRate);
}
BENCHMARK(BM_Sgemm)
    ->Args({384, 384, 384, 1})
    ->Args({384, 384, 384, 24})
    ->Args({384, 1536, 384, 1})
    ->Args({384, 1536, 384, 12})
    ->Args({384, 384, 1536, 12})
    ->ArgNames({"m", "n", "k", "batch"})
    ->Apply(Timing)
    ->Unit(benchmark::kMillisecond);

// The 6-layer dense bench model's parameter list, laid out like the model's arena.
std::vector<ParamInfo> DenseBenchParams() {
  const int d = 384, vocab = 512, ffn = 1536, layers = 6;
  moelab::test::ParamList ps;
  ps.Add("embedding", ParamKind::kEmbedding, -1, vocab, d);
  for (int l = 0; l < layers; ++l) {
    const std::string pre = "layers." + std::to_string(l) + ".";
    ps.Add(pre + "attn_norm", ParamKind::kNorm, l, 1, d);
    ps.Add(pre + "attn.wq", ParamKind::kAttnQ, l, d, d);
    ps.Add(pre + "attn.wk", ParamKind::kAttnK, l, d, d);
    ps.Add(pre + "attn.wv", ParamKind::kAttnV, l, d, d);
    ps.Add(pre + "attn.wo", ParamKind::kAttnO, l, d, d);
    ps.Add(pre + "ffn_norm", ParamKind::kNorm, l, 1, d);
    ps.Add(pre + "ffn.w1", ParamKind::kFfn, l, ffn, d);
    ps.Add(pre + "ffn.w3", ParamKind::kFfn, l, ffn, d);
    ps.Add(pre + "ffn.w2", ParamKind::kFfn, l, d, ffn);
  }
  ps.Add("final_norm", ParamKind::kNorm, -1, 1, d);
  ps.Add("lm_head", ParamKind::kLmHead, -1, vocab, d);
  return ps.infos();
}

template <typename Opt, bool kGram = false>
void OptimizerStep(benchmark::State& state) {
  BenchThreads();
  const auto ps = DenseBenchParams();
  const size_t n = ps.back().offset + ps.back().size();
  moelab::OptimizerConfig c;
  std::vector<float> w = Random(n, 4), g = Random(n, 5);
  for (float& x : w) x *= 0.02f;
  Opt opt(c, ps);
  if constexpr (kGram) {
    cpu::NewtonSchulzOptions o = opt.ns_options();
    o.kernel = cpu::NsKernel::kGram;
    opt.set_ns_options(o);
  }
  int64_t step = 1;
  opt.Step(w.data(), g.data(), 1e-3, step++);
  for (auto _ : state) {
    opt.Step(w.data(), g.data(), 1e-3, step++);
    benchmark::ClobberMemory();
  }
  state.counters["params_M"] = static_cast<double>(n) * 1e-6;
}
BENCHMARK(OptimizerStep<moelab::AdamW>)
    ->Name("BM_AdamWStep_dense6")
    ->Apply(Timing)
    ->Unit(benchmark::kMillisecond);
BENCHMARK(OptimizerStep<moelab::Muon>)
    ->Name("BM_MuonStep_dense6")
    ->Apply(Timing)
    ->Unit(benchmark::kMillisecond);
BENCHMARK(OptimizerStep<moelab::Muon, true>)
    ->Name("BM_MuonStep_dense6_gram")
    ->Apply(Timing)
    ->Unit(benchmark::kMillisecond);

// One forward+backward of the same model at batch 8 × 256, the yardstick for the Muon step
// (target: Muon step ≤ 0.45 of this).
void BM_ForwardBackward_dense6(benchmark::State& state) {
  BenchThreads();
  moelab::RunConfig c;
  c.model.vocab_size = 512;
  c.model.d_model = 384;
  c.model.layers = 6;
  c.model.heads = 6;
  c.model.ffn_hidden = 1536;
  c.model.seq_len = 256;
  c.moe.experts_total = 0;
  const int batch = 8;
  moelab::Model<float> model(c);
  model.Init(1);
  std::mt19937_64 rng(6);
  std::vector<int32_t> tokens(static_cast<size_t>(batch) * (c.model.seq_len + 1));
  for (auto& t : tokens) t = static_cast<int32_t>(rng() % c.model.vocab_size);
  model.ForwardBackward(tokens.data(), batch, nullptr);
  for (auto _ : state) {
    benchmark::DoNotOptimize(model.ForwardBackward(tokens.data(), batch, nullptr));
  }
}
BENCHMARK(BM_ForwardBackward_dense6)->Apply(Timing)->Unit(benchmark::kMillisecond);

}  // namespace
