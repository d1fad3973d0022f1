// The grouped expert GEMM alone, at gpu-moe's shapes (issue 25: measure it before building an own
// kernel): 64 experts × 4096 rows, d_model 1024, expert hidden 512, bf16 operands. Prints each
// product's rate beside one dense GEMM of the same FLOPs; asserts only that every product ran
// and wrote finite values (a benchmark, not a timed test). Skips without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "kernels/cuda/cudnn_grouped_matmul.h"
#include "kernels/cuda/gemm.h"
#include "tests/cuda_kernels/cuda_test_util.h"

namespace moelab::cuda {
namespace {

using testing::TimeMs;

TEST(CudaGroupedGemmBench, ExpertShapesAgainstOneDenseProduct) {
  MOELAB_REQUIRE_GPU();
  const int E = 64, rows = 4096, d = 1024, H = 512;
  const long R = long(E) * rows;
  DeviceBuffer<bf16> x(size_t(R) * d), h(size_t(R) * H), w(size_t(E) * H * d);
  DeviceBuffer<float> dw(size_t(E) * H * d);
  // Every bf16 0x3c3c (≈ 0.0115): the rates do not depend on the values; finite outputs are
  // checked.
  for (bf16* p : {x.data(), h.data(), w.data()}) {
    const size_t n = p == x.data() ? x.size() : p == h.data() ? h.size() : w.size();
    MOELAB_CUDA_CHECK(cudaMemset(p, 0x3c, n * sizeof(bf16)));
  }
  std::vector<GemmGroup<bf16, bf16>> up;      // h_e = x_e · W_eᵀ   [rows, H]
  std::vector<GemmGroup<bf16, float>> grad;   // dW_e = h_eᵀ · x_e  [H, d], fp32 (the masters')
  std::vector<GemmGroup<bf16, bf16>> grad16;  // the same in bf16 (the grouped call)
  DeviceBuffer<bf16> dw16(size_t(E) * H * d);
  for (int e = 0; e < E; ++e) {
    const long r0 = long(e) * rows;
    up.push_back(
        {rows, H, d, x.data() + r0 * d, d, w.data() + size_t(e) * H * d, d, h.data() + r0 * H, H});
    grad.push_back(
        {H, d, rows, h.data() + r0 * H, H, x.data() + r0 * d, d, dw.data() + size_t(e) * H * d, d});
    grad16.push_back({H, d, rows, h.data() + r0 * H, H, x.data() + r0 * d, d,
                      dw16.data() + size_t(e) * H * d, d});
  }
  const double flops = 2.0 * R * d * H;  // each of the products below, unless a row says 2x
  struct Row {
    const char* what;
    double ms;
    double flops;
  };
  std::vector<Row> table = {
      {"one dense GEMM, same FLOPs (R x d -> H, bf16 out)", TimeMs([&] {
         Gemm(false, true, int(R), H, d, 1.0f, x.data(), d, w.data(), d, 0.0f, h.data(), H);
       }),
       flops},
      {"grouped forward, 64 experts (cublasGemmGroupedBatchedEx)",
       TimeMs([&] { GemmGrouped(false, true, 1.0f, 0.0f, up); }), flops},
      {"weight gradients, one cublasGemmEx per expert (fp32 out)",
       TimeMs([&] { GemmGrouped(true, false, 1.0f, 0.0f, grad); }), flops},
      {"weight gradients, grouped call (bf16 out)",
       TimeMs([&] { GemmGrouped(true, false, 1.0f, 0.0f, grad16); }), flops},
      {"one dense weight-gradient GEMM, same FLOPs (H x d, k = R, fp32 out)", TimeMs([&] {
         Gemm(true, false, H, d, int(R), 1.0f, h.data(), H, x.data(), d, 0.0f, dw.data(), d);
       }),
       flops},
  };
  // The routed experts' gate and up projections as one product of twice the width (h1 | h3 =
  // x_e · [W1_e; W3_e]ᵀ, [rows, 2H]) against the two products of width H they are today: whether
  // fusing them (a packed [E, 2H, d] weight copy) would pay is this row's rate against the
  // grouped forward's above. 2x the FLOPs of the other rows.
  DeviceBuffer<bf16> w13(size_t(E) * 2 * H * d), h13(size_t(R) * 2 * H);
  MOELAB_CUDA_CHECK(cudaMemset(w13.data(), 0x3c, w13.size() * sizeof(bf16)));
  std::vector<GemmGroup<bf16, bf16>> up13;
  for (int e = 0; e < E; ++e) {
    const long r0 = long(e) * rows;
    up13.push_back({rows, 2 * H, d, x.data() + r0 * d, d, w13.data() + size_t(e) * 2 * H * d, d,
                    h13.data() + r0 * 2 * H, 2 * H});
  }
  table.push_back({"grouped forward, gate and up as one product (N = 2H; 2x FLOPs)",
                   TimeMs([&] { GemmGrouped(false, true, 1.0f, 0.0f, up13); }), 2 * flops});
  // cuDNN's MoE grouped matmul (device-side expert offsets) on the forward's product x·Wᵀ (cuDNN
  // 9.19 has no engine for dy·W, whose weights have n contiguous:
  // kernels/cuda/cudnn_grouped_matmul.h).
  std::string why;
  if (CudnnGroupedMatmulAvailable(&why)) {
    std::vector<int32_t> first(E);
    for (int e = 0; e < E; ++e) first[e] = e * rows;
    DeviceBuffer<int32_t> first_row;
    first_row.Upload(first);
    CudnnGroupedMatmul up({E, R, d, H}), up13_cudnn({E, R, d, 2 * H});
    table.push_back({"cuDNN MoE grouped matmul, x . W^T (device offsets)",
                     TimeMs([&] { up.Run(x.data(), w.data(), first_row.data(), h.data()); }),
                     flops});
    table.push_back({"cuDNN MoE grouped matmul, gate and up as one (N = 2H; 2x FLOPs)", TimeMs([&] {
                       up13_cudnn.Run(x.data(), w13.data(), first_row.data(), h13.data());
                     }),
                     2 * flops});
  } else {
    std::printf("[grouped gemm] cuDNN rows left out: %s\n", why.c_str());
  }
  std::printf("[grouped gemm] %d experts x %d rows, d %d, hidden %d, bf16 operands (cuDNN %zu):\n",
              E, rows, d, H, CudnnVersion());
  for (const Row& r : table) {
    std::printf("  %-68s %7.3f ms  %6.1f TFLOP/s\n", r.what, r.ms, r.flops / (r.ms * 1e-3) / 1e12);
    EXPECT_GT(r.ms, 0.0) << r.what;
  }
  const std::vector<float> out = dw.Download();
  for (size_t i = 0; i < out.size(); i += 4099) ASSERT_TRUE(std::isfinite(out[i])) << i;
}

}  // namespace
}  // namespace moelab::cuda
