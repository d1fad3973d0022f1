// `moelab bench --device cuda --only`: exact names, comma lists, and a misspelt name refused
// before anything runs (on every machine, GPU or not).
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "cli/bench_cuda.h"

#if MOELAB_HAVE_CUDA
#include "kernels/cuda/device.h"
#endif

namespace moelab::cli {
namespace {

namespace fs = std::filesystem;
using Names = std::vector<std::string>;

TEST(BenchOnly, NamesAreExactNotPrefixes) {
  const Names all = GpuCaseNames();
  ASSERT_EQ(all, (Names{"gpu-dense", "gpu-moe", "gpu-dense-muonclip"}));
  EXPECT_EQ(SelectCases(all, ""), all);
  // Before the fix, "gpu-dense" also ran gpu-dense-muonclip (substring match).
  EXPECT_EQ(SelectCases(all, "gpu-dense"), Names{"gpu-dense"});
  EXPECT_EQ(SelectCases(all, "gpu-dense-muonclip"), Names{"gpu-dense-muonclip"});
}

TEST(BenchOnly, CommaListKeepsTheBenchOrder) {
  const Names all = GpuCaseNames();
  EXPECT_EQ(SelectCases(all, "gpu-dense-muonclip,gpu-dense"),
            (Names{"gpu-dense", "gpu-dense-muonclip"}));
  EXPECT_EQ(SelectCases(all, "gpu-moe,gpu-moe"), Names{"gpu-moe"});
}

TEST(BenchOnly, UnknownNameIsRefusedWithTheValidOnes) {
  const Names all = GpuCaseNames();
  for (const std::string only : {"gpu", "dense", "gpu-dense,", ",gpu-moe", "gpu-moe,,gpu-dense",
                                 "gpu-moe,nope", " gpu-moe", ","}) {
    try {
      SelectCases(all, only);
      ADD_FAILURE() << "accepted --only \"" << only << "\"";
    } catch (const std::invalid_argument& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("--only"), std::string::npos) << what;
      EXPECT_NE(what.find("gpu-dense, gpu-moe, gpu-dense-muonclip"), std::string::npos) << what;
    }
  }
}

// The binary refuses the name before it looks for a GPU: exit 2 here and on a GPU machine.
// `moelab <args>`: its exit status (-1 when it did not exit) and its output.
std::pair<int, std::string> RunMoelab(const std::string& args) {
  const char* dir = std::getenv("MOELAB_BIN_DIR");
  const std::string bin = std::string(dir ? dir : MOELAB_BIN_DIR_DEFAULT) + "/moelab";
  const fs::path log =
      fs::temp_directory_path() / ("moelab_bench_only_" + std::to_string(getpid()) + ".txt");
  const int status = std::system((bin + " " + args + " > " + log.string() + " 2>&1").c_str());
  std::ifstream in(log);
  const std::string out((std::istreambuf_iterator<char>(in)), {});
  fs::remove(log);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

// `moelab <args>` exits with `rc` and its output contains `part`; returns the output.
std::string ExpectMoelabSays(const std::string& args, int rc, const std::string& part) {
  const auto [got, out] = RunMoelab(args);
  EXPECT_EQ(got, rc) << out;
  EXPECT_NE(out.find(part), std::string::npos) << out;
  return out;
}

TEST(BenchOnly, CommandExitsWithConfigErrorOnAnUnknownName) {
  const auto [rc, out] = RunMoelab("bench --device cuda --only gpu-dens");
  EXPECT_EQ(rc, 2) << out;
  EXPECT_NE(out.find("no config named \"gpu-dens\""), std::string::npos) << out;
  EXPECT_EQ(out.find("TFLOP/s"), std::string::npos) << out;
}

// --kernels takes train.kernels' choices (core/kernel_choices.h): a bad key or value is refused
// naming the flag before any GPU is looked for, the flag needs --device cuda, and the choices
// reach the cases (no GPU needed: the memory plan of gpu-moe with the chunked experts, which keep
// the gathered inputs once, is not the default's).
TEST(BenchKernels, ChoicesAreParsedCheckedAndReachTheCases) {
#if !MOELAB_HAVE_CUDA
  GTEST_SKIP() << "built without CUDA (the bench's GPU cases and their plans)";
#else
  ExpectMoelabSays("bench --device cuda --kernels ffn=sideways", 2,
                   "--kernels: ffn: 'sideways' is not one of: split, fused");
  ExpectMoelabSays("bench --device cuda --kernels expert=chunked --plan", 2,
                   "did you mean 'experts'");
  ExpectMoelabSays("bench --kernels ffn=fused --only dense", 2, "need --device cuda");
  const auto plan_line = [](const std::string& text) {
    const size_t at = text.find("gpu-moe ");
    return at == std::string::npos ? std::string() : text.substr(at, text.find('\n', at) - at);
  };
  const auto [rc_default, grouped] = RunMoelab("bench --device cuda --plan --only gpu-moe");
  const auto [rc_chunked, chunked] = RunMoelab(
      "bench --device cuda --plan --only gpu-moe --kernels experts=chunked,dispatch=sort");
  EXPECT_EQ(rc_default, 0) << grouped;
  EXPECT_EQ(rc_chunked, 0) << chunked;
  ASSERT_FALSE(plan_line(grouped).empty()) << grouped;
  EXPECT_NE(plan_line(chunked), plan_line(grouped)) << "the choices did not reach the case";
#endif
}

// The bench's memory budget is read from the device (issue 34 item 5): kDeviceMemoryShare of
// cudaMemGetInfo's total unless --memory-budget-gib says otherwise.
TEST(BenchMemoryBudget, ShareOfTheDeviceUnlessOverridden) {
  constexpr double kGiB = 1024.0 * 1024 * 1024;
  EXPECT_DOUBLE_EQ(kDeviceMemoryShare, 0.97);
  EXPECT_DOUBLE_EQ(BenchMemoryBudgetBytes(0, 100 * kGiB), 97 * kGiB);
  EXPECT_DOUBLE_EQ(BenchMemoryBudgetBytes(12.5, 100 * kGiB), 12.5 * kGiB) << "the override wins";
  const std::vector<ReferenceCard> cards = ReferenceCards();
  ASSERT_EQ(cards.size(), 2u);
  EXPECT_LT(cards[0].total_gib, 80);   // an H100 80GB reports a little less than 80 GiB
  EXPECT_GT(cards[1].total_gib, 130);  // an H200 141GB
}

// What PlanCudaMemory (no GPU needed) makes of the two cards: gpu-moe runs unsplit on an H200's
// 141 GB and at micro-batch 16 on an H100's 80 GB (the fixed 75 GiB budget gave 16 everywhere);
// gpu-dense is unsplit on both.
TEST(BenchMemoryBudget, GpuMoeRunsUnsplitOnAnH200) {
#if !MOELAB_HAVE_CUDA
  GTEST_SKIP() << "built without CUDA (the plan is part of the CUDA backend)";
#else
  constexpr double kGiB = 1024.0 * 1024 * 1024;
  const std::vector<ReferenceCard> cards = ReferenceCards();
  const double h100 = BenchMemoryBudgetBytes(0, cards[0].total_gib * kGiB);
  const double h200 = BenchMemoryBudgetBytes(0, cards[1].total_gib * kGiB);
  EXPECT_EQ(GpuCaseMicroBatch("gpu-moe", h200), 32);
  EXPECT_EQ(GpuCaseMicroBatch("gpu-moe", h100), 16);
  EXPECT_EQ(GpuCaseMicroBatch("gpu-moe", 75 * kGiB), 16);
  EXPECT_EQ(GpuCaseMicroBatch("gpu-dense", h100), 32);
  EXPECT_EQ(GpuCaseMicroBatch("gpu-dense-muonclip", h100), 32);
  EXPECT_EQ(GpuCaseMicroBatch("gpu-moe", 1.0), 1) << "nothing fits: the smallest";
  EXPECT_THROW(GpuCaseMicroBatch("gpu-mo", h200), std::invalid_argument);
  // The command: the override is the budget on any machine; without it the plan names the share.
  std::string out =
      ExpectMoelabSays("bench --device cuda --plan --only gpu-moe --memory-budget-gib 200", 0,
                       "budget 200.0 GiB from --memory-budget-gib");
  EXPECT_NE(out.find("(micro-batch 32), runtime"), std::string::npos) << out;
  ExpectMoelabSays("bench --device cuda --plan --only gpu-moe --memory-budget-gib 2", 2,
                   "DOES NOT FIT");
  out = ExpectMoelabSays("bench --device cuda --plan --only gpu-moe", 0, "= 97 % of");
  std::string reason;
  if (!cuda::CudaAvailable(&reason)) {  // here: both reference cards, H100 split, H200 unsplit
    const size_t h100_at = out.find("H100 80GB"), h200_at = out.find("H200 141GB");
    ASSERT_NE(h100_at, std::string::npos) << out;
    ASSERT_NE(h200_at, std::string::npos) << out;
    EXPECT_NE(out.find("(micro-batch 16), runtime", h100_at), std::string::npos) << out;
    EXPECT_NE(out.find("(micro-batch 32), runtime", h200_at), std::string::npos) << out;
  }
  int rc = 0;
  std::tie(rc, out) = RunMoelab("bench --device cuda --plan --memory-budget-gib -1");
  EXPECT_NE(rc, 0) << out;
  EXPECT_NE(out.find("--memory-budget-gib"), std::string::npos) << out;
  std::tie(rc, out) = RunMoelab("bench --device cuda --profile-steps -2");
  EXPECT_NE(rc, 0) << out;
  EXPECT_NE(out.find("--profile-steps"), std::string::npos) << out;
#endif
}

}  // namespace
}  // namespace moelab::cli
