// train.kernels (core/kernel_choices.h): parsed and checked by JSON path, carried by the full
// config JSON, left out of the hash, settable with --set, and the bench flag's parser.
#include "core/kernel_choices.h"

#include <gtest/gtest.h>

#include <stdexcept>
#include <string>

#include "core/config.h"
#include "tests/common/errors.h"

namespace moelab {
namespace {

using nlohmann::json;

// The ConfigError of parsing j, or a failure when it parses.
ConfigError ErrorOf(const json& j) {
  return test::ConfigErrorOf([&] { ConfigFromJson(j); }, "accepted " + j.dump());
}

json CudaWith(const json& kernels) {
  return {{"train", {{"device", "cuda"}, {"kernels", kernels}}}};
}

TEST(KernelChoices, ParsedOnACudaRunAndCarriedByTheConfigJson) {
  const RunConfig c = ConfigFromJson(CudaWith({{"attention_kernel", "mma"},
                                               {"rope", "fused"},
                                               {"attention_acts", "bf16"},
                                               {"ffn", "fused"},
                                               {"experts", "cudnn"},
                                               {"dispatch", "sort"},
                                               {"attention", "reference"}}));
  EXPECT_EQ(c.train.kernels.attention_kernel, "mma");
  EXPECT_EQ(c.train.kernels.experts, "cudnn");
  const json j = ConfigToJson(c);
  ASSERT_TRUE(j["train"].contains("kernels"));
  EXPECT_EQ(j["train"]["kernels"]["dispatch"], "sort");
  EXPECT_EQ(j["train"]["kernels"]["attention"], "reference");
  EXPECT_EQ(ConfigFromJson(j).train.kernels, c.train.kernels) << "the stored config round-trips";
  // Missing keys keep their defaults; the defaults' block is written whole.
  const json defaults = ConfigToJson(RunConfig{});
  EXPECT_EQ(defaults["train"]["kernels"], json({{"attention", "auto"},
                                                {"attention_kernel", "wmma"},
                                                {"rope", "separate"},
                                                {"attention_acts", "fp32"},
                                                {"ffn", "split"},
                                                {"experts", "grouped"},
                                                {"dispatch", "scan"}}));
}

TEST(KernelChoices, BadKeysAndValuesNameTheirPath) {
  ConfigError e = ErrorOf(CudaWith({{"ffn", "sideways"}}));
  EXPECT_EQ(e.path(), "train.kernels.ffn");
  EXPECT_NE(e.reason().find("'sideways' is not one of: split, fused"), std::string::npos)
      << e.what();
  e = ErrorOf(CudaWith({{"expert", "chunked"}}));
  EXPECT_EQ(e.path(), "train.kernels.expert");
  EXPECT_NE(e.reason().find("did you mean 'experts'"), std::string::npos) << e.what();
  e = ErrorOf(CudaWith({{"dispatch", 1}}));
  EXPECT_EQ(e.path(), "train.kernels.dispatch");
  EXPECT_NE(e.reason().find("expected a string"), std::string::npos) << e.what();
  e = ErrorOf(CudaWith("mma"));
  EXPECT_EQ(e.path(), "train.kernels");
  e = ErrorOf(CudaWith({{"ffn", "fussed"}}));
  EXPECT_NE(e.reason().find("did you mean 'fused'"), std::string::npos) << e.what();
}

// The CPU backend has one implementation of each op: a CUDA choice on a cpu run is refused by
// path; the defaults, written out, are accepted (a stored config always carries them).
TEST(KernelChoices, ACudaChoiceOnACpuRunIsRefused) {
  const ConfigError e = ErrorOf({{"train", {{"kernels", {{"experts", "chunked"}}}}}});
  EXPECT_EQ(e.path(), "train.kernels.experts");
  EXPECT_NE(e.reason().find("train.device is \"cpu\""), std::string::npos) << e.what();
  EXPECT_NO_THROW(ConfigFromJson({{"train", {{"kernels", {{"experts", "grouped"}}}}}}));
  EXPECT_NO_THROW(ConfigFromJson(ConfigToJson(RunConfig{})));
}

// What the build can run is checked before a cuda run (RequireCudaSupports hands it the build):
// without CUDA every choice but the defaults is refused by path; cudnn needs cuDNN, with why.
TEST(KernelChoices, AChoiceTheBuildCannotRunIsRefusedByPath) {
  KernelChoices k;
  KernelBuild none;
  EXPECT_NO_THROW(RequireKernelChoicesBuildable(k, none)) << "the defaults need nothing";
  k.dispatch = "sort";
  const ConfigError no_cuda = test::ConfigErrorOf([&] { RequireKernelChoicesBuildable(k, none); },
                                                  "a build without CUDA accepted dispatch sort");
  EXPECT_EQ(no_cuda.path(), "train.kernels.dispatch");
  EXPECT_NE(no_cuda.reason().find("built without CUDA"), std::string::npos) << no_cuda.what();
  KernelBuild cuda;
  cuda.cuda = true;
  cuda.cudnn_why = "cannot load libcudnn.so.9";
  EXPECT_NO_THROW(RequireKernelChoicesBuildable(k, cuda));
  k.experts = "cudnn";
  const ConfigError no_cudnn = test::ConfigErrorOf([&] { RequireKernelChoicesBuildable(k, cuda); },
                                                   "accepted cudnn without cuDNN");
  EXPECT_EQ(no_cudnn.path(), "train.kernels.experts");
  EXPECT_NE(no_cudnn.reason().find("cannot load libcudnn.so.9"), std::string::npos)
      << no_cudnn.what();
  cuda.cudnn = true;
  EXPECT_NO_THROW(RequireKernelChoicesBuildable(k, cuda));
}

// experts "device" runs the bf16 experts without expert parallelism on 16-byte rows: anything
// else is refused before the run, by the path to change; the defaults and dense models pass.
TEST(KernelChoices, DeviceExpertsAreRefusedWhereTheyCannotRun) {
  KernelChoices k;
  EXPECT_NO_THROW(RequireDeviceExpertsRunnable(k, "fp32", 8, 2, 12, 12)) << "grouped: nothing";
  k.experts = "device";
  EXPECT_NO_THROW(RequireDeviceExpertsRunnable(k, "bf16", 64, 1, 1024, 512));
  EXPECT_NO_THROW(RequireDeviceExpertsRunnable(k, "fp32", 0, 2, 12, 12)) << "a dense model";
  const auto refused = [&](const std::string& precision, int ep, int d, int hidden) {
    return test::ConfigErrorOf(
        [&] { RequireDeviceExpertsRunnable(k, precision, 64, ep, d, hidden); },
        "accepted " + precision + " ep " + std::to_string(ep) + " d " + std::to_string(d) + " H " +
            std::to_string(hidden));
  };
  ConfigError e = refused("fp32", 1, 1024, 512);
  EXPECT_EQ(e.path(), "train.kernels.experts");
  EXPECT_NE(e.reason().find("train.precision is \"fp32\""), std::string::npos) << e.what();
  e = refused("bf16", 2, 1024, 512);
  EXPECT_EQ(e.path(), "train.kernels.experts");
  EXPECT_NE(e.reason().find("dist.expert_parallel is 2"), std::string::npos) << e.what();
  e = refused("bf16", 1, 1020, 512);
  EXPECT_EQ(e.path(), "model.d_model");
  EXPECT_NE(e.reason().find("multiple of 8"), std::string::npos) << e.what();
  e = refused("bf16", 1, 1024, 500);
  EXPECT_EQ(e.path(), "moe.expert_hidden");
}

// Kernel choices compute the same model: the hash (checkpoint folders, sweep dedupe) is the same
// with and without the block, whatever it holds.
TEST(KernelChoices, TheHashLeavesThemOut) {
  const json plain = {{"train", {{"device", "cuda"}}}};
  const std::string hash = ConfigHash(ConfigFromJson(plain));
  EXPECT_EQ(ConfigHash(ConfigFromJson(CudaWith({{"ffn", "fused"}, {"experts", "chunked"}}))), hash);
  EXPECT_EQ(ConfigHash(ConfigFromJson(CudaWith(json::object()))), hash);
  EXPECT_EQ(BranchHash(ConfigFromJson(CudaWith({{"attention_kernel", "mma"}}))),
            BranchHash(ConfigFromJson(plain)));
}

TEST(KernelChoices, SetOverridesReachTheBlock) {
  json j = {{"train", {{"device", "cuda"}}}};
  ApplyOverride(j, "train.kernels.attention_acts=bf16");
  EXPECT_EQ(ConfigFromJson(j).train.kernels.attention_acts, "bf16");
  EXPECT_EQ(test::ConfigErrorOf([&] { ApplyOverride(j, "train.kernels.warp_size=64"); },
                                "accepted an unknown kernel key")
                .path(),
            "train.kernels.warp_size");
}

TEST(KernelChoices, BenchFlagParsesTheSameChoices) {
  const KernelChoices k = ParseKernelAssignments("attention_kernel=mma,ffn=fused", "--kernels");
  EXPECT_EQ(k.attention_kernel, "mma");
  EXPECT_EQ(k.ffn, "fused");
  EXPECT_EQ(k.experts, "grouped");
  EXPECT_EQ(DescribeKernelChoices(k), "attention_kernel=mma ffn=fused");
  EXPECT_EQ(DescribeKernelChoices(KernelChoices{}), "defaults");
  EXPECT_EQ(ParseKernelAssignments("", "--kernels"), KernelChoices{});
  for (const char* bad : {"ffn=sideways", "fnn=fused", "ffn", "ffn=fused,"}) {
    SCOPED_TRACE(bad);
    try {
      ParseKernelAssignments(bad, "--kernels");
      ADD_FAILURE() << "accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_EQ(std::string(e.what()).rfind("--kernels: ", 0), 0u) << e.what();
    }
  }
}

TEST(KernelChoices, DocumentedInTheConfigReference) {
  const std::string docs = ConfigDocsMarkdown();
  for (const KernelChoiceInfo& c : KernelChoiceTable()) {
    EXPECT_NE(docs.find("`train.kernels." + c.key + "`"), std::string::npos) << c.key;
  }
}

}  // namespace
}  // namespace moelab
