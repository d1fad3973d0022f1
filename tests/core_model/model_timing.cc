// Developer timing of Model<float>::ForwardBackward on the four `moelab bench` configs (not a
// test): ms per step, analytic FLOPs and utilisation against this process's SGEMM rate.
// Usage: core_model_timing [steps] [config index or -1 for all]
#include <omp.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "core/model/model.h"
#include "kernels/cpu/gemm.h"

using namespace moelab;

namespace {

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double SgemmRate() {
  const int m = 2048, n = 1024, k = 1024;
  std::vector<float> a(m * k, 0.01f), b(n * k, 0.02f), c(m * n);
  cpu::Gemm(false, true, m, n, k, 1.0f, a.data(), k, b.data(), k, 0.0f, c.data(), n);
  double best = 0;
  for (int r = 0; r < 5; ++r) {
    const double t0 = Now();
    cpu::Gemm(false, true, m, n, k, 1.0f, a.data(), k, b.data(), k, 0.0f, c.data(), n);
    best = std::max(best, 2.0 * m * n * k / (Now() - t0));
  }
  return best;
}

// Training FLOPs per token: 3 × forward, forward = 2 FLOPs per MAC of every matmul, causal
// attention (QKᵀ and P·V) counted as half of the S×S square.
double TrainFlopsPerToken(const RunConfig& c) {
  const ModelConfig& m = c.model;
  const double d = m.d_model, H = m.heads, G = m.kv_heads_effective(), hd = m.head_dim_effective();
  double macs = d * m.vocab_size;  // LM head
  for (int l = 0; l < m.layers; ++l) {
    macs += d * (H * hd + 2 * G * hd) + H * hd * d;  // qkv, o
    macs += 2 * H * hd * (m.seq_len / 2.0);          // scores + P·V, causal half
    if (c.moe.enabled() && l >= c.moe.dense_layers) {
      macs += d * c.moe.experts_total;
      macs += (c.moe.experts_active + c.moe.shared_experts) * 3.0 * d * c.moe.expert_hidden;
    } else {
      macs += 3.0 * d * m.ffn_hidden;
    }
  }
  return 3 * 2 * macs;
}

RunConfig Base() {
  RunConfig c;
  c.model.vocab_size = 512;
  c.model.seq_len = 256;
  c.model.init_std = 0.02;
  return c;
}

}  // namespace

int main(int argc, char** argv) {
  const int steps = argc > 1 ? std::atoi(argv[1]) : 5;
  const int which = argc > 2 ? std::atoi(argv[2]) : -1;
  std::vector<std::pair<std::string, RunConfig>> configs;
  {
    RunConfig c = Base();
    c.model.layers = 4, c.model.heads = 4, c.model.d_model = 256, c.model.ffn_hidden = 1024;
    configs.push_back({"dense 4L d256", c});
    c.model.layers = 6, c.model.heads = 6, c.model.d_model = 384, c.model.ffn_hidden = 1536;
    configs.push_back({"dense 6L d384", c});
    c = Base();
    c.model.layers = 4, c.model.heads = 4, c.model.d_model = 256;
    c.moe.experts_total = 8, c.moe.experts_active = 2, c.moe.expert_hidden = 256;
    c.moe.shared_experts = 1;
    configs.push_back({"moe 8e", c});
    c.moe.experts_total = 32;
    configs.push_back({"moe 32e", c});
  }
  const int batch = 8;
  const double rate = SgemmRate();
  std::printf("threads %d  SGEMM %.1f GFLOP/s\n", omp_get_max_threads(), rate / 1e9);
  for (size_t i = 0; i < configs.size(); ++i) {
    if (which >= 0 && which != static_cast<int>(i)) continue;
    const RunConfig& c = configs[i].second;
    Model<float> model(c);
    model.Init(1);
    std::mt19937_64 rng(1);
    std::vector<int32_t> tokens(batch * (c.model.seq_len + 1));
    for (auto& t : tokens) t = rng() % c.model.vocab_size;
    StepStats stats;
    model.ForwardBackward(tokens.data(), batch, &stats);  // warm-up (allocation)
    // Each step is paired with a reference SGEMM timed right after it, so utilisation is
    // measured against the GEMM rate of the same moment (this machine is shared).
    const int m = 2048, nn = 1024, k = 1024;
    std::vector<float> ga(m * k, 0.01f), gb(nn * k, 0.02f), gc(m * nn);
    std::vector<double> utils, times;
    for (int s = 0; s < steps; ++s) {
      const double t0 = Now();
      model.ForwardBackward(tokens.data(), batch, &stats);
      const double dt = Now() - t0;
      const double t1 = Now();
      cpu::Gemm(false, true, m, nn, k, 1.0f, ga.data(), k, gb.data(), k, 0.0f, gc.data(), nn);
      const double g = 2.0 * m * nn * k / (Now() - t1);
      const double flops = TrainFlopsPerToken(c) * batch * c.model.seq_len;
      utils.push_back(flops / dt / g);
      times.push_back(dt);
    }
    std::sort(utils.begin(), utils.end());
    std::sort(times.begin(), times.end());
    const double flops = TrainFlopsPerToken(c) * batch * c.model.seq_len;
    std::printf(
        "%-14s min %7.1f ms  median %7.1f ms  %.2f GFLOP/step  util median %5.1f %%  "
        "max %5.1f %%  loss %.4f\n",
        configs[i].first.c_str(), times[0] * 1e3, times[times.size() / 2] * 1e3, flops / 1e9,
        100 * utils[utils.size() / 2], 100 * utils.back(), stats.loss);
  }
}
