#include "cli/bench_cuda.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <vector>

#include "core/config.h"
#include "core/cuda_profiler.h"
#include "core/device.h"
#include "core/flops.h"
#include "core/kernel_choices.h"
#include "core/model/backend.h"
#include "core/model/cuda_backend.h"
#include "core/model/model.h"
#include "core/optim/optimizer.h"
#include "core/train/micro_batch.h"
#include "core/train/trainer.h"

#if MOELAB_HAVE_CUDA
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include "core/cuda_util.h"
#endif

namespace moelab::cli {

namespace {

struct GpuCase {
  std::string name;
  RunConfig config;
};

// The reference shapes of issue 11: synthetic tokens, vocab 32768, sequence 1024, 32 sequences,
// on the given kernels.
std::vector<GpuCase> GpuCases(const KernelChoices& kernels = {}) {
  RunConfig base;
  base.train.kernels = kernels;
  base.model.vocab_size = 32768;
  base.model.seq_len = 1024;
  base.model.d_model = 1024;
  base.model.layers = 16;
  base.model.heads = 16;
  base.model.ffn_hidden = 2816;
  base.train.batch_size = 32;
  base.train.device = "cuda";
  base.train.precision = "bf16";
  base.optimizer.name = "adamw";
  std::vector<GpuCase> cases;
  cases.push_back({"gpu-dense", base});
  RunConfig moe = base;
  moe.moe.experts_total = 64;
  moe.moe.experts_active = 8;
  moe.moe.shared_experts = 1;
  moe.moe.expert_hidden = 512;
  moe.moe.dense_layers = 1;
  moe.moe.balance = "aux_free";
  cases.push_back({"gpu-moe", moe});
  RunConfig clip = base;
  clip.optimizer.name = "muonclip";
  clip.optimizer.qk_clip_tau = 100;
  cases.push_back({"gpu-dense-muonclip", clip});
  return cases;
}

// Uniform synthetic tokens (no data source: a Markov chain over 32768 tokens is too large).
void SyntheticTokens(uint64_t seed, int step, int batch, int seq, int vocab,
                     std::vector<int32_t>* out) {
  out->resize(static_cast<size_t>(batch) * (seq + 1));
  uint64_t x = seed * 0x9e3779b97f4a7c15ULL + static_cast<uint64_t>(step) + 1;
  for (int32_t& t : *out) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    t = static_cast<int32_t>(x % static_cast<uint64_t>(vocab));
  }
}

#if MOELAB_HAVE_CUDA
// Best of `reps` timed bf16 GEMMs n×n×n (bf16 in and out, fp32 accumulation), FLOP/s.
double MeasureBf16Gemm(int n, int reps) {
  using cudautil::DeviceBuffer;
  const size_t elems = static_cast<size_t>(n) * n;
  std::vector<__nv_bfloat16> host(elems);
  for (size_t i = 0; i < elems; ++i)
    host[i] = __float2bfloat16(static_cast<float>((i * 7919) % 1000) / 1000.0f - 0.5f);
  DeviceBuffer<__nv_bfloat16> a(elems), b(elems), c(elems);
  a.Upload(host.data(), elems);
  b.Upload(host.data(), elems);
  const float one = 1.0f, zero = 0.0f;
  cublasHandle_t h = cudautil::CublasHandle();
  auto gemm = [&] {
    MOELAB_CUDA(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, a.data(), CUDA_R_16BF, n,
                             b.data(), CUDA_R_16BF, n, &zero, c.data(), CUDA_R_16BF, n,
                             CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  };
  gemm();  // warm: heuristics, clocks
  MOELAB_CUDA(cudaDeviceSynchronize());
  double best = 1e30;
  cudautil::EventTimer timer;
  for (int r = 0; r < reps; ++r) {
    timer.Start();
    gemm();
    timer.Stop();
    best = std::min(best, timer.Seconds());
  }
  return 2.0 * n * static_cast<double>(n) * n / best;
}
#endif

// The micro-batch a case runs at: the option, or the largest divisor of the batch whose plan fits
// the budget (an even split keeps every forward/backward the same shape).
int CaseMicroBatch(const RunConfig& c, const CudaBenchOptions& o) {
  const int B = c.train.batch_size;
  if (o.micro_batch > 0) return std::min(o.micro_batch, B);
  const double budget = o.memory_budget_gib * 1024.0 * 1024 * 1024;
  for (int m = B; m >= 1; --m) {
    if (B % m == 0 && PlanCudaMemory(c, m, B).total() <= budget) return m;
  }
  return 1;
}

struct CaseResult {
  std::string name;
  bool ran = false;
  std::string skipped;  // why not, when !ran
  double fwd_bwd_ms = 0, opt_ms = 0, tokens_per_s = 0, flops_per_s = 0, utilisation = 0;
  double flops_per_token = 0;
  double loss_first = 0, loss_last = 0;  // the first and the last step's training loss
  int64_t params = 0, active = 0;
  int micro_batch = 0;
  double planned_gib = 0;
  // Device memory in use after the timed steps (cudaMemGetInfo: total − free, the CUDA context
  // included): every buffer is a cudaMalloc that lives as long as the model and scratch only
  // grows, so this is the case's peak, to hold against the plan.
  double held_gib = 0;
  std::map<std::string, double> breakdown_ms;  // per op class, per step
};

CaseResult RunGpuCase(const GpuCase& gc, const CudaBenchOptions& o, double gemm_rate) {
  const RunConfig& c = gc.config;
  CaseResult r;
  r.name = gc.name;
  r.flops_per_token = ForwardFlopsPerToken(c).training();
  const ParamCounts pc = CountParams(c);
  r.params = pc.total;
  r.active = pc.active;
#if !MOELAB_HAVE_CUDA
  r.skipped = "this moelab was built without CUDA";
  (void)o;
  (void)gemm_rate;
#else
  RequireCudaSupports(c, 1, 1);  // a kernel choice this build or shape cannot run: the reason
  const int B = c.train.batch_size, S = c.model.seq_len;
  RunConfig cm = c;
  cm.train.micro_batch = CaseMicroBatch(c, o);
  r.micro_batch = cm.train.micro_batch;
  r.planned_gib = PlanCudaMemory(c, r.micro_batch, B).total() / 1073741824.0;
  Model<float> model(cm);  // on the CUDA backend: the one model the trainer runs
  model.Init(c.train.seed);
  // The trainer's optimizer: Newton–Schulz in the run's precision.
  std::unique_ptr<Optimizer> opt =
      MakeOptimizer(c.optimizer, model.param_infos(), model.backend().optimizer_ops());
  opt->WriteWeightCopy(model.backend().weight_copy());
  const MicroBatchPlan micro = PlanMicroBatches(cm, B);
  GradAccumulator accumulator(model.backend(), model.num_params());
  CudaOpProfiler profiler;
  std::vector<int32_t> tokens;
  StepStats stats;
  double fb = 0, op = 0;
  cudautil::EventTimer t_fb, t_opt;
  for (int i = 0; i < o.warmup + o.steps; ++i) {
    SyntheticTokens(c.train.seed, i, B, S, c.model.vocab_size, &tokens);
    const bool timed = i >= o.warmup;
    model.backend().set_profiler(timed ? &profiler : nullptr);
    t_fb.Start();
    ForwardBackwardMicroBatched(model, tokens.data(), S, micro, &stats, accumulator);
    t_fb.Stop();
    const double s_fb = t_fb.Seconds();
    t_opt.Start();
    opt->Step(model.params(), model.grads(), c.optimizer.lr * 0.1, i + 1);
    model.ParamsChanged();
    t_opt.Stop();
    const double s_opt = t_opt.Seconds();
    if (timed) fb += s_fb, op += s_opt;
    if (i == 0) r.loss_first = stats.loss;
    r.loss_last = stats.loss;
  }
  r.ran = true;
  r.fwd_bwd_ms = 1e3 * fb / o.steps;
  r.opt_ms = 1e3 * op / o.steps;
  r.tokens_per_s = B * S / ((fb + op) / o.steps);
  r.flops_per_s = r.flops_per_token * r.tokens_per_s;
  r.utilisation = r.flops_per_s / gemm_rate;
  for (const auto& [k, v] : profiler.Totals()) r.breakdown_ms[k] = 1e3 * v / o.steps;
  size_t free_bytes = 0, total_bytes = 0;
  if (cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess) {
    r.held_gib = static_cast<double>(total_bytes - free_bytes) / 1073741824.0;
  }
#endif
  return r;
}

}  // namespace

std::vector<std::string> GpuCaseNames() {
  std::vector<std::string> names;
  for (const GpuCase& gc : GpuCases()) names.push_back(gc.name);
  return names;
}

std::vector<std::string> SelectCases(const std::vector<std::string>& all, const std::string& only) {
  if (only.empty()) return all;
  std::set<std::string> wanted;
  for (size_t at = 0; at <= only.size();) {  // every piece, the empty ones of "a,,b" or "a," too
    const size_t comma = std::min(only.find(',', at), only.size());
    const std::string name = only.substr(at, comma - at);
    at = comma + 1;
    if (std::find(all.begin(), all.end(), name) == all.end()) {
      std::string valid;
      for (const std::string& a : all) valid += (valid.empty() ? "" : ", ") + a;
      throw std::invalid_argument(fmt::format(
          "--only: no config named \"{}\" (exact names, comma-separated: {})", name, valid));
    }
    wanted.insert(name);
  }
  std::vector<std::string> out;
  for (const std::string& a : all) {
    if (wanted.count(a)) out.push_back(a);
  }
  return out;
}

namespace {

// The cases --only names into *selected; false (after saying why on stderr) for an unknown name.
bool SelectOrExplain(const std::string& only, std::vector<std::string>* selected) {
  try {
    *selected = SelectCases(GpuCaseNames(), only);
    return true;
  } catch (const std::invalid_argument& e) {
    fmt::print(stderr, "moelab bench: {}\n", e.what());
    return false;
  }
}

bool Contains(const std::vector<std::string>& names, const std::string& name) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

// --kernels into *out; false (after saying why on stderr) for a bad key or value.
bool KernelsOrExplain(const std::string& assignments, KernelChoices* out) {
  try {
    *out = ParseKernelAssignments(assignments, "--kernels");
    return true;
  } catch (const std::invalid_argument& e) {
    fmt::print(stderr, "moelab bench: {}\n", e.what());
    return false;
  }
}

std::string LossText(double loss) {
  return std::isfinite(loss) ? fmt::format("{:.4f}", loss) : "NaN";
}

}  // namespace

int PrintCudaBenchPlan(const CudaBenchOptions& o) {
  std::vector<std::string> selected;
  if (!SelectOrExplain(o.only, &selected)) return kExitConfig;
  KernelChoices kernels;
  if (!KernelsOrExplain(o.kernels, &kernels)) return kExitConfig;
  constexpr double kGiB = 1024.0 * 1024 * 1024;
  const double budget = o.memory_budget_gib * kGiB;
  int rc = 0;
  fmt::print(
      "Device memory plan per case (budget {:.0f} GiB; arithmetic from the config, no GPU "
      "needed)\n",
      o.memory_budget_gib);
  for (const GpuCase& gc : GpuCases(kernels)) {
    if (!Contains(selected, gc.name)) continue;
    const RunConfig& c = gc.config;
    const int B = c.train.batch_size;
    const DeviceMemoryPlan whole = PlanCudaMemory(c, B, B);
    const int m = CaseMicroBatch(c, o);
    const DeviceMemoryPlan plan = PlanCudaMemory(c, m, B);
    const bool fits = plan.total() <= budget;
    if (!fits) rc = kExitConfig;
    fmt::print("{:<20} unsplit (micro-batch {}): {:.1f} GiB\n{:<20} runs at: {}{}\n", gc.name, B,
               whole.total() / kGiB, "", plan.Describe(), fits ? "" : "  DOES NOT FIT");
  }
  return rc;
}

int RunCudaBench(const CudaBenchOptions& o) {
  // Before the device check: a misspelt name is an error on any machine.
  std::vector<std::string> selected;
  if (!SelectOrExplain(o.only, &selected)) return kExitConfig;
  KernelChoices kernels;
  if (!KernelsOrExplain(o.kernels, &kernels)) return kExitConfig;
  if (o.plan) return PrintCudaBenchPlan(o);
  TrainConfig t;
  t.device = "cuda";
  try {
    RequireDevice(t);
  } catch (const DeviceError& e) {
    fmt::print(stderr, "moelab bench: --device cuda: {}\n", e.what());
    return kExitConfig;
  }
  double gemm = 0;
#if MOELAB_HAVE_CUDA
  gemm = MeasureBf16Gemm(o.gemm_n, 5);
#endif
  const CudaDeviceInfo& dev = QueryCudaDevices();
  nlohmann::json out;
  out["device"] = dev.name;
  out["bf16_gemm_n"] = o.gemm_n;
  out["bf16_gemm_tflops"] = gemm / 1e12;
  out["kernels"] = KernelChoicesToJson(kernels);
  out["configs"] = nlohmann::json::array();
  if (!o.json) {
    fmt::print("{} (sm_{}{}, {:.0f} GiB)\ncuBLAS bf16 GEMM {}^3: {:.1f} TFLOP/s\nkernels: {}\n\n",
               dev.name, dev.sm_major, dev.sm_minor, dev.memory_bytes / 1073741824.0, o.gemm_n,
               gemm / 1e12, DescribeKernelChoices(kernels));
    fmt::print("{:<20} {:>11} {:>11} {:>5} {:>7} {:>7} {:>10} {:>9} {:>11} {:>9} {:>7} {:>17}\n",
               "config", "params", "active", "micro", "plan GB", "held GB", "fwd+bwd ms",
               "optim ms", "tokens/s", "TFLOP/s", "util", "loss first last");
  }
  std::string broken;  // a sticky CUDA error: no later case can run in this process
  for (const GpuCase& gc : GpuCases(kernels)) {
    if (!Contains(selected, gc.name)) continue;
    CaseResult r;
    if (!broken.empty()) {
      r.name = gc.name;
      r.skipped = "an earlier case left the CUDA context unusable (" + broken + ")";
    } else {
      try {
        r = RunGpuCase(gc, o, gemm);
      } catch (const std::exception& e) {  // e.g. out of memory
        r.name = gc.name;
        r.skipped = std::string("failed: ") + e.what();
#if MOELAB_HAVE_CUDA
        // The case's buffers are freed by now; clear the error so the next case starts clean.
        broken = cudautil::RecoverAfterError();
#endif
      }
    }
    nlohmann::json j = {{"name", r.name},
                        {"params", r.params},
                        {"params_active", r.active},
                        {"training_flops_per_token", r.flops_per_token},
                        {"ran", r.ran}};
    if (r.ran) {
      j["micro_batch"] = r.micro_batch;
      j["planned_memory_gib"] = r.planned_gib;
      j["held_memory_gib"] = r.held_gib;
      j["fwd_bwd_ms"] = r.fwd_bwd_ms;
      j["optimizer_ms"] = r.opt_ms;
      j["optimizer_over_fwd_bwd"] = r.opt_ms / r.fwd_bwd_ms;
      j["tokens_per_s"] = r.tokens_per_s;
      j["tflops"] = r.flops_per_s / 1e12;
      j["utilisation"] = r.utilisation;
      j["breakdown_ms"] = r.breakdown_ms;
      // NaN is not JSON: a non-finite loss is written as null.
      j["loss_first"] = std::isfinite(r.loss_first) ? nlohmann::json(r.loss_first) : nullptr;
      j["loss_last"] = std::isfinite(r.loss_last) ? nlohmann::json(r.loss_last) : nullptr;
    } else {
      j["skipped"] = r.skipped;
    }
    out["configs"].push_back(j);
    if (o.json) continue;
    if (!r.ran) {
      fmt::print("{:<20} {:>11} {:>11}  not run: {}\n", r.name, r.params, r.active, r.skipped);
      continue;
    }
    fmt::print(
        "{:<20} {:>11} {:>11} {:>5} {:>7.1f} {:>7.1f} {:>10.1f} {:>9.1f} {:>11.0f} {:>9.1f} "
        "{:>6.1f}% {:>8} {:>8}\n",
        r.name, r.params, r.active, r.micro_batch, r.planned_gib, r.held_gib, r.fwd_bwd_ms,
        r.opt_ms, r.tokens_per_s, r.flops_per_s / 1e12, 100 * r.utilisation, LossText(r.loss_first),
        LossText(r.loss_last));
    // Op classes, each followed by its sub-classes ("moe/experts": the layer's phases), then what
    // no bracket covers (elementwise adds, casts, the gradient accumulation).
    double bracketed = 0;
    for (const auto& [k, v] : r.breakdown_ms) {
      const size_t slash = k.rfind('/');
      if (slash == std::string::npos) bracketed += v;
      fmt::print("    {:<24} {:>9.2f} ms\n",
                 slash == std::string::npos ? k : "  " + k.substr(slash + 1), v);
    }
    if (!r.breakdown_ms.empty()) {
      fmt::print("    {:<24} {:>9.2f} ms\n", "(not bracketed)", r.fwd_bwd_ms - bracketed);
    }
    std::fflush(stdout);
  }
  if (o.json) {
    fmt::print("{}\n", out.dump(2));
  } else {
    fmt::print(
        "\nutil = analytic training FLOPs/s (3x forward, causal attention halved) / the bf16 GEMM "
        "rate above.\nBatch 32 x 1024 synthetic tokens, vocab 32768, bf16 compute with fp32 "
        "masters; optimizer AdamW unless named.\n");
  }
  return 0;
}

}  // namespace moelab::cli
