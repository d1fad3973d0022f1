// The CUDA Newton–Schulz's own kernels and step sequence (kernels/cuda/newton_schulz_kernels.cuh)
// run on the CPU under tests/cuda_kernels/emulation/cuda_emulation.h, with a CPU GEMM in place of
// cuBLAS: the symmetric path (lower tiles only, mirrored) gives bit for bit what whole products
// give, and both match the CPU Newton–Schulz (kernels/cpu/newton_schulz.h). What only a GPU can
// show (tests/cuda_kernels/optim_test.cc): cuBLAS's pointer-array GEMMs on these pointers.
// clang-format off
// The emulation first: it replaces the CUDA primitives the kernel header uses.
#include "tests/cuda_kernels/emulation/cuda_emulation.h"
#include "kernels/cuda/newton_schulz_kernels.cuh"
// clang-format on

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <type_traits>
#include <vector>

#include "kernels/cpu/newton_schulz.h"

namespace moelab::cuda::ns {
namespace {

using bf16 = __nv_bfloat16;

float Wide(float x) { return x; }
float Wide(bf16 x) { return __bfloat162float(x); }
template <typename T>
T Narrow(float x) {
  if constexpr (std::is_same_v<T, float>) {
    return x;
  } else {
    return __float2bfloat16(x);
  }
}

// Row-major C = alpha·op(A)·op(B) + beta·C with an fp32 sum in k order (as gemm.h's convention).
template <typename T>
void CpuGemm(bool ta, bool tb, int m, int n, int k, float alpha, const T* a, int lda, const T* b,
             int ldb, float beta, T* c, int ldc) {
  for (int i = 0; i < m; ++i) {
    for (int j = 0; j < n; ++j) {
      float s = 0;
      for (int l = 0; l < k; ++l) {
        s +=
            Wide(ta ? a[l * lda + i] : a[i * lda + l]) * Wide(tb ? b[j * ldb + l] : b[l * ldb + j]);
      }
      const float old = beta != 0 ? beta * Wide(c[i * ldc + j]) : 0.0f;
      c[i * ldc + j] = Narrow<T>(alpha * s + old);
    }
  }
}

// The executor of NewtonSchulzSteps on the emulation: kernels through emu::Launch (few threads,
// so the grid-stride loops wrap), GEMMs on the CPU.
template <typename T>
struct EmuExec {
  std::vector<void*> pointers;
  int tile_gemms = 0, whole_gemms = 0;

  void Normalize(const T* in, T* x, const Plan& p, double eps) {
    emu::Launch(dim3(p.batch), 64, 0, [&] { NormalizeKernel(in, x, p.mn, eps); });
  }
  void** Pointers(int64_t count) {
    pointers.assign(count, nullptr);
    return pointers.data();
  }
  void TilePointers(const TileJob& job, const Plan& p, void** a, void** b, void** c) {
    emu::Launch(dim3(2), 32, 0, [&] { TilePointersKernel<T>(job, p.pairs, p.count(), a, b, c); });
  }
  void Mirror(T* a, const Plan& p) {
    emu::Launch(dim3(2), 64, 0, [&] { MirrorKernel(a, p.m, p.tile, p.batch * p.mm); });
  }
  void Combine(T* q, const T* a, const Plan& p, float ca, float cb) {
    emu::Launch(dim3(2), 64, 0, [&] { CombineKernel(q, a, p.m, p.tile, p.batch * p.mm, ca, cb); });
  }
  void GemmStrided(bool ta, bool tb, int m, int n, int k, float alpha, const T* a, int lda,
                   int64_t sa, const T* b, int ldb, int64_t sb, float beta, T* c, int ldc,
                   int64_t sc, int batch) {
    ++whole_gemms;
    for (int i = 0; i < batch; ++i) {
      CpuGemm(ta, tb, m, n, k, alpha, a + i * sa, lda, b + i * sb, ldb, beta, c + i * sc, ldc);
    }
  }
  void GemmTiles(bool ta, bool tb, int m, int n, int k, float alpha, void** a, int lda, void** b,
                 int ldb, void** c, int ldc, int64_t count) {
    ++tile_gemms;
    for (int64_t e = 0; e < count; ++e) {
      CpuGemm(ta, tb, m, n, k, alpha, static_cast<const T*>(a[e]), lda, static_cast<const T*>(b[e]),
              ldb, 0.0f, static_cast<T*>(c[e]), ldc);
    }
  }
};

template <typename T>
std::vector<T> RunNs(const std::vector<T>& in, int batch, int rows, int cols, int steps,
                     int min_tile, int* tile_gemms) {
  const Plan p = MakePlan(batch, rows, cols, min_tile);
  std::vector<T> ws(static_cast<size_t>(batch) * (p.mn + 2 * p.mm)), out(in.size());
  EmuExec<T> e;
  NewtonSchulzSteps(e, in.data(), out.data(), p, steps, ws.data(), cpu::kNsEps,
                    static_cast<float>(cpu::kNsA), static_cast<float>(cpu::kNsB),
                    static_cast<float>(cpu::kNsC));
  *tile_gemms = e.tile_gemms;
  return out;
}

struct Shape {
  int rows, cols, tiles;  // tiles per side at min_tile 8
};

TEST(NsEmulation, PlanCutsTheGramMatrixIntoAlignedTiles) {
  EXPECT_EQ(MakePlan(1, 768, 2048, 128).tile, 128);
  EXPECT_EQ(MakePlan(1, 768, 2048, 128).pairs, 21);  // 6 tiles per side
  EXPECT_EQ(MakePlan(1, 4096, 1024, 128).tiles, 8);  // tall: the small side
  EXPECT_EQ(MakePlan(1, 200, 512, 128).tiles, 1);    // no multiple of 8 ≥ 128 divides 200 twice
  EXPECT_EQ(MakePlan(1, 96, 96, 128).tiles, 1);      // too small to split
  int i, j;
  for (int pair = 0, want_i = 0; want_i < 5; ++want_i) {
    for (int want_j = 0; want_j <= want_i; ++want_j, ++pair) {
      PairOf(pair, &i, &j);
      ASSERT_EQ(i, want_i);
      ASSERT_EQ(j, want_j);
    }
  }
}

// Wide, tall and square banks, split into 2–4 tiles per side.
TEST(NsEmulation, SymmetricTilesEqualWholeProductsAndMatchCpu) {
  const int batch = 2;
  for (const Shape s : {Shape{16, 40, 2}, Shape{40, 16, 2}, Shape{24, 24, 3}, Shape{32, 36, 4}}) {
    SCOPED_TRACE(std::to_string(s.rows) + "x" + std::to_string(s.cols));
    ASSERT_EQ(MakePlan(batch, s.rows, s.cols, 8).tiles, s.tiles);
    const size_t size = static_cast<size_t>(batch) * s.rows * s.cols;
    std::mt19937 rng(7);
    std::normal_distribution<float> normal;
    std::vector<float> in(size);
    for (float& v : in) v = normal(rng);
    int tiled_calls = 0, whole_calls = 0;
    const std::vector<float> tiled = RunNs(in, batch, s.rows, s.cols, 5, 8, &tiled_calls);
    const std::vector<float> whole = RunNs(in, batch, s.rows, s.cols, 5, 1 << 20, &whole_calls);
    EXPECT_EQ(tiled_calls, 10);  // two tile GEMMs per step
    EXPECT_EQ(whole_calls, 0);
    for (size_t i = 0; i < size; ++i) ASSERT_EQ(tiled[i], whole[i]) << i;
    std::vector<float> ref(size);
    cpu::NewtonSchulz(in.data(), ref.data(), batch, s.rows, s.cols);
    double diff = 0, scale = 0;
    for (size_t i = 0; i < size; ++i) {
      diff = std::max(diff, std::fabs(static_cast<double>(tiled[i]) - ref[i]));
      scale = std::max(scale, std::fabs(static_cast<double>(ref[i])));
    }
    EXPECT_LT(diff, 1e-4 * scale);
    // bf16 iterates: the same identity between the two paths.
    std::vector<bf16> in16(size);
    for (size_t i = 0; i < size; ++i) in16[i] = __float2bfloat16(in[i]);
    const std::vector<bf16> t16 = RunNs(in16, batch, s.rows, s.cols, 5, 8, &tiled_calls);
    const std::vector<bf16> w16 = RunNs(in16, batch, s.rows, s.cols, 5, 1 << 20, &whole_calls);
    for (size_t i = 0; i < size; ++i) {
      ASSERT_EQ(__bfloat162float(t16[i]), __bfloat162float(w16[i])) << i;
    }
  }
}

// In place (the optimizer's call) with an odd and an even step count: the iterates ping-pong
// between out and the workspace and the last step lands in out.
TEST(NsEmulation, InPlaceEqualsOutOfPlace) {
  const int batch = 2, rows = 16, cols = 24;
  const Plan p = MakePlan(batch, rows, cols, 8);
  std::mt19937 rng(3);
  std::normal_distribution<float> normal;
  std::vector<float> in(static_cast<size_t>(batch) * rows * cols);
  for (float& v : in) v = normal(rng);
  for (const int steps : {4, 5}) {
    int calls = 0;
    const std::vector<float> want = RunNs(in, batch, rows, cols, steps, 8, &calls);
    std::vector<float> x = in, ws(static_cast<size_t>(batch) * (p.mn + 2 * p.mm));
    EmuExec<float> e;
    NewtonSchulzSteps(e, x.data(), x.data(), p, steps, ws.data(), cpu::kNsEps,
                      static_cast<float>(cpu::kNsA), static_cast<float>(cpu::kNsB),
                      static_cast<float>(cpu::kNsC));
    EXPECT_EQ(x, want) << steps << " steps";
  }
}

TEST(NsEmulation, ZeroStepsOnlyNormalises) {
  std::vector<float> in = {3, 0, 0, 4, 0, 0};  // ‖·‖ = 5
  int calls = 0;
  const std::vector<float> out = RunNs(in, 1, 2, 3, 0, 8, &calls);
  EXPECT_NEAR(out[0], 0.6f, 1e-6f);
  EXPECT_NEAR(out[3], 0.8f, 1e-6f);
}

}  // namespace
}  // namespace moelab::cuda::ns
