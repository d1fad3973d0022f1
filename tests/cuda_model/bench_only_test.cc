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
#include <vector>

#include "cli/bench_cuda.h"

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
TEST(BenchOnly, CommandExitsWithConfigErrorOnAnUnknownName) {
  const char* dir = std::getenv("MOELAB_BIN_DIR");
  const std::string bin = std::string(dir ? dir : MOELAB_BIN_DIR_DEFAULT) + "/moelab";
  const fs::path log =
      fs::temp_directory_path() / ("moelab_bench_only_" + std::to_string(getpid()) + ".txt");
  const int status = std::system(
      (bin + " bench --device cuda --only gpu-dens > " + log.string() + " 2>&1").c_str());
  std::ifstream in(log);
  const std::string out((std::istreambuf_iterator<char>(in)), {});
  fs::remove(log);
  ASSERT_TRUE(WIFEXITED(status)) << out;
  EXPECT_EQ(WEXITSTATUS(status), 2) << out;
  EXPECT_NE(out.find("no config named \"gpu-dens\""), std::string::npos) << out;
  EXPECT_EQ(out.find("TFLOP/s"), std::string::npos) << out;
}

}  // namespace
}  // namespace moelab::cli
