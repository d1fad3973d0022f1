// `moelab bench [--json]`: this machine's SGEMM rate, then tokens/s and FLOP utilisation of the
// training step for the reference configs, measured in the same process.
#include <cblas.h>
#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <vector>

#include "cli/bench_cuda.h"
#include "cli/bench_distributed.h"
#include "cli/commands.h"
#include "core/config.h"
#include "core/data/data.h"
#include "core/flops.h"
#include "core/model/model.h"
#include "core/optim/optimizer.h"
#include "kernels/cpu/newton_schulz.h"

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
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a.data(), n, b.data(), n,
                0.0f, c.data(), n);
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

// The optimizer step alone on one config: AdamW vs Muon (both Newton–Schulz kernels), and the
// Newton–Schulz rate on the model's own matrix shapes.
struct OptimizerBench {
  double adamw_ms = 0, muon_ms = 0, muon_gram_ms = 0;
  double ns_gflops = 0;  // equivalent full-GEMM FLOPs (4m²n + 2m³ per iteration) per second
  double ns_issued_gflops = 0;  // FLOPs the SYRK/SYMM kernels actually issue, per second
};

OptimizerBench RunOptimizerBench(const RunConfig& base, int reps) {
  Model<float> model(base);
  model.Init(base.train.seed);
  std::unique_ptr<TokenSource> data = OpenTokenSource(base.data, base.model.vocab_size);
  std::vector<int32_t> tokens(static_cast<size_t>(base.train.batch_size) *
                              (base.model.seq_len + 1));
  data->TrainBatch(base.train.seed, 0, 0, base.train.batch_size, base.model.seq_len, tokens.data());
  model.ForwardBackward(tokens.data(), base.train.batch_size, nullptr);
  auto time_opt = [&](const std::string& name, const std::string& kernel) {
    OptimizerConfig oc = base.optimizer;
    oc.name = name;
    oc.muon_ns_kernel = kernel;
    std::unique_ptr<Optimizer> opt = MakeOptimizer(oc, model.param_infos());
    std::vector<float> params(model.params(), model.params() + model.num_params());
    opt->Step(params.data(), model.grads(), 1e-4, 1);  // allocates workspaces
    const auto t0 = Clock::now();
    for (int i = 0; i < reps; ++i) opt->Step(params.data(), model.grads(), 1e-4, i + 2);
    return 1e3 * Since(t0) / reps;
  };
  OptimizerBench r;
  r.adamw_ms = time_opt("adamw", "syrk");
  r.muon_ms = time_opt("muon", "syrk");
  r.muon_gram_ms = time_opt("muon", "gram");
  // Newton–Schulz alone, every hidden matrix of the model batched by shape.
  std::map<std::pair<int, int>, int> banks;
  for (const ParamInfo& p : model.param_infos())
    if (p.is_hidden_matrix()) banks[{p.rows, p.cols}] += p.batch;
  double gemm_flops = 0, issued = 0, seconds = 0;
  for (const auto& [shape, batch] : banks) {
    const auto [rows, cols] = shape;
    std::vector<float> x(static_cast<size_t>(batch) * rows * cols);
    for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>((i * 2654435761u) % 997) - 498;
    std::vector<float> out(x.size());
    cpu::NewtonSchulz(x.data(), out.data(), batch, rows, cols);  // warm
    const auto t0 = Clock::now();
    for (int i = 0; i < reps; ++i) cpu::NewtonSchulz(x.data(), out.data(), batch, rows, cols);
    seconds += Since(t0);
    gemm_flops +=
        reps * batch * cpu::NewtonSchulzGemmFlops(rows, cols, base.optimizer.muon_ns_steps);
    issued += reps * batch * cpu::NewtonSchulzSyrkFlops(rows, cols, base.optimizer.muon_ns_steps);
  }
  r.ns_gflops = gemm_flops / seconds / 1e9;
  r.ns_issued_gflops = issued / seconds / 1e9;
  return r;
}

}  // namespace

void AddBenchCommand(CLI::App& app) {
  struct Args {
    bool json = false;
    int steps = 10, warmup = 2, threads = 2, gemm_n = 2048;
    std::string only;
    std::string device = "cpu";  // cuda: cli/bench_cuda.cc (issue 11's shapes and yardstick)
    bool distributed = false, model_only = false;
    // The GPU-only flags (--plan, --micro-batch, ...) fill the options RunCudaBench takes.
    CudaBenchOptions cuda;
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
  cmd->add_option("--device", args->device,
                  "cpu, or cuda: bf16 GEMM rate and the gpu-dense/gpu-moe shapes (docs/cuda.md)")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->capture_default_str();
  cmd->add_flag("--plan", args->cuda.plan,
                "With --device cuda: print each shape's device memory plan and the micro-batch it "
                "runs at (no GPU needed), then exit");
  cmd->add_option("--micro-batch", args->cuda.micro_batch,
                  "With --device cuda: sequences per forward/backward (0 = the largest that fits "
                  "the memory budget)")
      ->capture_default_str();
  cmd->add_option("--memory-budget-gib", args->cuda.memory_budget_gib,
                  "With --device cuda: the memory the micro-batch is chosen against (0 = 97 % of "
                  "the device's total; --plan without a GPU: of an H100 80GB's and an H200's)")
      ->check(CLI::Range(0.0, 65536.0))
      ->capture_default_str();
  cmd->add_option("--profile-steps", args->cuda.profile_steps,
                  "With --device cuda: steps after the timed ones with per-op-class CUDA events, "
                  "for the breakdown (the timed steps run without them; 0 = no breakdown)")
      ->check(CLI::Range(0, 1000))
      ->capture_default_str();
  cmd->add_option("--kernels", args->cuda.kernels,
                  "With --device cuda: train.kernels for every shape, key=value[,key=value...] "
                  "(docs/cuda.md, Kernel choices; e.g. attention_kernel=mma,ffn=fused)");
  cmd->add_flag("--distributed", args->distributed,
                "1 rank x T threads vs T ranks x 1 thread (mpirun), with bytes per step "
                "(cli/bench_distributed.h)");
  cmd->add_flag("--comm-model", args->model_only,
                "With --distributed: print the analytic K2-like scaling table only");
  cmd->callback([args]() {
    if (!args->cuda.kernels.empty() && args->device != "cuda") {
      fmt::print(stderr, "moelab bench: --kernels: kernel choices need --device cuda\n");
      throw CLI::RuntimeError(2);  // a flag error, as the config errors
    }
    if (args->device == "cuda") {
      CudaBenchOptions o = args->cuda;
      o.json = args->json;
      o.steps = args->steps;
      o.warmup = args->warmup;
      o.only = args->only;
      if (args->gemm_n != 2048) o.gemm_n = args->gemm_n;  // default 8192 on the GPU
      const int rc = o.plan ? PrintCudaBenchPlan(o) : RunCudaBench(o);
      if (rc != 0) throw CLI::RuntimeError(rc);
      return;
    }
    if (args->distributed) {
      const int code = RunDistributedBench({.steps = args->steps,
                                            .warmup = args->warmup,
                                            .threads = args->threads,
                                            .only = args->only,
                                            .json = args->json,
                                            .model_only = args->model_only});
      if (code != 0) throw CLI::RuntimeError(code);
      return;
    }
    omp_set_num_threads(args->threads);
    openblas_set_num_threads(args->threads);
    const double sgemm = MeasureSgemm(args->gemm_n, 3);
    if (!args->json) {
      fmt::print("SGEMM {}x{}x{} ({} threads): {:.1f} GFLOP/s\n\n", args->gemm_n, args->gemm_n,
                 args->gemm_n, args->threads, sgemm / 1e9);
      fmt::print("{:<16} {:>9} {:>9} {:>10} {:>9} {:>8} {:>11} {:>9} {:>7}\n", "config", "params",
                 "active", "fwd+bwd ms", "optim ms", "step ms", "tokens/s", "GFLOP/s", "util");
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
    // The optimizer step alone on the 6-layer dense config (the MuonClip issue's yardstick).
    if (args->only.empty() || std::string("optimizer").find(args->only) != std::string::npos) {
      const BenchCase dense6 = ReferenceCases(args->threads)[1];
      const BenchResult fb = RunCase(dense6, 1, std::max(2, args->steps / 2), sgemm);
      const OptimizerBench ob = RunOptimizerBench(dense6.config, std::max(2, args->steps / 2));
      out["optimizer"] = {{"config", dense6.name},
                          {"fwd_bwd_ms", fb.fwd_bwd_ms},
                          {"adamw_ms", ob.adamw_ms},
                          {"muon_ms", ob.muon_ms},
                          {"muon_gram_ms", ob.muon_gram_ms},
                          {"muon_over_fwd_bwd", ob.muon_ms / fb.fwd_bwd_ms},
                          {"muon_gram_over_fwd_bwd", ob.muon_gram_ms / fb.fwd_bwd_ms},
                          {"ns_gemm_equivalent_gflops", ob.ns_gflops},
                          {"ns_issued_gflops", ob.ns_issued_gflops},
                          {"ns_over_sgemm", ob.ns_gflops * 1e9 / sgemm}};
      if (!args->json) {
        fmt::print(
            "\noptimizer step alone on {} (fwd+bwd {:.1f} ms):\n"
            "  AdamW {:.1f} ms | Muon {:.1f} ms ({:.2f} of fwd+bwd) | Muon, gram kernel {:.1f} ms "
            "({:.2f})\n"
            "  Newton-Schulz: {:.1f} GFLOP/s counted as full GEMMs = {:.0f}% of SGEMM "
            "({:.1f} GFLOP/s issued: SYRK/SYMM skip the redundant triangle)\n",
            dense6.name, fb.fwd_bwd_ms, ob.adamw_ms, ob.muon_ms, ob.muon_ms / fb.fwd_bwd_ms,
            ob.muon_gram_ms, ob.muon_gram_ms / fb.fwd_bwd_ms, ob.ns_gflops,
            100 * ob.ns_gflops * 1e9 / sgemm, ob.ns_issued_gflops);
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
