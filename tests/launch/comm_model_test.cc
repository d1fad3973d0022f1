// The analytic communication model: ring all-reduce arithmetic, which traffic each layout
// creates, memory per rank under ZeRO-1, and the K2-like shape it tabulates.
#include "analysis/comm_model.h"

#include <gtest/gtest.h>

namespace moelab::analysis {
namespace {

CommShape Toy() {
  CommShape s;
  s.params_total = 1000;
  s.expert_params = 600;
  s.muon_params = 900;
  s.tokens_per_step = 64;
  s.moe_layers = 2;
  s.d_model = 8;
  s.top_k = 2;
  s.experts = 4;
  s.layers = 2;
  s.heads = 2;
  s.muon = false;
  return s;
}

TEST(CommModelTest, RingAllReduce) {
  EXPECT_DOUBLE_EQ(RingAllReduceWire(100, 1), 0);
  EXPECT_DOUBLE_EQ(RingAllReduceWire(100, 2), 100);  // 2 (p-1)/p = 1
  EXPECT_DOUBLE_EQ(RingAllReduceWire(100, 4), 150);  // 1.5
  CommCost c;
  c.alpha_s = 1;
  c.beta_bytes_per_s = 10;
  EXPECT_DOUBLE_EQ(RingAllReduceTime(100, 4, c), 6 + 15);  // 2(p-1) α + wire / β
}

TEST(CommModelTest, TrafficPerLayout) {
  const CommShape s = Toy();
  // One rank: nothing moves.
  EXPECT_EQ(EstimateComm(s, {1, 1, false}).payload(), 0);
  // Pure data parallel: every gradient all-reduced over the world, no all-to-all.
  const CommEstimate dp = EstimateComm(s, {2, 1, false});
  EXPECT_DOUBLE_EQ(dp.dense_grad_payload, 400 * 4);
  EXPECT_DOUBLE_EQ(dp.expert_grad_payload, 600 * 4);
  EXPECT_DOUBLE_EQ(dp.a2a_payload, 0);
  EXPECT_DOUBLE_EQ(dp.gather_payload, 0);
  // Expert parallel 2 on 2 ranks: experts are not replicated (no expert all-reduce); tokens
  // travel: 4 exchanges × 2 layers × (64/2 tokens × top-2 × d 8 × 4 B), half leaves the rank.
  const CommEstimate ep = EstimateComm(s, {2, 2, false});
  EXPECT_DOUBLE_EQ(ep.expert_grad_payload, 0);
  EXPECT_DOUBLE_EQ(ep.a2a_payload, 4 * 2 * 32 * 2 * 8 * 4.0);
  EXPECT_DOUBLE_EQ(ep.a2a_wire, ep.a2a_payload / 2);
  // DP 2 × EP 2: expert shards all-reduced within their DP pair.
  const CommEstimate both = EstimateComm(s, {4, 2, false});
  EXPECT_DOUBLE_EQ(both.expert_grad_payload, 300 * 4);
  EXPECT_DOUBLE_EQ(both.expert_grad_wire, 300 * 4);
  EXPECT_DOUBLE_EQ(both.dense_grad_wire, 1.5 * 400 * 4);
  // ZeRO-1 adds the parameter gather and divides the optimizer state.
  const CommEstimate z = EstimateComm(s, {2, 1, true});
  EXPECT_DOUBLE_EQ(z.gather_payload, 1000 * 4);
  EXPECT_DOUBLE_EQ(z.optimizer_bytes, dp.optimizer_bytes / 2);
  EXPECT_DOUBLE_EQ(dp.optimizer_bytes, 2 * 1000 * 4);  // AdamW: two moments
  // ZeRO-1 (with distributed Muon) reduce-scatters the gradients to their owners and
  // all-gathers the parameters: the bytes of one all-reduce, in two halves.
  EXPECT_DOUBLE_EQ(z.wire(), dp.wire());
  EXPECT_DOUBLE_EQ(z.dense_grad_wire, z.gather_wire * 400 / 1000);
  CommShape m = s;
  m.muon = true;
  EXPECT_DOUBLE_EQ(EstimateComm(m, {2, 1, true}).wire(), dp.wire());
  // Without ZeRO-1 Muon runs on every rank after the all-reduce: nothing is gathered.
  EXPECT_DOUBLE_EQ(EstimateComm(m, {2, 1, false}).gather_payload, 0);
  EXPECT_GT(dp.time_s, 0);
}

TEST(CommModelTest, K2LikeShape) {
  const CommShape s = CommShapeOf(K2LikeConfig());
  // Kimi K2: 1.04 T total parameters, 384 experts of which 8 (+1 shared) active.
  EXPECT_NEAR(s.params_total / 1e12, 1.04, 0.03);
  EXPECT_EQ(s.moe_layers, 60);
  EXPECT_EQ(s.experts, 384);
  // Expert parallelism shrinks what a rank holds; ZeRO-1 its optimizer state.
  const CommEstimate a = EstimateComm(s, {64, 8, false}), b = EstimateComm(s, {64, 64, true});
  EXPECT_LT(b.param_bytes, a.param_bytes / 4);
  EXPECT_LT(b.optimizer_bytes, a.optimizer_bytes / 8);
  // ZeRO-1 at DP 8 × EP 8: each rank keeps an eighth of its experts' state or less.
  EXPECT_LT(EstimateComm(s, {64, 8, true}).optimizer_bytes, a.optimizer_bytes / 7.9);
  const std::string t = K2ScalingTable();
  EXPECT_NE(t.find("| 1024 | 64 | 16 | 0.07 |"), std::string::npos) << t;
}

}  // namespace
}  // namespace moelab::analysis
