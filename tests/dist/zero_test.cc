// The ZeRO-1 partition of the parameter arena (no MPI needed).
#include "core/dist/zero.h"

#include <gtest/gtest.h>

#include "core/config.h"
#include "core/model/model.h"
#include "tests/common/tiny_configs.h"

namespace moelab {
namespace {

TEST(ZeroPartition, ContiguousBalancedAndNeverInsideAMuonMatrix) {
  RunConfig c = test::SmallMoeConfig();  // with 2 heads and eight experts in both layers
  c.model.heads = 2;
  c.moe.experts_total = 8;
  c.moe.dense_layers = 0;
  Model<float> model(c);
  const auto& infos = model.param_infos();
  const size_t n = model.num_params();
  size_t largest = 0;
  for (const ParamInfo& p : infos) {
    if (p.is_hidden_matrix()) largest = std::max<size_t>(largest, size_t(p.rows) * p.cols);
  }
  for (int parts : {1, 2, 3, 4, 7}) {
    for (bool muon : {false, true}) {
      const std::vector<ArenaRange> r = PartitionArena(infos, n, parts, muon);
      ASSERT_EQ(r.size(), static_cast<size_t>(parts));
      EXPECT_EQ(r.front().begin, 0u);
      EXPECT_EQ(r.back().end, n);
      size_t restricted = 0;
      for (int i = 0; i < parts; ++i) {
        if (i > 0) EXPECT_EQ(r[i].begin, r[i - 1].end);
        // Size-balanced: off the even share by at most half a matrix (exact without Muon).
        const double share = static_cast<double>(n) / parts;
        EXPECT_LE(std::abs(static_cast<double>(r[i].size()) - share), muon ? largest + 1.0 : 1.0)
            << "parts " << parts << " range " << i;
        for (const ParamInfo& p : RestrictParams(infos, r[i], muon)) {
          restricted += p.size();
          EXPECT_GE(p.offset, r[i].begin);
          EXPECT_LE(p.offset + p.size(), r[i].end);
          if (muon && p.is_hidden_matrix()) {
            const size_t m = size_t(p.rows) * p.cols;
            // Whole matrices of the original tensor.
            for (const ParamInfo& q : infos) {
              if (q.name == p.name) EXPECT_EQ((p.offset - q.offset) % m, 0u) << p.name;
            }
          }
        }
      }
      EXPECT_EQ(restricted, n);
    }
  }
}

TEST(ZeroPartition, RangeSquaresAddUpToTheNorm) {
  std::vector<float> g(200001);
  for (size_t i = 0; i < g.size(); ++i) g[i] = static_cast<float>((i % 13) - 6) * 1e-3f;
  double whole = RangeSquares(g.data(), {0, g.size()});
  double parts = RangeSquares(g.data(), {0, 70000}) + RangeSquares(g.data(), {70000, g.size()});
  EXPECT_NEAR(whole, parts, 1e-12 * whole);
}

}  // namespace
}  // namespace moelab
