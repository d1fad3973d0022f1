// The device-shaped grouped GEMM's own source (kernels/cuda/grouped_gemm_device.cuh) run on the
// CPU under tests/cuda_kernels/emulation/cuda_emulation.h: the shape kernel's problems and tile
// prefix from device-style offsets, the tile lookup, and every expert product of the forward and
// backward (ragged experts, an empty one, partial tiles in M, N and K, rows before offsets[0])
// against a CPU reference that forms each output as the kernel's K loop does, one fp32 sum in k
// order, so the comparison is bit for bit. The weight gradients (grouped along K) are also run on
// other persistent grids: their bits must not depend on the schedule. What this cannot show:
// the hardware's mma rounding, cp.async/ldmatrix timing, speed (the GPU tests
// CudaDeviceGroupedGemm.* and CudaGroupedGemmBench.* do).
// clang-format off
// The emulation first: it replaces the CUDA primitives the kernel header uses.
#include "tests/cuda_kernels/emulation/cuda_emulation.h"
#include "kernels/cuda/grouped_gemm_device.cuh"
// clang-format on

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "tests/cuda_kernels/emulation_test_util.h"

namespace moelab::cuda::emulation_test {
namespace {

using ggemm::ExpertTensors;
using ggemm::Op;
using ggemm::Problem;

float F(bf16 x) { return __bfloat162float(x); }

// Runs the shape kernel for op (one block, as RunProduct launches it).
void Shape(Op op, const ExpertTensors& t, std::vector<Problem>* problems,
           std::vector<int>* tile_begin) {
  problems->assign(t.experts, Problem{});
  tile_begin->assign(t.experts + 1, -1);
  emu::Launch(dim3(1), ggemm::kShapeThreads, 0,
              [&] { ggemm::ShapeKernel(op, t, problems->data(), tile_begin->data()); });
}

// The shape kernel, then the persistent GEMM on `blocks` blocks.
template <Op kOp>
void RunProduct(const ExpertTensors& t, int blocks) {
  std::vector<Problem> problems;
  std::vector<int> tile_begin;
  Shape(kOp, t, &problems, &tile_begin);
  emu::Launch(dim3(blocks), ggemm::kThreads, ggemm::kSmemBytes, [&] {
    ggemm::GroupedGemmKernel<kOp>(problems.data(), tile_begin.data(), t.experts);
  });
}

TEST(DeviceGroupedGemmEmulation, ShapeKernelWritesEachExpertsProblemAndTilePrefix) {
  // Offsets as the dispatch plan leaves them, not starting at 0 (MoeExpertsBackward's scratch is
  // relative to offsets[0]); expert 1 empty, expert 2 over two row tiles.
  const std::vector<int64_t> offsets = {16, 56, 56, 256, 264};
  const int E = 4, d = 40, H = 200;
  ExpertTensors t{};
  t.offsets = offsets.data(), t.experts = E, t.d = d, t.hidden = H;
  // Fake, never dereferenced bases: only their arithmetic is checked.
  std::vector<bf16> base(1);
  bf16* b = base.data();
  t.xe = b + 1000, t.w1 = b + 2000, t.w3 = b + 3000, t.w2 = b + 4000, t.dye = b + 5000;
  t.h1 = b + 6000, t.h3 = b + 7000, t.act = b + 8000, t.ye = b + 9000, t.dh = b + 10000;
  t.dxe = b + 11000;
  float f = 0;
  t.dw1 = &f + 100, t.dw3 = &f + 200, t.dw2 = &f + 300;
  const int64_t w = int64_t(H) * d;

  std::vector<Problem> p;
  std::vector<int> begin;
  Shape(Op::kGateUp, t, &p, &begin);
  // Tiles: ceil(m/128) × ceil(H/64) = 4 × (1, 0, 2, 1).
  EXPECT_EQ(begin, (std::vector<int>{0, 4, 4, 12, 16}));
  EXPECT_EQ(p[2].m, 200);
  EXPECT_EQ(p[2].n, H);
  EXPECT_EQ(p[2].k, d);
  EXPECT_EQ(p[2].tiles_m, 2);
  EXPECT_EQ(p[1].m, 0);
  EXPECT_EQ(p[1].tiles_m, 0);
  EXPECT_EQ(p[2].a, t.xe + 56 * d);
  EXPECT_EQ(p[2].b, t.w1 + 2 * w);
  EXPECT_EQ(p[2].b2, t.w3 + 2 * w);
  EXPECT_EQ(p[2].c, t.h1 + 56 * H);
  EXPECT_EQ(p[2].c2, t.h3 + 56 * H);
  EXPECT_EQ(p[2].c3, t.act + 56 * H);
  EXPECT_EQ(p[2].ldc, H);

  Shape(Op::kDact, t, &p, &begin);
  // dh rows relative to offsets[0] = 16; [rows, 2H].
  EXPECT_EQ(p[3].c, t.dh + (256 - 16) * 2 * H);
  EXPECT_EQ(p[3].c2, t.dh + (256 - 16) * 2 * H + H);
  EXPECT_EQ(p[3].h1, t.h1 + 256 * H);
  EXPECT_EQ(p[3].b, t.w2 + 3 * w);
  EXPECT_EQ(p[3].ldb, H);
  EXPECT_EQ(begin, (std::vector<int>{0, 2, 2, 6, 8}));  // ceil(m/128) × ceil(200/128)

  Shape(Op::kDx, t, &p, &begin);
  EXPECT_EQ(p[0].k, 2 * H);
  EXPECT_EQ(p[0].b_split, H);
  EXPECT_EQ(p[0].a, t.dh);
  EXPECT_EQ(p[2].c, t.dxe + 56 * d);

  Shape(Op::kWgrad13, t, &p, &begin);
  // Grouped along K: every expert has the whole [2H, d] grid, the empty one too (it writes zeros).
  EXPECT_EQ(begin, (std::vector<int>{0, 4, 8, 12, 16}));
  EXPECT_EQ(p[1].k, 0);
  EXPECT_EQ(p[2].k, 200);
  EXPECT_EQ(p[2].m, 2 * H);
  EXPECT_EQ(p[2].c, t.dw1 + 2 * w);
  EXPECT_EQ(p[2].c2, t.dw3 + 2 * w);
  EXPECT_EQ(p[2].c_split, H);
  EXPECT_EQ(p[2].b, t.xe + 56 * d);

  Shape(Op::kWgrad2, t, &p, &begin);
  EXPECT_EQ(begin, (std::vector<int>{0, 2, 4, 6, 8}));  // ceil(40/128) × ceil(200/128)
  EXPECT_EQ(p[3].a, t.dye + 256 * d);
  EXPECT_EQ(p[3].b, t.act + 256 * H);
  EXPECT_EQ(p[3].c, t.dw2 + 3 * w);
}

TEST(DeviceGroupedGemmEmulation, TileLookupVisitsEveryTileOfEveryExpertOnce) {
  // Experts with 3, 0, 0, 5, 0, 1 tiles: the lookup must skip the empty ones and give each tile's
  // place in its expert's grid, M fastest.
  const std::vector<int> tiles = {3, 0, 0, 5, 0, 1};
  const std::vector<int> tiles_m = {3, 1, 1, 5, 4, 1};
  std::vector<int> begin = {0};
  for (int n : tiles) begin.push_back(begin.back() + n);
  const int groups = static_cast<int>(tiles.size());
  int tile = 0;
  for (int g = 0; g < groups; ++g) {
    for (int local = 0; local < tiles[g]; ++local, ++tile) {
      EXPECT_EQ(ggemm::GroupOf(begin.data(), groups, tile), g) << tile;
      const ggemm::TileCoord c = ggemm::LocateTile(begin.data() + g, 1, tiles_m[g], tile);
      EXPECT_EQ(c.tm, local % tiles_m[g]) << tile;
      EXPECT_EQ(c.tn, local / tiles_m[g]) << tile;
    }
  }
  EXPECT_EQ(tile, begin.back());
}

// The experts' tensors, the kernels' outputs (sentinel-filled, so a stray or a missing write
// shows), and the CPU reference.
struct Experts {
  std::vector<int64_t> offsets;
  int E, d, H;
  int64_t R;  // rows of the dispatched buffers: offsets[E]
  std::vector<bf16> xe, w1, w3, w2, dye;
  std::vector<bf16> h1, h3, act, ye, dh, dxe;
  std::vector<float> dw1, dw3, dw2;

  Experts(std::vector<int64_t> off, int d_, int H_) : offsets(std::move(off)), d(d_), H(H_) {
    E = static_cast<int>(offsets.size()) - 1;
    R = offsets[E];
    const int64_t w = int64_t(E) * H * d;
    xe = ToBf16(Random(R * d, 1));
    w1 = ToBf16(Random(w, 2, -0.5f, 0.5f));
    w3 = ToBf16(Random(w, 3, -0.5f, 0.5f));
    w2 = ToBf16(Random(w, 4, -0.5f, 0.5f));
    dye = ToBf16(Random(R * d, 5));
    const bf16 sentinel = __float2bfloat16(-77.0f);
    h1.assign(R * H, sentinel), h3 = h1, act = h1, ye.assign(R * d, sentinel), dxe = ye;
    dh.assign((R - offsets[0]) * 2 * H, sentinel);
    dw1.assign(w, -77.0f), dw3 = dw1, dw2 = dw1;
  }
  ExpertTensors Tensors() {
    ExpertTensors t{};
    t.offsets = offsets.data(), t.experts = E, t.d = d, t.hidden = H;
    t.xe = xe.data(), t.w1 = w1.data(), t.w3 = w3.data(), t.w2 = w2.data(), t.dye = dye.data();
    t.h1 = h1.data(), t.h3 = h3.data(), t.act = act.data(), t.ye = ye.data(), t.dh = dh.data();
    t.dxe = dxe.data(), t.dw1 = dw1.data(), t.dw3 = dw3.data(), t.dw2 = dw2.data();
    return t;
  }
};

// Σ_k a[k·sa]·b[k·sb] in fp32, k in order: the kernel's K loop (its zero padding adds +0).
float Dot(const bf16* a, int64_t sa, const bf16* b, int64_t sb, int64_t k) {
  float s = 0.0f;
  for (int64_t i = 0; i < k; ++i) s += F(a[i * sa]) * F(b[i * sb]);
  return s;
}

// The reference of every product, from the same inputs (and, for the backward, the reference
// forward's h1, h3, act); rows outside the experts keep the sentinel.
Experts Reference(const Experts& in) {
  Experts r = in;
  const int d = in.d, H = in.H;
  const int64_t w = int64_t(H) * d;
  for (int e = 0; e < in.E; ++e) {
    const bf16 *w1 = in.w1.data() + e * w, *w3 = in.w3.data() + e * w, *w2 = in.w2.data() + e * w;
    for (int64_t row = in.offsets[e]; row < in.offsets[e + 1]; ++row) {
      const bf16* x = in.xe.data() + row * d;
      for (int j = 0; j < H; ++j) {
        r.h1[row * H + j] = __float2bfloat16(Dot(x, 1, w1 + j * d, 1, d));
        r.h3[row * H + j] = __float2bfloat16(Dot(x, 1, w3 + j * d, 1, d));
        swiglu::ActAt(r.h1.data(), r.h3.data(), r.act.data(), row * H + j, row * H + j);
      }
      for (int c = 0; c < d; ++c) {
        r.ye[row * d + c] = __float2bfloat16(Dot(r.act.data() + row * H, 1, w2 + c * H, 1, H));
      }
      const bf16* dy = in.dye.data() + row * d;
      bf16* dh = r.dh.data() + (row - in.offsets[0]) * 2 * H;
      for (int j = 0; j < H; ++j) {
        const bf16 dact = __float2bfloat16(Dot(dy, 1, w2 + j, H, d));
        swiglu::ActBackwardAt(r.h1.data() + row * H + j, r.h3.data() + row * H + j, &dact, dh + j,
                              dh + H + j, 0, 0);
      }
    }
    for (int64_t row = in.offsets[e]; row < in.offsets[e + 1]; ++row) {
      const bf16* dhr = r.dh.data() + (row - in.offsets[0]) * 2 * H;
      for (int c = 0; c < d; ++c) {
        // One sum over k < 2H: dh1·W1 then dh3·W3 in the same accumulator.
        float s = Dot(dhr, 1, w1 + c, d, H);
        for (int k = 0; k < H; ++k) s += F(dhr[H + k]) * F(w3[k * d + c]);
        r.dxe[row * d + c] = __float2bfloat16(s);
      }
    }
    const int64_t r0 = in.offsets[e], m = in.offsets[e + 1] - r0;
    const bf16* dh0 = r.dh.data() + (r0 - in.offsets[0]) * 2 * H;
    for (int i = 0; i < H; ++i)
      for (int c = 0; c < d; ++c) {
        r.dw1[e * w + i * d + c] = Dot(dh0 + i, 2 * H, in.xe.data() + r0 * d + c, d, m);
        r.dw3[e * w + i * d + c] = Dot(dh0 + H + i, 2 * H, in.xe.data() + r0 * d + c, d, m);
      }
    for (int c = 0; c < d; ++c)
      for (int j = 0; j < H; ++j) {
        r.dw2[e * w + c * H + j] =
            Dot(in.dye.data() + r0 * d + c, d, r.act.data() + r0 * H + j, H, m);
      }
  }
  return r;
}

template <typename T>
void ExpectSame(const std::vector<T>& got, const std::vector<T>& want, const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int bad = 0;
  for (size_t i = 0; i < got.size() && bad < 6; ++i) {
    const float g = static_cast<float>(got[i]), w = static_cast<float>(want[i]);
    if (std::memcmp(&got[i], &want[i], sizeof(T)) != 0) {
      ADD_FAILURE() << what << "[" << i << "] = " << g << ", want " << w;
      ++bad;
    }
  }
}

TEST(DeviceGroupedGemmEmulation, EveryExpertProductMatchesTheReferenceBitForBit) {
  // Three experts over rows 5 … 82 (rows 0–4 belong to no expert here): 40 rows, none, 37 rows.
  // d 48 and H 72: partial tiles in every dimension (the gate-and-up tile's 64 columns, K = 48
  // not a multiple of 32, 2H = 144 over two row tiles of the weight gradients).
  Experts x({5, 45, 45, 82}, 48, 72);
  const Experts want = Reference(x);
  ExpertTensors t = x.Tensors();
  RunProduct<Op::kGateUp>(t, 3);
  RunProduct<Op::kDown>(t, 2);
  ExpectSame(x.h1, want.h1, "h1");
  ExpectSame(x.h3, want.h3, "h3");
  ExpectSame(x.act, want.act, "act");
  ExpectSame(x.ye, want.ye, "ye");
  // The backward from the kernels' own forward (equal to the reference's when the above pass).
  RunProduct<Op::kDact>(t, 2);
  ExpectSame(x.dh, want.dh, "dh1|dh3");
  RunProduct<Op::kDx>(t, 1);
  ExpectSame(x.dxe, want.dxe, "dxe");
  RunProduct<Op::kWgrad13>(t, 4);
  RunProduct<Op::kWgrad2>(t, 2);
  ExpectSame(x.dw1, want.dw1, "dW1");
  ExpectSame(x.dw3, want.dw3, "dW3");
  ExpectSame(x.dw2, want.dw2, "dW2");
  // The empty expert's gradients were overwritten with zeros, not left as the sentinel.
  const int64_t w = int64_t(x.H) * x.d;
  for (int64_t i = 0; i < w; i += 97) {
    EXPECT_EQ(x.dw1[w + i], 0.0f) << i;
    EXPECT_EQ(x.dw2[w + i], 0.0f) << i;
  }
}

TEST(DeviceGroupedGemmEmulation, WeightGradientBitsDoNotDependOnTheGrid) {
  // K-grouped: each output tile is one block's sequential sum over the expert's rows, so 1, 2 or
  // 7 persistent blocks (tiles visited in other orders and by other blocks) give the same bits.
  Experts x({0, 70, 75}, 16, 24);
  x.dh = ToBf16(Random(x.dh.size(), 6));  // the products' inputs: any values will do
  ExpertTensors t = x.Tensors();
  std::vector<std::vector<float>> runs;
  for (int blocks : {1, 2, 7}) {
    x.dw1.assign(x.dw1.size(), -1.0f);
    x.dw3.assign(x.dw3.size(), -1.0f);
    RunProduct<Op::kWgrad13>(t, blocks);
    std::vector<float> both = x.dw1;
    both.insert(both.end(), x.dw3.begin(), x.dw3.end());
    runs.push_back(both);
  }
  EXPECT_TRUE(SameBits(runs[0], runs[1]));
  EXPECT_TRUE(SameBits(runs[0], runs[2]));
  // And the bits are the reference's sequential sum over the expert's rows.
  const int64_t w = int64_t(x.H) * x.d;
  for (int e = 0; e < x.E; ++e) {
    const int64_t r0 = x.offsets[e], m = x.offsets[e + 1] - r0;
    for (int i = 0; i < x.H; ++i)
      for (int c = 0; c < x.d; ++c) {
        const float want =
            Dot(x.dh.data() + r0 * 2 * x.H + x.H + i, 2 * x.H, x.xe.data() + r0 * x.d + c, x.d, m);
        ASSERT_EQ(x.dw3[e * w + i * x.d + c], want) << e << " " << i << " " << c;
      }
  }
}

}  // namespace
}  // namespace moelab::cuda::emulation_test
