// AttentionNormGainRms: which gains count (attention inputs, not FFN or final norm) and the RMS.
#include "core/model/norm_gain_rms.h"

#include <gtest/gtest.h>

#include <cmath>

#include "tests/common/tiny_configs.h"

namespace moelab {
namespace {

RunConfig TinyWithQkNorm() {
  RunConfig c = test::TinyDenseConfig();
  c.model.heads = 2;
  c.model.qk_norm = true;
  return c;
}

TEST(NormGainRms, CountsOnlyAttentionInputGains) {
  Model<double> model(TinyWithQkNorm());
  int counted = 0;
  for (const ParamInfo& p : model.param_infos()) {
    const bool attention =
        p.kind == ParamKind::kNorm &&
        (p.name.find("attn_norm") != std::string::npos ||
         p.name.find("q_norm") != std::string::npos || p.name.find("k_norm") != std::string::npos);
    EXPECT_EQ(IsAttentionNormGain(p), attention) << p.name;
    counted += IsAttentionNormGain(p);
  }
  EXPECT_EQ(counted, 2 * 3);  // per layer: attn_norm, q_norm, k_norm
}

TEST(NormGainRms, IsTheRmsOverEveryCountedElement) {
  Model<double> model(TinyWithQkNorm());
  model.Init(1);
  // Gains start at 1.
  EXPECT_DOUBLE_EQ(AttentionNormGainRms(model.param_infos(), model.params()), 1.0);
  // Layer 0's attn_norm (16 elements) to 3, the FFN norms to 100 (not counted).
  size_t elements = 0;
  for (const ParamInfo& p : model.param_infos()) {
    if (IsAttentionNormGain(p)) elements += p.size();
    double v = 0;
    if (p.name == "layers.0.attn_norm") v = 3;
    if (p.kind == ParamKind::kNorm && p.name.find("ffn_norm") != std::string::npos) v = 100;
    if (v != 0)
      for (size_t i = 0; i < p.size(); ++i) model.params()[p.offset + i] = v;
  }
  const double expected = std::sqrt((16 * 9.0 + (elements - 16) * 1.0) / elements);
  EXPECT_NEAR(AttentionNormGainRms(model.param_infos(), model.params()), expected, 1e-12);
}

TEST(NormGainRms, NanWithoutAnyAttentionGain) {
  EXPECT_TRUE(std::isnan(AttentionNormGainRms<float>({}, nullptr)));
}

}  // namespace
}  // namespace moelab
