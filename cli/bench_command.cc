// `moelab bench [--json]`: this machine's SGEMM rate, then tokens/s and FLOP utilisation of the
// training step for the reference configs, measured in the same process.
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "core/config.h"
#include "core/data/data.h"
#include "core/flops.h"
#include "core/model/model.h"
#include "core/optim/optimizer.h"

namespace moelab::cli {

namespace {

using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Best-of-reps rate of a square SGEMM, the yardstick for FLOP utilisation.
double MeasureSgemm(int n, int reps) {
  std::vector<float> a(static_cast<size_t>(n) * n), b(a.size()), c(a.size());
  for (size_t i = 0; i < a.size(); ++i) {
    a[i] = static_cast<float>((i * 7919) % 1000) / 1000.0f - 0.5f;
    b[i] = static_cast<float>((i * 104729) % 1000) / 1000.0f - 0.5f;
  }
  double best = 1e30;
  for (int r = 0; r < reps + 1; ++r) {  // the first call warms caches and threads
    const auto t0 = Clock::now();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a.data(), n, b.data(),
                n, 0.0f, c.data(), n);
    if (r > 0) best = std::min(best, Since(t0));
  }
  return 2.0 * n * n * n / best;
}

struct BenchCase {
  std::string name;
  RunConfig config;
};

std::vector<BenchCase> ReferenceCases(int threads) {
  auto base = [threads](int layers, int heads, int d, int ffn) {
    RunConfig c;
    c.model.vocab_size = 512;
    c.model.layers = layers;
    c.model.heads = heads;
    c.model.d_model = d;
    c.model.ffn_hidden = ffn;
    c.model.seq_len = 256;
    c.train.batch_size = 8;
    c.train.threads = threads;
    c.data.source = "markov";
    c.optimizer.name = "adamw";
    return c;
  };
  std::vector<BenchCase> cases;
  cases.push_back({"dense-4L-d256", base(4, 4, 256, 1024)});
  cases.push_back({"dense-6L-d384", base(6, 6, 384, 1536)});
  for (int experts : {8, 32}) {
    RunConfig c = base(4, 4, 256, 1024);
    c.moe.experts_total = experts;
    c.moe.experts_active = 2;
    c.moe.shared_experts = 1;
    c.moe.expert_hidden = 256;
    c.moe.balance = "aux_loss";
    cases.push_back({fmt::format("moe-4L-d256-e{}", experts), c});
  }
  return cases;
}

struct BenchResult {
  std::string name;
  double step_ms = 0, fwd_bwd_ms = 0, opt_ms = 0, tokens_per_s = 0, flops_per_s = 0,
         utilisation = 0, flops_per_token = 0;
  int64_t params = 0, active = 0;
};

BenchResult RunCase(const BenchCase& bc, int warmup, int steps, double sgemm_rate) {
  const RunConfig& c = bc.config;
  ValidateConfig(c);
  std::unique_ptr<TokenSource> data = OpenTokenSource(c.data, c.model.vocab_size);
  Model<float> model(c);
  model.Init(c.train.seed);
  std::unique_ptr<Optimizer> opt = MakeOptimizer(c.optimizer, model.param_infos());
  const int B = c.train.batch_size, S = c.model.seq_len;
  std::vector<int32_t> tokens(static_cast<size_t>(B) * (S + 1));
  StepStats stats;
  double fwd_bwd = 0, optim = 0;
  for (int i = 0; i < warmup + steps; ++i) {
    data->TrainBatch(c.train.seed, i, 0, B, S, tokens.data());
    const auto t0 = Clock::now();
    model.ForwardBackward(tokens.data(), B, &stats);
    const double t_fb = Since(t0);
    const auto t1 = Clock::now();
    opt->Step(model.params(), model.grads(), c.optimizer.lr * 0.1, i + 1);
    const double t_opt = Since(t1);
    if (i >= warmup) fwd_bwd += t_fb, optim += t_opt;
  }
  BenchResult r;
  r.name = bc.name;
  r.fwd_bwd_ms = 1e3 * fwd_bwd / steps;
  r.opt_ms = 1e3 * optim / steps;
  r.step_ms = r.fwd_bwd_ms + r.opt_ms;
  r.tokens_per_s = B * S / (r.step_ms / 1e3);
  r.flops_per_token = ForwardFlopsPerToken(c).training();
  r.flops_per_s = r.flops_per_token * r.tokens_per_s;
  r.utilisation = r.flops_per_s / sgemm_rate;
  const ParamCounts pc = CountParams(c);
  r.params = pc.total;
  r.active = pc.active;
  return r;
}

}  // namespace

void AddBenchCommand(CLI::App& app) {
  struct Args {
    bool json = false;
    int steps = 10, warmup = 2, threads = 2, gemm_n = 2048;
    std::string only;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand(
      "bench", "Measure tokens/s and FLOP utilisation (vs this machine's SGEMM rate)");
  cmd->add_flag("--json", args->json, "JSON output");
  cmd->add_option("--steps", args->steps, "Timed steps per config")->capture_default_str();
  cmd->add_option("--warmup", args->warmup, "Untimed steps first")->capture_default_str();
  cmd->add_option("--threads", args->threads, "Threads")->capture_default_str();
  cmd->add_option("--gemm-n", args->gemm_n, "Size of the reference square SGEMM")
      ->capture_default_str();
  cmd->add_option("--only", args->only, "Run only configs whose name contains this");
  cmd->callback([args]() {
    omp_set_num_threads(args->threads);
    openblas_set_num_threads(args->threads);
    const double sgemm = MeasureSgemm(args->gemm_n, 3);
    if (!args->json) {
      fmt::print("SGEMM {}x{}x{} ({} threads): {:.1f} GFLOP/s\n\n", args->gemm_n, args->gemm_n,
                 args->gemm_n, args->threads, sgemm / 1e9);
      fmt::print("{:<16} {:>9} {:>9} {:>10} {:>9} {:>8} {:>11} {:>9} {:>7}\n", "config",
                 "params", "active", "fwd+bwd ms", "optim ms", "step ms", "tokens/s",
                 "GFLOP/s", "util");
    }
    nlohmann::json out;
    out["sgemm_gflops"] = sgemm / 1e9;
    out["threads"] = args->threads;
    out["configs"] = nlohmann::json::array();
    for (const BenchCase& bc : ReferenceCases(args->threads)) {
      if (!args->only.empty() && bc.name.find(args->only) == std::string::npos) continue;
      const BenchResult r = RunCase(bc, args->warmup, args->steps, sgemm);
      if (args->json) {
        out["configs"].push_back({{"name", r.name},
                                  {"params", r.params},
                                  {"params_active", r.active},
                                  {"fwd_bwd_ms", r.fwd_bwd_ms},
                                  {"optimizer_ms", r.opt_ms},
                                  {"step_ms", r.step_ms},
                                  {"tokens_per_s", r.tokens_per_s},
                                  {"training_flops_per_token", r.flops_per_token},
                                  {"gflops", r.flops_per_s / 1e9},
                                  {"utilisation", r.utilisation}});
      } else {
        fmt::print("{:<16} {:>9} {:>9} {:>10.1f} {:>9.1f} {:>8.1f} {:>11.0f} {:>9.1f} {:>6.1f}%\n",
                   r.name, r.params, r.active, r.fwd_bwd_ms, r.opt_ms, r.step_ms, r.tokens_per_s,
                   r.flops_per_s / 1e9, 100 * r.utilisation);
        std::fflush(stdout);
      }
    }
    if (args->json) {
      fmt::print("{}\n", out.dump(2));
    } else {
      fmt::print(
          "\nutil = analytic training FLOPs/s (3x forward, causal attention halved) / SGEMM rate.\n"
          "Batch 8 x 256 tokens, vocab 512, fp32, AdamW.\n");
    }
  });
}

}  // namespace moelab::cli
