// The model's tensors against the analytic counts of core/flops.cc, for MHA, GQA, QK-norm and
// MLA (with and without query compression). num_params() is the length of the parameter ARENA:
// every tensor starts 64-byte aligned, so it exceeds the parameter count by the padding (the
// 16–40 "extra parameters" once seen for MLA); the count itself is the sum of the tensors.
#include <gtest/gtest.h>

#include <numeric>

#include "core/flops.h"
#include "core/model/model.h"
#include "tests/common/tiny_configs.h"

namespace moelab {
namespace {

RunConfig Base() {
  RunConfig c;
  c.model = {
      .vocab_size = 100, .d_model = 24, .layers = 3, .heads = 3, .ffn_hidden = 40, .seq_len = 16};
  test::UseMoe(&c.moe, {.experts = 6, .top_k = 2, .shared = 1, .hidden = 10, .dense_layers = 1});
  return c;
}

int64_t TensorSum(const Model<float>& m) {
  int64_t total = 0;
  for (const ParamInfo& p : m.param_infos()) total += static_cast<int64_t>(p.size());
  return total;
}

void ExpectCountsAgree(const RunConfig& c, const std::string& what) {
  ValidateConfig(c);
  Model<float> m(c);
  const int64_t tensors = TensorSum(m);
  EXPECT_EQ(tensors, CountParams(c).total) << what;
  // The arena is the tensors plus alignment padding: under 16 floats per tensor.
  const int64_t arena = static_cast<int64_t>(m.num_params());
  EXPECT_GE(arena, tensors) << what;
  EXPECT_LT(arena - tensors, 16 * static_cast<int64_t>(m.param_infos().size())) << what;
}

TEST(ParamCount, MhaGqaQkNormMatchTheAnalyticCount) {
  RunConfig c = Base();
  ExpectCountsAgree(c, "mha");
  c.model.heads = 4;
  c.model.kv_heads = 2;
  ExpectCountsAgree(c, "gqa");
  c.model.qk_norm = true;
  ExpectCountsAgree(c, "gqa + qk_norm");
  c.model.head_dim = 12;  // heads × head_dim = 48 ≠ d_model
  ExpectCountsAgree(c, "explicit head_dim");
  c.model.tie_embeddings = true;
  ExpectCountsAgree(c, "tied");
}

TEST(ParamCount, MlaMatchesTheAnalyticCount) {
  RunConfig c = Base();
  test::UseMla(&c.model, {.q_lora = 0, .kv_lora = 12, .nope = 6, .rope = 4, .v = 6});
  ExpectCountsAgree(c, "mla, no q compression");
  c.model.q_lora_rank = 10;
  ExpectCountsAgree(c, "mla with q_lora_rank");
  // The hand count for this shape, per layer: q_a 10·24 + q_a_norm 10 + q_b 10·3·10,
  // kv_a 24·(12 + 4) + kv_a_norm 12 + kv_b 12·3·(6 + 6), o 3·6·24.
  const int64_t attn = 240 + 10 + 300 + 384 + 12 + 432 + 432;
  const int64_t per_layer_norms = 2 * 24;
  const int64_t expert = 3 * 24 * 10;
  const int64_t want = 2 * 100 * 24 + 24 + 3 * (attn + per_layer_norms) + 3 * 24 * 40 +
                       2 * (24 * 6 + expert + 6 * expert);
  EXPECT_EQ(CountParams(c).total, want);
}

}  // namespace
}  // namespace moelab
