// Runs on every machine: train.device / train.precision in the config and its hash, and the
// clear error (exit 2, before any run row) for device "cuda" where no GPU is usable.
#include "core/device.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "core/config.h"
#include "core/comm/nccl_communicator.h"
#include "core/metrics.h"
#include "core/model/cuda_backend.h"
#if MOELAB_HAVE_CUDA
#include "core/model/cuda_moe.h"
#include "kernels/cuda/cudnn_grouped_matmul.h"
#include "kernels/cuda/moe_routing.h"
#endif
#include "core/train/trainer.h"
#include "tests/common/errors.h"
#include "tests/common/test_util.h"
#include "tests/common/tiny_configs.h"

namespace moelab {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// `moelab config check` of {} at 525c243 (main before train.device existed).
constexpr const char* kPreDeviceDefaultHash =
    "c4221220c57a491d9957359f6f761e7fc893b63ffa4dcf343944e4c2575ebe3f";

TEST(DeviceConfig, DefaultsAreCpuAndAutoPrecision) {
  const RunConfig c = ConfigFromJson(json::object());
  EXPECT_EQ(c.train.device, "cpu");
  EXPECT_EQ(c.train.precision, "auto");
  EXPECT_EQ(c.train.effective_precision(), "fp32");
  RunConfig g = ConfigFromJson({{"train", {{"device", "cuda"}}}});
  EXPECT_EQ(g.train.effective_precision(), "bf16");
  g = ConfigFromJson({{"train", {{"device", "cuda"}, {"precision", "fp32"}}}});
  EXPECT_EQ(g.train.effective_precision(), "fp32");
}

TEST(DeviceConfig, RejectsUnknownValuesAndBf16OnCpu) {
  EXPECT_THROW(ConfigFromJson({{"train", {{"device", "tpu"}}}}), ConfigError);
  EXPECT_THROW(ConfigFromJson({{"train", {{"precision", "fp16"}}}}), ConfigError);
  try {
    ConfigFromJson({{"train", {{"precision", "bf16"}}}});
    FAIL() << "bf16 on cpu accepted";
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.path(), "train.precision");
  }
}

// The hash of every config written before these fields existed must not change: it names
// checkpoint folders and dedupes sweep runs. The literal is the hash of the all-defaults config
// computed on main before train.device/train.precision were added.
TEST(DeviceConfig, HashOfExistingConfigsUnchanged) {
  const RunConfig defaults = ConfigFromJson(json::object());
  EXPECT_EQ(ConfigHash(defaults), kPreDeviceDefaultHash);
  // The canonical form without the new fields is what ConfigHash hashed before they existed.
  json j = ConfigToJson(defaults);
  for (const char* k : {"threads", "device", "precision", "micro_batch", "kernels"}) {
    j["train"].erase(k);  // kernels: recorded, never hashed (core/kernel_choices.h)
  }
  j["checkpoint"] = json::object();        // every checkpoint field is unhashed
  j.erase("dist");                         // as are the dist fields (ConfigHash drops the section)
  j["optimizer"].erase("adamw_lr");        // unset adamw_lr is left out of the hash (issue 13)
  j["optimizer"]["muon_nesterov"] = true;  // AdamW configs hash with the old Muon default
  j["moe"]["balance"] = "aux_loss";  // dense configs hash with the old balance default (issue 23)
  EXPECT_EQ(ConfigHash(defaults), Sha256Hex(CanonicalJson(j)));
  const RunConfig explicit_defaults =
      ConfigFromJson({{"train", {{"device", "cpu"}, {"precision", "auto"}}}});
  const RunConfig fp32_cuda =
      ConfigFromJson({{"train", {{"device", "cuda"}, {"precision", "fp32"}}}});
  EXPECT_EQ(ConfigHash(defaults), ConfigHash(explicit_defaults));
  EXPECT_EQ(ConfigHash(defaults), ConfigHash(fp32_cuda));  // the same experiment on either device
  const RunConfig bf16 = ConfigFromJson({{"train", {{"device", "cuda"}}}});
  EXPECT_NE(ConfigHash(defaults), ConfigHash(bf16));  // bf16 is a different trajectory
  EXPECT_EQ(BranchHash(bf16),
            BranchHash(ConfigFromJson({{"train", {{"device", "cuda"}, {"precision", "bf16"}}}})));
}

TEST(Device, QueryNeverThrowsAndExplainsAbsence) {
  const CudaDeviceInfo& info = QueryCudaDevices();
  if (info.count == 0) {
    EXPECT_FALSE(info.reason.empty());
    EXPECT_EQ(CudaSkipReason(), info.reason);
  } else {
    EXPECT_TRUE(info.reason.empty());
    EXPECT_GE(info.sm_major, 8);
  }
  TrainConfig cpu;
  EXPECT_NO_THROW(RequireDevice(cpu));
}

class NoGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    if (QueryCudaDevices().count > 0) GTEST_SKIP() << "a CUDA device is usable here";
  }
};

TEST_F(NoGpu, RequireDeviceThrowsWithTheReason) {
  TrainConfig t;
  t.device = "cuda";
  try {
    RequireDevice(t);
    FAIL() << "no exception";
  } catch (const DeviceError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(QueryCudaDevices().reason), std::string::npos) << msg;
    EXPECT_NE(msg.find("\"cpu\""), std::string::npos) << msg;
  }
}

struct EndSink : NullSink {
  RunStatus status = RunStatus::kRunning;
  std::string error;
  int steps = 0;
  void OnStep(const StepRecord&, const StepStats&) override { ++steps; }
  void OnEnd(RunStatus s, const std::string& e) override {
    status = s;
    error = e;
  }
};

TEST_F(NoGpu, TrainFailsBeforeTheFirstStep) {
  RunConfig c = ConfigFromJson({{"train", {{"device", "cuda"}, {"steps", 2}}},
                                {"data", {{"source", "markov"}}},
                                {"schedule", {{"warmup_steps", 0}}}});
  EndSink sink;
  TrainOptions o;
  o.progress = false;
  o.checkpoint_dir = (fs::temp_directory_path() / "moelab_cuda_device_test").string();
  const TrainResult r = Train(c, &sink, o);
  EXPECT_EQ(r.status, RunStatus::kFailed);
  EXPECT_EQ(sink.status, RunStatus::kFailed);
  EXPECT_EQ(sink.steps, 0);
  EXPECT_NE(r.error.find("train.device"), std::string::npos) << r.error;
  EXPECT_FALSE(fs::exists(o.checkpoint_dir));
}

std::string Bin() {
  const char* dir = std::getenv("MOELAB_BIN_DIR");
  return std::string(dir ? dir : MOELAB_BIN_DIR_DEFAULT) + "/moelab";
}

int RunShell(const std::string& cmd) {
  const int status = std::system(cmd.c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

std::string Slurp(const fs::path& p) {
  std::ifstream in(p);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// `moelab train` with device cuda on a machine without a GPU: exit 2 (config error), a message
// naming train.device and the reason, and no database or checkpoint written.
TEST_F(NoGpu, TrainCommandExitsWithConfigError) {
  const fs::path dir = fs::temp_directory_path() / ("moelab_cuda_cli_" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  {
    std::ofstream cfg(dir / "gpu.json");
    cfg << json({{"train", {{"device", "cuda"}, {"steps", 2}}},
                 {"data", {{"source", "markov"}}},
                 {"schedule", {{"warmup_steps", 0}}},
                 {"checkpoint", {{"dir", (dir / "runs").string()}}}})
               .dump();
  }
  const std::string log = (dir / "log.txt").string();
  const int rc = RunShell(Bin() + " train " + (dir / "gpu.json").string() + " --db " +
                          (dir / "x.db").string() + " --no-progress > " + log + " 2>&1");
  const std::string out = Slurp(log);
  EXPECT_EQ(rc, 2) << out;
  EXPECT_NE(out.find("config error: train.device"), std::string::npos) << out;
  EXPECT_NE(out.find(QueryCudaDevices().reason), std::string::npos) << out;
  EXPECT_FALSE(fs::exists(dir / "x.db"));
  EXPECT_FALSE(fs::exists(dir / "runs"));
  fs::remove_all(dir);
}

// `moelab bench --device cuda` without a GPU: exit 2 with the reason, no benchmark output.
TEST_F(NoGpu, BenchCommandExitsWithConfigError) {
  const std::string log =
      (fs::temp_directory_path() / ("moelab_cuda_bench_" + std::to_string(getpid()) + ".txt"))
          .string();
  const int rc = RunShell(Bin() + " bench --device cuda > " + log + " 2>&1");
  const std::string out = Slurp(log);
  EXPECT_EQ(rc, 2) << out;
  EXPECT_NE(out.find("--device cuda"), std::string::npos) << out;
  EXPECT_NE(out.find(QueryCudaDevices().reason), std::string::npos) << out;
  EXPECT_EQ(out.find("GFLOP/s"), std::string::npos) << out;
  fs::remove(log);
}

// What the CUDA backend cannot run yet is a config error naming the JSON path, decided from the
// config alone (so it runs here): expert parallelism, and the Switch aux loss over several ranks
// or micro-batches; ZeRO-1 and plain data parallelism pass; a CPU config is never refused.
// Expert parallelism, ZeRO-1 and every balance mode run on CUDA (issue 22): what is left to
// refuse is an odd d_model with bf16 expert parallelism (rows travel as 4-byte words).
// The kernel choices are the config's (train.kernels), checked before the run: every opt-in
// choice passes on a shape they cover, attention "fused" on a shape the fused kernels cannot run
// is refused naming train.kernels.attention, and the MOELAB_* variables that used to choose the
// kernels are no longer read (no GPU needed).
TEST(CudaSupports, KernelChoicesComeFromTheConfigNotTheEnvironment) {
#if !MOELAB_HAVE_CUDA
  GTEST_SKIP() << "built without CUDA (the kernel choices are part of the CUDA backend)";
#else
  RunConfig c;
  c.train.device = "cuda";
  for (const char* var :
       {"MOELAB_ATTENTION", "MOELAB_FLASH_KERNEL", "MOELAB_FLASH_ROPE", "MOELAB_ATTENTION_ACTS",
        "MOELAB_MOE_EXPERTS", "MOELAB_MOE_DISPATCH", "MOELAB_FFN"}) {
    SCOPED_TRACE(var);
    test::ScopedEnv env(var, "sideways");
    EXPECT_NO_THROW(RequireCudaSupports(c, 1, 1)) << "the environment still chooses kernels";
  }
  c.train.kernels.attention_kernel = "mma";
  c.train.kernels.rope = "fused";
  c.train.kernels.experts = "chunked";
  c.train.kernels.dispatch = "sort";
  c.train.kernels.ffn = "fused";
  c.train.kernels.attention_acts = "bf16";
  EXPECT_NO_THROW(RequireCudaSupports(c, 1, 1));
  c.train.kernels.attention = "fused";
  c.model.head_dim = 24;  // not an instantiated head dim of the fused kernels
  c.model.heads = 4;
  const ConfigError e = test::ConfigErrorOf([&] { RequireCudaSupports(c, 1, 1); },
                                            "accepted attention \"fused\" at head dim 24");
  EXPECT_EQ(e.path(), "train.kernels.attention");
  EXPECT_NE(std::string(e.what()).find("head dims qk 24"), std::string::npos) << e.what();
#endif
}

// train.kernels.experts "cudnn" needs cuDNN's MoE grouped matmul (refused naming the choice, with
// why: here, without a GPU, the missing device), and where it would run (bf16, an MoE model, one
// expert-parallel rank) 16-byte rows; a dense, fp32 or expert-parallel run asks nothing more.
TEST(CudaSupports, CudnnExpertsNeedTheGroupedMatmulAndSixteenByteRows) {
#if !MOELAB_HAVE_CUDA
  GTEST_SKIP() << "built without CUDA (cuDNN's grouped matmul is part of the CUDA backend)";
#else
  RunConfig c;
  c.train.device = "cuda";
  c.train.precision = "bf16";
  test::UseMoe(&c.moe, {.experts = 8, .top_k = 2, .hidden = 36});
  c.train.kernels.experts = "cudnn";
  std::string why;
  const bool available = cuda::CudnnGroupedMatmulAvailable(&why);
  const ConfigError e = test::ConfigErrorOf([&] { RequireCudaSupports(c, 1, 1); }, "accepted");
  if (available) {
    EXPECT_EQ(e.path(), "moe.expert_hidden");
    EXPECT_NE(std::string(e.what()).find("multiple of 8"), std::string::npos) << e.what();
  } else {
    EXPECT_EQ(e.path(), "train.kernels.experts");
    EXPECT_NE(std::string(e.what()).find("needs cuDNN's MoE grouped matmul, but " + why),
              std::string::npos)
        << e.what();
  }
  c.train.precision = "fp32";
  if (available)
    EXPECT_NO_THROW(RequireCudaSupports(c, 1, 1));
  else
    EXPECT_THROW(RequireCudaSupports(c, 1, 1), ConfigError) << "cuDNN is missing";
  c.train.precision = "bf16";
  c.moe.experts_total = 0;
  if (available) EXPECT_NO_THROW(RequireCudaSupports(c, 1, 1));
  c.moe.experts_total = 8;
  c.moe.expert_hidden = 32;
  if (available) {
    EXPECT_NO_THROW(RequireCudaSupports(c, 1, 1));
  }
#endif
}

TEST(CudaSupports, AcceptsExpertParallelZeroAndAuxLossRefusesOddBf16Rows) {
  RunConfig c;
  c.train.device = "cuda";
  test::UseMoe(&c.moe, {.experts = 8, .top_k = 2, .hidden = 16});
  c.dist.zero1 = true;
  c.moe.balance = "aux_loss";
  std::string why;
  if (!NcclCommunicator::Available(&why)) {
    EXPECT_EQ(test::ConfigErrorOf([&] { RequireCudaSupports(c, 4, 2); },
                                  "several ranks accepted without NCCL")
                  .path(),
              "train.device");
    GTEST_SKIP() << "the rest needs NCCL in the build: " << why;
  }
  EXPECT_NO_THROW(RequireCudaSupports(c, 4, 1));
  EXPECT_NO_THROW(RequireCudaSupports(c, 4, 2));
  EXPECT_NO_THROW(RequireCudaSupports(c, 1, 1));
  c.model.d_model = 63;
  c.train.precision = "bf16";
  EXPECT_EQ(test::ConfigErrorOf([&] { RequireCudaSupports(c, 2, 2); },
                                "odd d_model accepted for bf16 expert parallelism")
                .path(),
            "model.d_model");
  c.train.precision = "fp32";
  EXPECT_NO_THROW(RequireCudaSupports(c, 2, 2));
  c.train.device = "cpu";
  c.train.precision = "bf16";
  EXPECT_NO_THROW(RequireCudaSupports(c, 2, 2));
}

// A small MoE on "cuda" for the memory plan tests (4 layers, d 256, 16 experts of 512, top-2,
// sequence 128; AdamW).
RunConfig PlanMoeConfig(const std::string& precision) {
  RunConfig c;
  c.train.device = "cuda";
  c.train.precision = precision;
  c.optimizer.name = "adamw";
  c.model.d_model = 256;
  c.model.layers = 4;
  c.model.seq_len = 128;
  test::UseMoe(&c.moe, {.experts = 16, .top_k = 2, .hidden = 512});
  return c;
}

// The device memory plan under expert parallelism: each GPU holds its share of the routed
// experts (weights, gradients, AdamW state), and keeps the owned rows besides.
TEST(CudaMemoryPlan, ExpertParallelHoldsItsShareOfTheExperts) {
#if !MOELAB_HAVE_CUDA
  GTEST_SKIP() << "built without CUDA (the plan is part of the CUDA backend)";
#else
  RunConfig c = PlanMoeConfig("fp32");
  const DeviceMemoryPlan one = PlanCudaMemory(c, 8, 8);
  c.dist.expert_parallel = 4;
  const DeviceMemoryPlan four = PlanCudaMemory(c, 8, 8);
  const double routed = static_cast<double>(MoeLayers(c.model, c.moe)) * 16 * 3 * 512 * 256;
  EXPECT_DOUBLE_EQ(one.params - four.params, 4 * routed * 3 / 4);
  EXPECT_DOUBLE_EQ(one.grads - four.grads, 4 * routed * 3 / 4);
  EXPECT_DOUBLE_EQ(one.optimizer - four.optimizer, 8 * routed * 3 / 4);
  EXPECT_GT(four.activations, one.activations);  // the owned rows and the exchange buffer
  EXPECT_LT(four.total(), one.total());
#endif
}

// With the chunked expert layout (bf16, no expert parallelism) the MoE layers share one buffer of
// gathered expert inputs and gather them again in their backward: the plan holds it once instead
// of once a layer (the chunk-padded rows × d in bf16), and the layers decide it the same way.
TEST(CudaMemoryPlan, ChunkedExpertsKeepTheGatheredInputsOnce) {
#if !MOELAB_HAVE_CUDA
  GTEST_SKIP() << "built without CUDA (the plan is part of the CUDA backend)";
#else
  RunConfig c = PlanMoeConfig("bf16");
  const size_t n = 8 * 128;
  const int layers = MoeLayers(c.model, c.moe);
  ASSERT_GT(layers, 1);
  // The MoE part of a plan: the layers' bytes and the shared scratch's, under the current switch.
  auto moe_bytes = [&](bool shared_xe) {
    return layers * double(cudamodel::DeviceMoe::Bytes(c.moe, 256, n, true, shared_xe)) +
           double(cudamodel::MoeScratch::Bytes(c.moe, 256, n, true, shared_xe));
  };
  // The layers read the experts path from the backend's selection, the plan from c.
  std::optional<cuda::ScopedKernelSelection> selection;
  auto use = [&](const char* experts) {
    c.train.kernels.experts = experts;
    cuda::KernelSelection k;
    k.experts = std::string(experts) == "chunked" ? 1 : std::string(experts) == "cudnn" ? 2 : 0;
    selection.reset();
    selection.emplace(k);
  };
  use("grouped");
  EXPECT_FALSE(cudamodel::SharedExpertInputs(true, false));
  const DeviceMemoryPlan grouped = PlanCudaMemory(c, 8, 8);
  const double grouped_moe = moe_bytes(false);
  use("chunked");
  EXPECT_TRUE(cudamodel::SharedExpertInputs(true, false));
  EXPECT_FALSE(cudamodel::SharedExpertInputs(false, false)) << "fp32 keeps its own";
  EXPECT_FALSE(cudamodel::SharedExpertInputs(true, true)) << "expert parallelism keeps its own";
  const double xe = 2.0 * cudamodel::MoePaddedRows(n * 2, 16) * 256;  // bf16 padded rows × d
  EXPECT_DOUBLE_EQ(double(cudamodel::DeviceMoe::Bytes(c.moe, 256, n, true, false)) -
                       double(cudamodel::DeviceMoe::Bytes(c.moe, 256, n, true, true)),
                   xe);
  EXPECT_DOUBLE_EQ(double(cudamodel::MoeScratch::Bytes(c.moe, 256, n, true, true)) -
                       double(cudamodel::MoeScratch::Bytes(c.moe, 256, n, true, false)),
                   xe);
  // The plan takes the shared form: keeping xe a layer would cost (layers − 1)·xe more.
  const DeviceMemoryPlan chunked = PlanCudaMemory(c, 8, 8);
  EXPECT_DOUBLE_EQ(chunked.activations - grouped.activations, moe_bytes(true) - grouped_moe);
  EXPECT_DOUBLE_EQ(moe_bytes(false) - moe_bytes(true), (layers - 1) * xe);
  c.dist.expert_parallel = 4;
  const DeviceMemoryPlan ep = PlanCudaMemory(c, 8, 8);
  EXPECT_GT(ep.activations, chunked.activations) << "under expert parallelism xe is kept a layer";
  // The cuDNN experts share xe too, over the compact rows (no chunk padding).
  c.dist.expert_parallel = 1;
  use("cudnn");
  EXPECT_TRUE(cudamodel::SharedExpertInputs(true, false));
  EXPECT_EQ(cudamodel::MoePaddedRows(n * 2, 16), n * 2);
  const DeviceMemoryPlan cudnn = PlanCudaMemory(c, 8, 8);
  EXPECT_LT(cudnn.activations, grouped.activations);
  EXPECT_DOUBLE_EQ(grouped.activations - cudnn.activations, (layers - 1) * 2.0 * n * 2 * 256);
#endif
}

// train.kernels.dispatch "sort" tallies every expert in one block's shared memory: more experts
// than it holds are refused before anything runs, naming moe.experts_total (no GPU needed); the
// scan plan, the default, takes them.
TEST(CudaSupports, SortDispatchRefusesMoreExpertsThanItTallies) {
#if !MOELAB_HAVE_CUDA
  GTEST_SKIP() << "built without CUDA (the dispatch plans are part of the CUDA backend)";
#else
  RunConfig c;
  c.train.device = "cuda";
  c.moe.experts_total = cuda::kMoeSortMaxExperts + 1;
  c.moe.experts_active = 2;
  c.train.kernels.dispatch = "sort";
  const ConfigError e =
      test::ConfigErrorOf([&] { RequireCudaSupports(c, 1, 1); },
                          "accepted " + std::to_string(c.moe.experts_total) + " experts");
  EXPECT_EQ(e.path(), "moe.experts_total");
  EXPECT_NE(std::string(e.what()).find(std::to_string(cuda::kMoeSortMaxExperts)), std::string::npos)
      << e.what();
  c.moe.experts_total = cuda::kMoeSortMaxExperts;
  EXPECT_NO_THROW(RequireCudaSupports(c, 1, 1));
  c.train.kernels.dispatch = "scan";
  c.moe.experts_total = cuda::kMoeSortMaxExperts + 1;
  EXPECT_NO_THROW(RequireCudaSupports(c, 1, 1));
#endif
}

// The MoE layers share the cuDNN experts of their shape (each builds its plans once, compiling
// them with NVRTC: 2 plans for a 15-layer model instead of 30); another shape or row count gets
// its own, and once no layer holds them they are freed and a later layer builds anew. Built here
// without a GPU: constructing only describes the products (cuDNN checks them on the CPU).
TEST(CudaMoeCudnn, LayersOfOneShapeShareTheirPlans) {
#if !MOELAB_HAVE_CUDA
  GTEST_SKIP() << "built without CUDA (cuDNN's grouped matmul is part of the CUDA backend)";
#else
  if (cuda::CudnnVersion() == 0) GTEST_SKIP() << "built without cuDNN";
  std::string why;
  if (!cuda::CudnnVersionHasGroupedMatmul(cuda::CudnnVersion(), &why)) GTEST_SKIP() << why;
  auto first = cudamodel::SharedCudnnExperts(8, 512, 64, 32);
  auto second = cudamodel::SharedCudnnExperts(8, 512, 64, 32);
  EXPECT_EQ(first.get(), second.get()) << "a second layer of the shape built its own plans";
  auto other_rows = cudamodel::SharedCudnnExperts(8, 256, 64, 32);
  auto other_width = cudamodel::SharedCudnnExperts(8, 512, 64, 48);
  EXPECT_NE(other_rows.get(), first.get());
  EXPECT_NE(other_width.get(), first.get());
  EXPECT_EQ(other_rows->rows(), 256);
  const std::weak_ptr<cuda::MoeExpertsCudnn> released = first;
  first.reset();
  second.reset();
  EXPECT_TRUE(released.expired()) << "the cache kept the experts alive";
  EXPECT_NE(cudamodel::SharedCudnnExperts(8, 512, 64, 32), nullptr);
#endif
}

// Several ranks on "cuda" wait for their NCCL collectives under MOELAB_NCCL_TIMEOUT_S
// (core/comm/collective_wait.h): a value that is not a number of seconds stops the run before
// anything runs, naming the variable; one rank never reads it.
TEST(CudaSupports, RefusesABadNcclTimeoutBeforeTheRun) {
  RunConfig c;
  c.train.device = "cuda";
  std::string why;
  if (!NcclCommunicator::Available(&why)) GTEST_SKIP() << "needs NCCL in the build: " << why;
  test::ScopedEnv timeout("MOELAB_NCCL_TIMEOUT_S", "ten minutes");
  const ConfigError e = test::ConfigErrorOf([&] { RequireCudaSupports(c, 2, 1); },
                                            "accepted MOELAB_NCCL_TIMEOUT_S=ten minutes");
  EXPECT_EQ(e.path(), "train.device");
  EXPECT_NE(std::string(e.what()).find("MOELAB_NCCL_TIMEOUT_S"), std::string::npos) << e.what();
  EXPECT_NO_THROW(RequireCudaSupports(c, 1, 1));
  timeout.Set("600");
  EXPECT_NO_THROW(RequireCudaSupports(c, 2, 1));
}

}  // namespace
}  // namespace moelab
