#include "kernels/cuda/device.h"

#include <gtest/gtest.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "tests/cuda_kernels/cuda_test_util.h"

namespace moelab::cuda {
namespace {

TEST(CudaDevice, AvailabilityReportsAReasonWhenAbsent) {
  std::string reason = "unchanged";
  const bool available = CudaAvailable(&reason);
  if (available) {
    EXPECT_TRUE(reason.empty());
  } else {
    EXPECT_EQ(reason.rfind("no CUDA device: ", 0), 0u) << reason;
  }
  // Asking twice gives the same answer (no sticky state from the first failure).
  std::string again;
  EXPECT_EQ(CudaAvailable(&again), available);
  EXPECT_EQ(again, available ? "" : reason);
}

TEST(CudaDevice, AllocationWithoutDeviceThrowsAClearError) {
  std::string reason;
  if (CudaAvailable(&reason)) GTEST_SKIP() << "a GPU is present: nothing to check";
  try {
    DeviceBuffer<float> buffer(16);
    FAIL() << "cudaMalloc succeeded without a device";
  } catch (const std::runtime_error& e) {
    // Names the failing call and the CUDA error, e.g. "cudaMalloc(...):
    // cudaErrorInsufficientDriver".
    EXPECT_NE(std::string(e.what()).find("cudaMalloc"), std::string::npos) << e.what();
  }
}

TEST(CudaDevice, BufferRoundTripAndBf16Cast) {
  MOELAB_REQUIRE_GPU();
  const std::vector<float> host = {1.0f, -2.5f, 3.25f, 1e-3f, 65504.0f};
  DeviceBuffer<float> d;
  d.Upload(host);
  EXPECT_EQ(d.Download(), host);
  DeviceBuffer<bf16> b(host.size());
  CastToBf16(d.data(), b.data(), host.size());
  DeviceBuffer<float> back(host.size());
  CastToFloat(b.data(), back.data(), host.size());
  const std::vector<float> got = back.Download();
  for (size_t i = 0; i < host.size(); ++i) EXPECT_NEAR(got[i], host[i], std::abs(host[i]) / 128);
}

// A failed call (here: an allocation larger than any GPU) must not leave its error for the next
// launch check to report: before the fix, Fill's CheckLaunch threw the old out-of-memory.
TEST(CudaDevice, FailedCallLeavesNoErrorForTheNextLaunch) {
  MOELAB_REQUIRE_GPU();
  constexpr size_t kHuge = size_t{1} << 50;  // 1 PiB
  EXPECT_THROW(DeviceBuffer<char> too_big(kHuge), std::runtime_error);
  EXPECT_EQ(cudaPeekAtLastError(), cudaSuccess);
  DeviceBuffer<float> x(8);
  EXPECT_NO_THROW(Fill(x.data(), 8, 2.0f));
  EXPECT_EQ(x.Download(), std::vector<float>(8, 2.0f));
  // core/'s recovery (the bench's, between cases) finds the context working.
  EXPECT_EQ(cuda::RecoverAfterError(), "");
}

}  // namespace
}  // namespace moelab::cuda
