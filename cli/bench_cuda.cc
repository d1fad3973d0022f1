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

#include "kernels/cuda/device.h"
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
  using cuda::DeviceBuffer;
  const size_t elems = static_cast<size_t>(n) * n;
  std::vector<__nv_bfloat16> host(elems);
  for (size_t i = 0; i < elems; ++i)
    host[i] = __float2bfloat16(static_cast<float>((i * 7919) % 1000) / 1000.0f - 0.5f);
  DeviceBuffer<__nv_bfloat16> a(elems), b(elems), c(elems);
  a.Upload(host.data(), elems);
  b.Upload(host.data(), elems);
  const float one = 1.0f, zero = 0.0f;
  cublasHandle_t h = cuda::Cublas(nullptr);
  auto gemm = [&] {
    MOELAB_CUBLAS_CHECK(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, a.data(),
                                     CUDA_R_16BF, n, b.data(), CUDA_R_16BF, n, &zero, c.data(),
                                     CUDA_R_16BF, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  };
  gemm();  // warm: heuristics, clocks
  MOELAB_CUDA_CHECK(cudaDeviceSynchronize());
  double best = 1e30;
  cuda::EventTimer timer;
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
int CaseMicroBatch(const RunConfig& c, int micro_batch_option, double budget_bytes) {
  const int B = c.train.batch_size;
  if (micro_batch_option > 0) return std::min(micro_batch_option, B);
  for (int m = B; m >= 1; --m) {
    if (B % m == 0 && PlanCudaMemory(c, m, B).total() <= budget_bytes) return m;
  }
  return 1;
}

constexpr double kGiB = 1024.0 * 1024 * 1024;

// cudaMemGetInfo's total on the current device; 0 when no device is usable (or no CUDA build).
double DeviceTotalBytes() {
#if MOELAB_HAVE_CUDA
  if (!cuda::CudaAvailable()) return 0;
  size_t free_bytes = 0, total_bytes = 0;
  if (cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return static_cast<double>(total_bytes);
#else
  return 0;
#endif
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
  // The profiled pass (--profile-steps): its fwd+bwd per step, with the per-op-class events on.
  double profiled_fwd_bwd_ms = 0;
  int profiled_steps = 0;
  // Device memory in use after the timed steps (cudaMemGetInfo: total − free, the CUDA context
  // included): every buffer is a cudaMalloc that lives as long as the model and scratch only
  // grows, so this is the case's peak, to hold against the plan.
  double held_gib = 0;
  std::map<std::string, double> breakdown_ms;  // per op class, per step
};

CaseResult RunGpuCase(const GpuCase& gc, const CudaBenchOptions& o, double budget_bytes,
                      double gemm_rate) {
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
  (void)budget_bytes;
  (void)gemm_rate;
#else
  RequireCudaSupports(c, 1, 1);  // a kernel choice this build or shape cannot run: the reason
  const int B = c.train.batch_size, S = c.model.seq_len;
  RunConfig cm = c;
  cm.train.micro_batch = CaseMicroBatch(c, o.micro_batch, budget_bytes);
  r.micro_batch = cm.train.micro_batch;
  r.planned_gib = PlanCudaMemory(c, r.micro_batch, B).total() / kGiB;
  Model<float> model(cm);  // on the CUDA backend: the one model the trainer runs
  model.Init(c.train.seed);
  // The trainer's optimizer: Newton–Schulz in the run's precision.
  std::unique_ptr<Optimizer> opt =
      MakeOptimizer(c.optimizer, model.param_infos(), model.backend().optimizer_ops());
  opt->WriteWeightCopy(model.backend().weight_copy());
  const MicroBatchPlan micro = PlanMicroBatches(cm, B);
  GradAccumulator accumulator(model.backend(), model.num_params());
  std::vector<int32_t> tokens;
  StepStats stats;
  cuda::EventTimer t_fb, t_opt;
  // One training step on batch i; its forward+backward and optimizer seconds.
  auto step = [&](int i, double* s_fb, double* s_opt) {
    SyntheticTokens(c.train.seed, i, B, S, c.model.vocab_size, &tokens);
    t_fb.Start();
    ForwardBackwardMicroBatched(model, tokens.data(), S, micro, &stats, accumulator);
    t_fb.Stop();
    *s_fb = t_fb.Seconds();
    t_opt.Start();
    opt->Step(model.params(), model.grads(), c.optimizer.lr * 0.1, i + 1);
    model.ParamsChanged();
    t_opt.Stop();
    *s_opt = t_opt.Seconds();
  };
  // The headline: no profiler attached, so no event pairs between the ops.
  model.backend().set_profiler(nullptr);
  double fb = 0, op = 0;
  for (int i = 0; i < o.warmup + o.steps; ++i) {
    double s_fb = 0, s_opt = 0;
    step(i, &s_fb, &s_opt);
    if (i >= o.warmup) fb += s_fb, op += s_opt;
    if (i == 0) r.loss_first = stats.loss;
    r.loss_last = stats.loss;
  }
  r.ran = true;
  r.fwd_bwd_ms = 1e3 * fb / o.steps;
  r.opt_ms = 1e3 * op / o.steps;
  r.tokens_per_s = B * S / ((fb + op) / o.steps);
  r.flops_per_s = r.flops_per_token * r.tokens_per_s;
  r.utilisation = r.flops_per_s / gemm_rate;
  size_t free_bytes = 0, total_bytes = 0;
  if (cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess) {
    r.held_gib = static_cast<double>(total_bytes - free_bytes) / kGiB;
  }
  // The breakdown: further steps (later batches; the losses above are the timed steps') with the
  // per-op-class events on, and their own fwd+bwd (its difference to the headline's is what the
  // events cost).
  if (o.profile_steps > 0) {
    CudaOpProfiler profiler;
    model.backend().set_profiler(&profiler);
    double pfb = 0;
    for (int j = 0; j < o.profile_steps; ++j) {
      double s_fb = 0, s_opt = 0;
      step(o.warmup + o.steps + j, &s_fb, &s_opt);
      pfb += s_fb;
    }
    model.backend().set_profiler(nullptr);
    r.profiled_steps = o.profile_steps;
    r.profiled_fwd_bwd_ms = 1e3 * pfb / o.profile_steps;
    for (const auto& [k, v] : profiler.Totals()) r.breakdown_ms[k] = 1e3 * v / o.profile_steps;
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

namespace {

// The plan of every selected case against one budget; false when one does not fit it.
bool PrintPlans(const std::vector<std::string>& selected, const KernelChoices& kernels,
                int micro_batch_option, double budget_bytes, const std::string& budget_text) {
  bool all_fit = true;
  fmt::print(
      "Device memory plan per case (budget {:.1f} GiB{}; arithmetic from the config, no GPU "
      "needed)\n",
      budget_bytes / kGiB, budget_text);
  for (const GpuCase& gc : GpuCases(kernels)) {
    if (!Contains(selected, gc.name)) continue;
    const RunConfig& c = gc.config;
    const int B = c.train.batch_size;
    const DeviceMemoryPlan whole = PlanCudaMemory(c, B, B);
    const int m = CaseMicroBatch(c, micro_batch_option, budget_bytes);
    const DeviceMemoryPlan plan = PlanCudaMemory(c, m, B);
    const bool fits = plan.total() <= budget_bytes;
    all_fit = all_fit && fits;
    fmt::print("{:<20} unsplit (micro-batch {}): {:.1f} GiB\n{:<20} runs at: {}{}\n", gc.name, B,
               whole.total() / kGiB, "", plan.Describe(), fits ? "" : "  DOES NOT FIT");
  }
  return all_fit;
}

std::string ShareText(const std::string& of) {
  return fmt::format(" = {:.0f} % of {}", 100 * kDeviceMemoryShare, of);
}

}  // namespace

double BenchMemoryBudgetBytes(double override_gib, double device_total_bytes) {
  return override_gib > 0 ? override_gib * kGiB : kDeviceMemoryShare * device_total_bytes;
}

int GpuCaseMicroBatch(const std::string& name, double budget_bytes) {
  for (const GpuCase& gc : GpuCases()) {
    if (gc.name == name) return CaseMicroBatch(gc.config, 0, budget_bytes);
  }
  SelectCases(GpuCaseNames(), name);  // throws, naming the valid ones
  return 0;
}

std::vector<ReferenceCard> ReferenceCards() {
  // cudaMemGetInfo's totals as the lent cards report them (H100 SXM 80 GB HBM3: 85.0 GB; H200
  // 141 GB HBM3e: 150.1 GB), rounded down.
  return {{"H100 80GB", 79.1}, {"H200 141GB", 139.8}};
}

int PrintCudaBenchPlan(const CudaBenchOptions& o) {
  std::vector<std::string> selected;
  if (!SelectOrExplain(o.only, &selected)) return kExitConfig;
  KernelChoices kernels;
  if (!KernelsOrExplain(o.kernels, &kernels)) return kExitConfig;
  bool fit = true;
  const double device_total = o.memory_budget_gib > 0 ? 0 : DeviceTotalBytes();
  if (o.memory_budget_gib > 0) {
    fit = PrintPlans(selected, kernels, o.micro_batch,
                     BenchMemoryBudgetBytes(o.memory_budget_gib, 0), " from --memory-budget-gib");
  } else if (device_total > 0) {
    fit = PrintPlans(selected, kernels, o.micro_batch, BenchMemoryBudgetBytes(0, device_total),
                     ShareText(fmt::format("this device's {:.1f} GiB", device_total / kGiB)));
  } else {  // no GPU here: the cards the bench is run on
    for (const ReferenceCard& card : ReferenceCards()) {
      const double total = card.total_gib * kGiB;
      fit = PrintPlans(selected, kernels, o.micro_batch, BenchMemoryBudgetBytes(0, total),
                       ShareText(fmt::format("an {}'s {:.1f} GiB", card.name, card.total_gib))) &&
            fit;
    }
  }
  return fit ? 0 : kExitConfig;
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
  const double device_total = DeviceTotalBytes();
  const double budget = BenchMemoryBudgetBytes(o.memory_budget_gib, device_total);
  nlohmann::json out;
  out["device"] = dev.name;
  out["device_memory_gib"] = device_total / kGiB;
  out["memory_budget_gib"] = budget / kGiB;
  out["profile_steps"] = o.profile_steps;
  out["bf16_gemm_n"] = o.gemm_n;
  out["bf16_gemm_tflops"] = gemm / 1e12;
  out["kernels"] = KernelChoicesToJson(kernels);
  out["configs"] = nlohmann::json::array();
  if (!o.json) {
    fmt::print(
        "{} (sm_{}{}, {:.1f} GiB; memory budget {:.1f} GiB{})\ncuBLAS bf16 GEMM {}^3: {:.1f} "
        "TFLOP/s\nkernels: {}\n\n",
        dev.name, dev.sm_major, dev.sm_minor, device_total / kGiB, budget / kGiB,
        o.memory_budget_gib > 0 ? " from --memory-budget-gib" : ShareText("the total"), o.gemm_n,
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
        r = RunGpuCase(gc, o, budget, gemm);
      } catch (const std::exception& e) {  // e.g. out of memory
        r.name = gc.name;
        r.skipped = std::string("failed: ") + e.what();
#if MOELAB_HAVE_CUDA
        // The case's buffers are freed by now; clear the error so the next case starts clean.
        broken = cuda::RecoverAfterError();
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
      j["profiled_steps"] = r.profiled_steps;
      j["profiled_fwd_bwd_ms"] = r.profiled_fwd_bwd_ms;
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
    // The profiled pass: op classes, each followed by its sub-classes ("moe/experts": the layer's
    // phases), then what no bracket covers (elementwise adds, casts, the gradient accumulation)
    // of that pass's own fwd+bwd.
    if (r.profiled_steps > 0) {
      fmt::print(
          "    per op class over {} profiled steps (fwd+bwd {:.1f} ms with the events on):\n",
          r.profiled_steps, r.profiled_fwd_bwd_ms);
    }
    double bracketed = 0;
    for (const auto& [k, v] : r.breakdown_ms) {
      const size_t slash = k.rfind('/');
      if (slash == std::string::npos) bracketed += v;
      fmt::print("    {:<24} {:>9.2f} ms\n",
                 slash == std::string::npos ? k : "  " + k.substr(slash + 1), v);
    }
    if (!r.breakdown_ms.empty()) {
      fmt::print("    {:<24} {:>9.2f} ms\n", "(not bracketed)", r.profiled_fwd_bwd_ms - bracketed);
    }
    std::fflush(stdout);
  }
  if (o.json) {
    fmt::print("{}\n", out.dump(2));
  } else {
    fmt::print(
        "\nutil = analytic training FLOPs/s (3x forward, causal attention halved) / the bf16 GEMM "
        "rate above.\nBatch 32 x 1024 synthetic tokens, vocab 32768, bf16 compute with fp32 "
        "masters; optimizer AdamW unless named.\nTimings without per-op events; the breakdown "
        "from --profile-steps further steps with them.\n");
  }
  return 0;
}

}  // namespace moelab::cli
