// cuDNN's MoE grouped matmul (kernels/cuda/cudnn_grouped_matmul.h). Its descriptors are checked
// here without a GPU (cuDNN finalizes an operation without a device and refuses wrong shapes), and
// so are the engines cuDNN's heuristics propose for a Hopper GPU (described by its properties); on
// a GPU every product is compared with cuBLAS's grouped GEMM on the same bf16 operands, experts
// without rows included (in the middle and last).
#include "kernels/cuda/cudnn_grouped_matmul.h"

#include <dlfcn.h>
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "kernels/cuda/gemm.h"
#include "kernels/cuda/moe_experts_cudnn.h"
#include "tests/cuda_kernels/cuda_test_util.h"

namespace moelab::cuda::testing {
namespace {

#define MOELAB_REQUIRE_CUDNN_BUILD()                                                  \
  do {                                                                                \
    if (CudnnVersion() == 0) GTEST_SKIP() << "cuDNN test skipped: no cuDNN loadable"; \
  } while (0)

// The version gate: 9.18 is the first cuDNN whose support matrix lists the operation (9.15 to 9.17
// have its enums but the frontend's own tests skip them), refused naming both versions.
TEST(CudnnGroupedMatmul, NeedsCudnn918) {
  for (size_t old : {91500u, 91700u}) {
    std::string why;
    EXPECT_FALSE(CudnnVersionHasGroupedMatmul(old, &why)) << old;
    EXPECT_NE(why.find(std::to_string(old)), std::string::npos) << why;
    EXPECT_NE(why.find("9.18 or later"), std::string::npos) << why;
  }
  for (size_t ok : {91800u, 91900u, 92200u}) EXPECT_TRUE(CudnnVersionHasGroupedMatmul(ok)) << ok;
}

// The shapes the experts use at gpu-moe's size (64 experts, 32 × 1024 tokens × top-8 rows,
// d 1024, hidden 512): cuDNN accepts the operation.
TEST(CudnnGroupedMatmul, DescribesTheExpertProductsWithoutAGpu) {
  MOELAB_REQUIRE_CUDNN_BUILD();
  const int64_t rows = 32 * 1024 * 8;
  for (auto [k, n] : {std::pair{1024, 512}, std::pair{512, 1024}}) {
    SCOPED_TRACE(std::to_string(k) + " -> " + std::to_string(n));
    EXPECT_NO_THROW(CudnnGroupedMatmul({64, rows, k, n}));
  }
}

// An H100 80GB HBM3's properties in cuDNN's device-property JSON (the fields cuDNN reads, the
// values cudaGetDeviceProperties gives for it): the lent GPUs are H100 and H200, both sm_90.
constexpr char kHopper[] =
    R"({"maxGridSize":[2147483647,65535,65535],"maxBlockSize":[1024,1024,64],)"
    R"("regsPerBlock":65536,"multiProcessorCount":132,"warpSize":32,)"
    R"("maxSharedMemoryPerBlock":49152,"maxSharedMemoryPerBlockOptin":232448,)"
    R"("reservedSharedMemoryPerBlock":1024,"maxRegistersPerSM":65536,"maxCtasPerSM":32,)"
    R"("maxThreadsPerBlock":1024,"maxThreadsPerSM":2048,"pciDeviceId":0,"isTccDriver":0,)"
    R"("supportCoopLaunch":1,"totalGlobalMem":85520809984,"smClockRateKHz":1980000,)"
    R"("memClockRateKHz":2619000,"l2CacheSize":52428800,"cudaDeviceId":0,"deviceVer":900,)"
    R"("driverVer":13000,"deviceName":"NVIDIA H100 80GB HBM3"})";

// cuDNN's heuristics need a loadable libcuda.so.1 even for a described device; without a driver,
// the toolkit's stub (soname libcuda.so.1, so cuDNN's dlopen finds the loaded one; nothing is
// launched through it). Only where no GPU is usable: there cudart holds the driver's own.
bool LoadDriverStub(std::string* why) {
  if (dlopen(MOELAB_CUDA_DRIVER_STUB, RTLD_NOW | RTLD_GLOBAL)) return true;
  const char* error = dlerror();
  *why = std::string("cannot load the toolkit's driver stub '") + MOELAB_CUDA_DRIVER_STUB +
         "': " + (error ? error : "no reason given");
  return false;
}

// Every product the cuDNN experts run has an engine on Hopper, at gpu-moe's shapes and at the GPU
// tests' (cuDNN's heuristics, asked without the device). The input gradients' products, whose
// weights have n contiguous, had none ("weight_layout != ColumnMajor" in cuDNN's log): why the
// experts' backward is on cuBLAS.
TEST(CudnnGroupedMatmul, HopperHasAnEngineForEveryExpertProduct) {
  MOELAB_REQUIRE_CUDNN_BUILD();
  std::string why;
  if (!CudnnVersionHasGroupedMatmul(CudnnVersion(), &why)) GTEST_SKIP() << why;
  if (CudaAvailable()) {
    GTEST_SKIP() << "a GPU is usable here: the GPU tests below build and run the plans on it";
  }
  if (!LoadDriverStub(&why)) GTEST_SKIP() << why;
  struct Case {
    int experts;
    int64_t rows;
    int d, hidden;
  };
  // (hidden 1024 at gpu-moe's rows: the gate and up projections as one product of width 2H,
  // which CudaGroupedGemmBench times.)
  for (const Case& c : {Case{64, 32 * 1024 * 8, 1024, 512}, Case{64, 32 * 1024 * 8, 1024, 1024},
                        Case{4, 47, 32, 48}, Case{4, 8 * 64 * 2, 64, 32}, Case{6, 196, 64, 48}}) {
    const MoeExpertsCudnn experts(c.experts, c.rows, c.d, c.hidden);
    for (const CudnnGroupedMatmul* p : experts.Products()) {
      const GroupedMatmulShape& s = p->shape();
      EXPECT_GT(p->EnginesProposed(kHopper), 0)
          << "experts " << s.experts << ", rows " << s.rows << ", k " << s.k << ", n " << s.n;
    }
  }
}

// A shape the descriptors cannot promise (an empty inner dimension, rows off 16-byte boundaries)
// is refused when it is described, naming why and the shape.
TEST(CudnnGroupedMatmul, RefusesShapesItCannotDescribe) {
  MOELAB_REQUIRE_CUDNN_BUILD();
  const std::vector<std::pair<GroupedMatmulShape, std::string>> bad = {
      {{8, 64, 0, 16}, "positive"},
      {{0, 64, 16, 16}, "positive"},
      {{8, 64, 12, 16}, "multiples of 8"},
      {{8, 64, 16, 20}, "multiples of 8"}};
  for (const auto& [shape, why] : bad) {
    try {
      CudnnGroupedMatmul mm(shape);
      ADD_FAILURE() << "no refusal of k " << shape.k << " n " << shape.n;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
    }
  }
}

TEST(CudnnGroupedMatmul, MatchesCublasGroupedGemm) {
  MOELAB_REQUIRE_GPU();
  std::string why;
  if (!CudnnGroupedMatmulAvailable(&why)) GTEST_SKIP() << "cuDNN test skipped: " << why;
  const std::vector<int32_t> first = {0, 37, 37, 101, 106, 196};  // experts 1 and 5 empty
  const int E = 6, k = 64, n = 48;
  const int64_t rows = 196;
  auto tok = ToDevice(ToBf16(Random(size_t(rows) * k, 1)));
  auto w = ToDevice(ToBf16(Random(size_t(E) * k * n, 2, -0.3f, 0.3f)));  // [E, n, k]
  auto first_row = ToDevice(first);
  DeviceBuffer<bf16> got(size_t(rows) * n), want(size_t(rows) * n);
  std::vector<GemmGroup<bf16, bf16>> groups;
  for (int e = 0; e < E; ++e) {
    const int64_t r0 = first[e], r1 = e + 1 < E ? first[e + 1] : rows;
    if (r1 == r0) continue;
    const bf16* we = w.data() + size_t(e) * k * n;
    groups.push_back({int(r1 - r0), n, k, tok.data() + r0 * k, k, we, k, want.data() + r0 * n, n});
  }
  GemmGrouped(false, true, 1.0f, 0.0f, groups);
  CudnnGroupedMatmul mm({E, rows, k, n});
  mm.Run(tok.data(), w.data(), first_row.data(), got.data());
  DeviceBuffer<float> fgot(got.size()), fwant(want.size());
  CastToFloat(got.data(), fgot.data(), got.size());
  CastToFloat(want.data(), fwant.data(), want.size());
  // Both accumulate in fp32 and round once to bf16: one bf16 step apart at most.
  ExpectNear(fgot.Download(), fwant.Download(), 1e-3, 8e-3, "cuDNN against cuBLAS");
}

}  // namespace
}  // namespace moelab::cuda::testing
