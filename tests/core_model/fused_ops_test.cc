// The fused seam ops of the CPU backend (core/model/backend.h) against the separate ops they
// replace, bit for bit: AddRmsNorm = Add then RmsNorm; RopeQk = Rope on q's heads then on k's.
// The model relies on this for its CPU results to stay those of the unfused code (its GPU twin
// checks are tests/cuda_kernels/ops_test.cc and fused_emulation_test.cc).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "core/model/backend.h"
#include "kernels/cpu/rope.h"

namespace moelab {
namespace {

template <typename T>
std::vector<T> Random(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> u(-2.0, 2.0);
  std::vector<T> v(n);
  for (T& x : v) x = static_cast<T>(u(rng));
  return v;
}

template <typename T>
bool SameBits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), sizeof(T) * a.size()) == 0;
}

template <typename T>
void CheckAddRmsNorm(int n, int d) {
  SCOPED_TRACE(::testing::Message() << "n " << n << " d " << d << " bytes " << sizeof(T));
  auto be = MakeCpuBackend<T>();
  const size_t nd = static_cast<size_t>(n) * d;
  const auto a = Random<T>(nd, 1), b = Random<T>(nd, 2), gain = Random<T>(d, 3);
  const double eps = 1e-6;
  // Separate: Add, then RmsNorm.
  std::vector<T> sum1(nd), y1(nd), r1(n);
  be->Add(a.data(), b.data(), sum1.data(), nd);
  be->RmsNorm(sum1.data(), gain.data(), n, d, eps, y1.data(), r1.data());
  // Fused, into a fresh sum, and in place on a (the sum may alias an operand).
  std::vector<T> sum2(nd), y2(nd), r2(n);
  be->AddRmsNorm(a.data(), b.data(), sum2.data(), gain.data(), n, d, eps, y2.data(), r2.data());
  EXPECT_TRUE(SameBits(sum2, sum1));
  EXPECT_TRUE(SameBits(y2, y1));
  EXPECT_TRUE(SameBits(r2, r1));
  std::vector<T> inplace = a, y3(nd), r3(n);
  be->AddRmsNorm(inplace.data(), b.data(), inplace.data(), gain.data(), n, d, eps, y3.data(),
                 r3.data());
  EXPECT_TRUE(SameBits(inplace, sum1));
  EXPECT_TRUE(SameBits(y3, y1));
  EXPECT_TRUE(SameBits(r3, r1));
  // And it is an RMSNorm of a + b at all (not merely equal to a broken composition).
  const double ss = [&] {
    double s = 0;
    for (int j = 0; j < d; ++j) s += static_cast<double>(sum1[j]) * sum1[j];
    return s;
  }();
  EXPECT_NEAR(static_cast<double>(y2[0]),
              static_cast<double>(a[0] + b[0]) / std::sqrt(ss / d + eps) * gain[0], 1e-5);
}

// Small rows (serial loops) and a batch above the kernels' parallel thresholds.
TEST(FusedOps, AddRmsNormIsAddThenRmsNormBitForBit) {
  CheckAddRmsNorm<float>(7, 40);
  CheckAddRmsNorm<float>(300, 256);
  CheckAddRmsNorm<double>(7, 40);
  CheckAddRmsNorm<double>(300, 256);
}

template <typename T>
void CheckRopeQk(int n, int seq, int rot, int ldq, cpu::RopeSlice<T> q, int ldk,
                 cpu::RopeSlice<T> k, bool same_buffer) {
  auto be = MakeCpuBackend<T>();
  std::vector<T> cs(static_cast<size_t>(seq) * rot / 2), sn(cs.size());
  cpu::RopeTables(seq, rot, 10000.0, cs.data(), sn.data());
  for (bool inverse : {false, true}) {
    SCOPED_TRACE(inverse ? "inverse" : "forward");
    const auto x0 = Random<T>(static_cast<size_t>(n) * ldq, 4);
    const auto y0 = Random<T>(static_cast<size_t>(n) * ldk, 5);
    std::vector<T> x1 = x0, y1 = y0, x2 = x0, y2 = y0;
    T* k1 = same_buffer ? x1.data() : y1.data();
    T* k2 = same_buffer ? x2.data() : y2.data();
    be->Rope(x1.data(), n, seq, q.ld, q.heads, q.head_stride, q.offset, rot, cs.data(), sn.data(),
             inverse);
    be->Rope(k1, n, seq, k.ld, k.heads, k.head_stride, k.offset, rot, cs.data(), sn.data(),
             inverse);
    q.x = x2.data();
    k.x = k2;
    be->RopeQk(q, k, n, seq, rot, cs.data(), sn.data(), inverse);
    EXPECT_TRUE(SameBits(x2, x1));
    EXPECT_TRUE(SameBits(y2, y1));
    EXPECT_FALSE(SameBits(x2, x0));  // it did rotate
  }
}

// The model's two layouts: GQA's q | k | v rows (both slices in one buffer; 4 q heads, 2 k heads
// of 16) and MLA's q^R columns of [q^C | q^R] rows with the shared rotary key of [c_kv | k^R].
TEST(FusedOps, RopeQkIsTwoRopesBitForBit) {
  const int seq = 9, n = 3 * seq;
  CheckRopeQk<float>(n, seq, 16, 128, {nullptr, 128, 4, 16, 0}, 128, {nullptr, 128, 2, 16, 64},
                     true);
  CheckRopeQk<double>(n, seq, 16, 128, {nullptr, 128, 4, 16, 0}, 128, {nullptr, 128, 2, 16, 64},
                      true);
  // MLA: H 3, dn 8, dr 4: qb rows of 3·12, q^R from column 24; kva rows of rkv 10 + dr 4.
  CheckRopeQk<float>(n, seq, 4, 36, {nullptr, 36, 3, 4, 24}, 14, {nullptr, 14, 1, 4, 10}, false);
  CheckRopeQk<double>(n, seq, 4, 36, {nullptr, 36, 3, 4, 24}, 14, {nullptr, 14, 1, 4, 10}, false);
}

}  // namespace
}  // namespace moelab
