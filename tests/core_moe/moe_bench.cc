// Times CpuMoeLayer<float> Forward+Backward at the "Speed" shapes for both expert-loop
// schedules, next to the SGEMM rate of this machine, so utilisation can be read off directly.
// Usage: core_moe_bench [iters] [both|expert|blas] (threads from OMP_NUM_THREADS).
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <string>
#include <vector>

#include "core/model/cpu_moe.h"
#include "kernels/cpu/gemm.h"
#include "tests/common/random_fill.h"
#include "tests/common/tiny_configs.h"

namespace moelab {

namespace {

using Clock = std::chrono::steady_clock;

double Ms(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

// Process CPU time in ms: on a shared, oversubscribed machine it stays close to what an
// undisturbed run would take (wall time does not), at the price of counting OpenMP spin-waits.
double CpuMs() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

std::vector<float> Random(size_t n, float stddev, uint64_t seed) {
  return test::RandomNormal<float>(n, stddev, seed);
}

struct Rate {
  double wall, cpu;  // GFLOP/s from the fastest wall time, and from the fastest CPU time/threads
};

double Min(const std::vector<double>& v) { return *std::min_element(v.begin(), v.end()); }

// C[m,n] = A[m,k]·B[n,k]ᵀ, the shape of a linear layer forward.
Rate GemmRate(int m, int n, int k, int iters) {
  auto a = Random(static_cast<size_t>(m) * k, 1, 1), b = Random(static_cast<size_t>(n) * k, 1, 2);
  std::vector<float> c(static_cast<size_t>(m) * n);
  cpu::LinearForward(a.data(), b.data(), m, k, n, c.data());
  std::vector<double> tw, tc;
  for (int i = 0; i < iters; ++i) {
    const double c0 = CpuMs();
    const auto t0 = Clock::now();
    cpu::LinearForward(a.data(), b.data(), m, k, n, c.data());
    tw.push_back(Ms(t0, Clock::now()));
    tc.push_back(CpuMs() - c0);
  }
  const double flop = 2.0 * m * n * k;
  return {flop / (Min(tw) * 1e6), flop * omp_get_max_threads() / (Min(tc) * 1e6)};
}

void Bench(int experts, bool expert_parallel, int iters, Rate sgemm) {
  const int n = 2048, d = 256, H = 256, k = 2, S = 1;
  ModelConfig model;
  model.d_model = d;
  MoEConfig moe;
  test::UseMoe(&moe, {.experts = experts, .top_k = k, .shared = S, .hidden = H});
  moe.balance = "aux_loss";
  const size_t E = experts, hd = static_cast<size_t>(H) * d;
  auto router = Random(E * d, 0.02f, 3), w1 = Random(E * hd, 0.02f, 4),
       w3 = Random(E * hd, 0.02f, 5), w2 = Random(E * hd, 0.02f, 6), s1 = Random(S * hd, 0.02f, 7),
       s3 = Random(S * hd, 0.02f, 8), s2 = Random(S * hd, 0.02f, 9);
  std::vector<float> g_router(E * d), g1(E * hd), g3(E * hd), g2(E * hd), gs1(S * hd), gs3(S * hd),
      gs2(S * hd);
  MoeWeights<float> w{router.data(), w1.data(), w3.data(), w2.data(),
                      s1.data(),     s3.data(), s2.data()};
  MoeWeights<float> g{g_router.data(), g1.data(),  g3.data(), g2.data(),
                      gs1.data(),      gs3.data(), gs2.data()};
  auto x = Random(static_cast<size_t>(n) * d, 1, 10),
       dy = Random(static_cast<size_t>(n) * d, 1, 11);
  std::vector<float> y(x.size()), dx(x.size()), bias(E, 0.f);
  std::vector<int64_t> counts(E);

  CpuMoeLayer<float> layer(model, moe);
  layer.cpu_experts().set_task_parallel(expert_parallel);
  std::vector<double> tf, tb, tc;
  for (int i = 0; i < iters + 2; ++i) {
    const double c0 = CpuMs();
    const auto t0 = Clock::now();
    layer.Forward(w, bias.data(), x.data(), n, y.data(), counts.data());
    const auto t1 = Clock::now();
    layer.Backward(w, g, x.data(), dy.data(), n, dx.data());
    const auto t2 = Clock::now();
    const double c1 = CpuMs();
    if (i >= 2) {  // the first calls allocate and warm the caches
      tf.push_back(Ms(t0, t1));
      tb.push_back(Ms(t1, t2));
      tc.push_back(c1 - c0);
    }
  }
  const int64_t max_count = *std::max_element(counts.begin(), counts.end());
  // GEMM FLOPs: per SwiGLU row 3 GEMMs of 2·d·H forward and 6 backward; routed rows n·k,
  // shared rows n·S; router 2·n·d·E forward, 4·n·d·E backward.
  const double fwd = 6.0 * n * (k + S) * d * H + 2.0 * n * d * E;
  const double bwd = 12.0 * n * (k + S) * d * H + 4.0 * n * d * E;
  // Minima over iterations: the machine is shared, and the fastest run is the least disturbed.
  const double f = Min(tf), b = Min(tb), c = Min(tc) / omp_get_max_threads();
  const double wall_rate = (fwd + bwd) / ((f + b) * 1e6), cpu_rate = (fwd + bwd) / (c * 1e6);
  std::printf(
      "E=%-3d %-15s wall: fwd %6.1f + bwd %6.1f = %6.1f ms, %5.1f GFLOP/s = %5.1f%% of SGEMM | "
      "cpu/threads: %6.1f ms, %5.1f GFLOP/s = %5.1f%% | %.2f GFLOP, max expert rows %lld "
      "(mean %d)\n",
      experts, expert_parallel ? "expert-parallel" : "blas-parallel", f, b, f + b, wall_rate,
      100.0 * wall_rate / sgemm.wall, c, cpu_rate, 100.0 * cpu_rate / sgemm.cpu, (fwd + bwd) * 1e-9,
      static_cast<long long>(max_count), n * k / experts);
}

}  // namespace
}  // namespace moelab

int main(int argc, char** argv) {
  const int iters = argc > 1 ? std::atoi(argv[1]) : 10;
  const std::string which = argc > 2 ? argv[2] : "both";
  std::printf("threads %d\n", omp_get_max_threads());
  const auto big = moelab::GemmRate(2048, 768, 256, iters);
  const auto mid = moelab::GemmRate(2048, 256, 256, iters);
  const auto small = moelab::GemmRate(128, 256, 256, iters * 10);
  std::printf(
      "SGEMM GFLOP/s (wall | cpu/threads): 2048x768x256 %.1f | %.1f, 2048x256x256 %.1f | %.1f, "
      "128x256x256 %.1f | %.1f\n",
      big.wall, big.cpu, mid.wall, mid.cpu, small.wall, small.cpu);
  // The reference is the best of the three shapes: on a shared machine a single one is noisy.
  const moelab::Rate ref{std::max({big.wall, mid.wall, small.wall}),
                         std::max({big.cpu, mid.cpu, small.cpu})};
  for (int e : {8, 32}) {
    if (which != "blas") moelab::Bench(e, true, iters, ref);
    if (which != "expert") moelab::Bench(e, false, iters, ref);
  }
  return 0;
}
