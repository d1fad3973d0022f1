// Whole-model checks: parameter layout, deterministic init, gradients vs finite differences
// under every architecture option, the loss and per-head max logits vs a naive reference
// forward, float vs double agreement, and bit-for-bit determinism.
#include "core/model/model.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "tests/common/tiny_configs.h"
#include "tests/core_model/gradcheck.h"

namespace moelab {
namespace {

using testing::RelErr;

using test::RandomTokens;
using test::UseMla;
using test::UseMoe;

// test::TinyDenseConfig() with logits spread far from uniform and untied embeddings.
RunConfig Tiny() {
  RunConfig c = test::TinyDenseConfig();
  c.model.init_std = 0.3;  // large enough that attention is far from uniform
  c.model.tie_embeddings = false;
  return c;
}

RunConfig TinyMoe() {
  RunConfig c = Tiny();
  UseMoe(&c.moe, {.experts = 4, .top_k = 2, .shared = 1, .hidden = 12, .dense_layers = 1});
  c.moe.router = "softmax";
  c.moe.balance = "aux_loss";
  c.moe.aux_loss_coef = 0.05;
  c.moe.route_scale = 1.5;
  return c;
}

TEST(ModelLayout, NamesKindsOffsetsAndAlignment) {
  RunConfig c = TinyMoe();
  c.model.kv_heads = 2;
  Model<float> model(c);
  const auto& ps = model.param_infos();
  std::vector<std::string> names;
  size_t total = 0;
  for (const ParamInfo& p : ps) {
    names.push_back(p.name);
    total += p.size();
    EXPECT_LE(p.offset + p.size(), model.num_params()) << p.name;
    if (p.name.ends_with(".wk") || p.name.ends_with(".wv")) continue;  // packed after wq
    EXPECT_EQ(p.offset * sizeof(float) % 64, 0u) << p.name;
  }
  const std::vector<std::string> want = {"embedding",
                                         "layers.0.attn_norm",
                                         "layers.0.attn.wq",
                                         "layers.0.attn.wk",
                                         "layers.0.attn.wv",
                                         "layers.0.attn.wo",
                                         "layers.0.ffn_norm",
                                         "layers.0.ffn.w1",
                                         "layers.0.ffn.w3",
                                         "layers.0.ffn.w2",
                                         "layers.1.attn_norm",
                                         "layers.1.attn.wq",
                                         "layers.1.attn.wk",
                                         "layers.1.attn.wv",
                                         "layers.1.attn.wo",
                                         "layers.1.ffn_norm",
                                         "layers.1.moe.router",
                                         "layers.1.moe.experts.w1",
                                         "layers.1.moe.experts.w3",
                                         "layers.1.moe.experts.w2",
                                         "layers.1.moe.shared.w1",
                                         "layers.1.moe.shared.w3",
                                         "layers.1.moe.shared.w2",
                                         "final_norm",
                                         "lm_head"};
  EXPECT_EQ(names, want);
  EXPECT_LE(total, model.num_params());
  EXPECT_EQ(model.moe_layers(), 1);
  EXPECT_EQ(model.router_bias().size(), 4u);
  // Shapes: wq [heads·hd, d], wk [kv_heads·hd, d], experts stacked.
  auto find = [&](const std::string& n) {
    return *std::find_if(ps.begin(), ps.end(), [&](const ParamInfo& p) { return p.name == n; });
  };
  EXPECT_EQ(find("layers.0.attn.wq").rows, 16);
  EXPECT_EQ(find("layers.0.attn.wk").rows, 8);
  EXPECT_EQ(find("layers.0.attn.wk").offset, find("layers.0.attn.wq").offset + 16 * 16);
  EXPECT_EQ(find("layers.0.attn.wo").cols, 16);
  EXPECT_EQ(find("layers.1.moe.experts.w2").batch, 4);
  EXPECT_EQ(find("layers.1.moe.experts.w2").rows, 16);
  EXPECT_EQ(find("layers.1.moe.experts.w2").cols, 12);
  EXPECT_EQ(find("layers.1.moe.shared.w1").kind, ParamKind::kSharedExpert);
  EXPECT_TRUE(find("layers.1.moe.experts.w1").is_hidden_matrix());
  EXPECT_FALSE(find("layers.1.moe.router").is_hidden_matrix());
  EXPECT_FALSE(find("embedding").is_hidden_matrix());
  EXPECT_FALSE(find("final_norm").is_hidden_matrix());
  EXPECT_STREQ(ParamKindName(ParamKind::kEmbedding), "embedding");
  EXPECT_STREQ(ParamKindName(ParamKind::kNorm), "norm");

  RunConfig tied = Tiny();
  tied.model.tie_embeddings = true;
  Model<float> tm(tied);
  for (const ParamInfo& p : tm.param_infos()) EXPECT_NE(p.name, "lm_head");
}

TEST(ModelInit, DeterministicScaledAndPaddingZero) {
  RunConfig c = Tiny();
  c.model.d_model = 64;
  c.model.ffn_hidden = 128;
  c.model.init_std = 0.02;
  c.model.layers = 8;
  Model<float> a(c), b(c);
  a.Init(7);
  b.Init(7);
  ASSERT_EQ(std::memcmp(a.params(), b.params(), a.num_params() * sizeof(float)), 0);
  b.Init(8);
  EXPECT_NE(std::memcmp(a.params(), b.params(), a.num_params() * sizeof(float)), 0);
  std::vector<bool> used(a.num_params(), false);
  for (const ParamInfo& p : a.param_infos()) {
    const float* w = a.params() + p.offset;
    for (size_t i = 0; i < p.size(); ++i) used[p.offset + i] = true;
    if (p.kind == ParamKind::kNorm) {
      for (size_t i = 0; i < p.size(); ++i) ASSERT_EQ(w[i], 1.0f);
      continue;
    }
    double s = 0, s2 = 0;
    for (size_t i = 0; i < p.size(); ++i) s += w[i], s2 += double(w[i]) * w[i];
    const double mean = s / p.size(), sd = std::sqrt(s2 / p.size() - mean * mean);
    const bool out = p.name.ends_with(".wo") || p.name.ends_with(".w2");
    const double want = 0.02 * (out ? 1.0 / std::sqrt(16.0) : 1.0);
    EXPECT_NEAR(sd, want, want * 0.06) << p.name;
    EXPECT_NEAR(mean, 0.0, want * 0.1) << p.name;
  }
  for (size_t i = 0; i < used.size(); ++i) {
    if (!used[i]) {
      ASSERT_EQ(a.params()[i], 0.0f) << "padding at " << i;
    }
  }
  // The init of a tensor depends only on (seed, name): tying does not change the embedding.
  RunConfig t = c;
  t.model.tie_embeddings = true;
  Model<float> tm(t);
  tm.Init(7);
  EXPECT_EQ(std::memcmp(tm.params(), a.params(), 64 * 32 * sizeof(float)), 0);
}

// ---------------------------------------------------------------------------------------------
// Whole-model gradient check.

struct Variant {
  std::string name;
  RunConfig config;
  long logit_chunk_elements = 0;  // > 0: the LM head + cross-entropy in chunks of this size
};

// Sets the logit chunk size for a scope (0: leave it).
class LogitChunkScope {
 public:
  explicit LogitChunkScope(long elements) : saved_(LogitChunkElements()) {
    if (elements > 0) SetLogitChunkElements(elements);
  }
  ~LogitChunkScope() { SetLogitChunkElements(saved_); }

 private:
  long saved_;
};

std::vector<Variant> Variants() {
  std::vector<Variant> v;
  v.push_back({"mha_dense_untied", Tiny()});
  {
    // 16 rows per forward in chunks of 3 rows (the last one short), tied and untied, with the
    // z-loss: the chunked LM head + cross-entropy (model.cc, OutputLoss).
    RunConfig c = Tiny();
    c.model.z_loss = 1e-3;
    v.push_back({"chunked_logits_untied_zloss", c, 3L * c.model.vocab_size});
    c.model.tie_embeddings = true;
    v.push_back({"chunked_logits_tied", c, 3L * c.model.vocab_size});
  }
  {
    RunConfig c = Tiny();
    c.model.kv_heads = 2;
    c.model.tie_embeddings = true;
    v.push_back({"gqa_dense_tied", c});
  }
  {
    RunConfig c = Tiny();
    c.model.kv_heads = 1;
    c.model.heads = 2;
    c.model.layers = 1;
    v.push_back({"mqa_dense_one_layer", c});
  }
  {
    RunConfig c = TinyMoe();
    v.push_back({"moe_softmax_aux_shared", c});
  }
  {
    RunConfig c = TinyMoe();
    c.moe.shared_experts = 0;
    c.moe.dense_layers = 0;
    c.model.kv_heads = 2;
    c.model.tie_embeddings = true;
    v.push_back({"moe_softmax_aux_noshared_gqa_tied", c});
  }
  {
    RunConfig c = TinyMoe();
    c.moe.router = "sigmoid";
    c.moe.balance = "aux_free";
    v.push_back({"moe_sigmoid_auxfree_shared", c});
  }
  {
    RunConfig c = TinyMoe();
    c.moe.router = "sigmoid";
    c.moe.balance = "aux_loss";
    c.moe.shared_experts = 0;
    v.push_back({"moe_sigmoid_aux_noshared", c});
  }
  {
    RunConfig c = Tiny();
    c.model.logit_softcap = 2.0;  // small enough that the cap is active on the test logits
    c.model.z_loss = 1e-2;
    c.model.kv_heads = 2;
    v.push_back({"softcap_zloss_gqa", c});
  }
  {
    RunConfig c = Tiny();
    c.model.qk_norm = true;
    c.model.kv_heads = 2;
    v.push_back({"qknorm_gqa", c});
  }
  {
    RunConfig c = Tiny();
    c.model.heads = 2;
    UseMla(&c.model, {.q_lora = 8, .kv_lora = 6, .nope = 4, .rope = 4, .v = 6});
    v.push_back({"mla_qlora", c});
    c.model.q_lora_rank = 0;
    c.model.heads = 3;
    c.model.logit_softcap = 3.0;
    v.push_back({"mla_noqlora_softcap", c});
  }
  {
    RunConfig c = TinyMoe();
    UseMla(&c.model, {.q_lora = 8, .kv_lora = 6, .nope = 4, .rope = 2, .v = 4});
    c.model.z_loss = 1e-3;
    v.push_back({"mla_moe_zloss", c});
  }
  {
    RunConfig c = TinyMoe();
    c.moe.balance = "none";
    c.moe.shared_experts = 2;
    v.push_back({"moe_softmax_none_two_shared", c});
  }
  return v;
}

class ModelGrad : public ::testing::TestWithParam<Variant> {};

TEST_P(ModelGrad, EveryTensorMatchesFiniteDifferences) {
  const RunConfig& c = GetParam().config;
  const LogitChunkScope chunks(GetParam().logit_chunk_elements);
  // Thousands of tiny forwards: OpenMP fork/join would cost more than the work.
  const int saved_threads = omp_get_max_threads();
  omp_set_num_threads(1);
  Model<double> model(c);
  model.Init(11);
  // A non-zero selection bias (aux-free balancing) must steer selection but not the gates.
  if (c.moe.balance == "aux_free") {
    std::mt19937_64 rng(3);
    for (double& b : model.router_bias())
      b = 0.3 * (static_cast<double>(rng() % 1000) / 1000 - 0.5);
  }
  const int batch = 2;
  const auto tokens = RandomTokens(batch, c.model.seq_len, c.model.vocab_size, 5);
  StepStats stats;
  const double obj = model.ForwardBackward(tokens.data(), batch, &stats);
  ASSERT_TRUE(std::isfinite(obj));
  EXPECT_NEAR(obj, stats.loss + stats.aux_loss + stats.z_loss, 1e-12);
  if (c.moe.enabled() && c.moe.balance == "aux_loss") {
    EXPECT_GT(stats.aux_loss, 0);
  } else {
    EXPECT_EQ(stats.aux_loss, 0);
  }
  const std::vector<double> grads(model.grads(), model.grads() + model.num_params());
  const std::vector<int64_t> counts = stats.expert_counts;

  double* p = model.params();
  int flips = 0;
  auto f = [&] {
    StepStats s;
    const double v = model.Forward(tokens.data(), batch, &s);
    if (s.expert_counts != counts) ++flips;
    return v;
  };
  for (const ParamInfo& info : model.param_infos()) {
    // Every tensor: up to 24 coordinates, always including the first and last.
    const double err = testing::MaxGradErr(f, p + info.offset, grads.data() + info.offset,
                                           info.size(), 24, info.offset + 1);
    EXPECT_LT(err, 1e-6) << info.name;
    // ... and the check is not vacuous: every tensor receives gradient.
    double gmax = 0;
    for (size_t i = 0; i < info.size(); ++i)
      gmax = std::max(gmax, std::abs(grads[info.offset + i]));
    EXPECT_GT(gmax, 1e-6) << info.name << " has no gradient";
  }
  EXPECT_EQ(flips, 0) << "a perturbation changed the routing; pick another seed";
  // The objective is restored after the perturbations.
  EXPECT_EQ(model.Forward(tokens.data(), batch, nullptr), obj);
  omp_set_num_threads(saved_threads);
}

INSTANTIATE_TEST_SUITE_P(Options, ModelGrad, ::testing::ValuesIn(Variants()),
                         [](const auto& info) { return info.param.name; });

// ---------------------------------------------------------------------------------------------
// Naive reference forward for dense MHA/GQA models: loss and per-head max logits.

struct Reference {
  double loss;
  std::vector<double> max_logit;  // [layers·heads]
};

Reference NaiveForward(const RunConfig& c, const std::vector<ParamInfo>& ps, const double* w,
                       const std::vector<int32_t>& tokens, int batch) {
  const ModelConfig& m = c.model;
  const int d = m.d_model, S = m.seq_len, H = m.heads, G = m.kv_heads_effective(),
            hd = m.head_dim_effective(), F = m.ffn_hidden, V = m.vocab_size;
  auto P = [&](const std::string& name) {
    for (const ParamInfo& p : ps)
      if (p.name == name) return w + p.offset;
    ADD_FAILURE() << "no " << name;
    return w;
  };
  using Mat = std::vector<std::vector<double>>;
  auto rms = [&](const Mat& x, const double* g) {
    Mat y = x;
    for (auto& r : y) {
      double ss = 0;
      for (double v : r) ss += v * v;
      const double s = 1 / std::sqrt(ss / d + m.norm_eps);
      for (int j = 0; j < d; ++j) r[j] *= s * g[j];
    }
    return y;
  };
  auto lin = [](const Mat& x, const double* W, int out) {
    Mat y(x.size(), std::vector<double>(out, 0));
    const int in = x[0].size();
    for (size_t i = 0; i < x.size(); ++i)
      for (int o = 0; o < out; ++o)
        for (int k = 0; k < in; ++k) y[i][o] += x[i][k] * W[o * in + k];
    return y;
  };
  auto rope = [&](Mat& x, int heads) {
    for (int s = 0; s < S; ++s)
      for (int h = 0; h < heads; ++h)
        for (int i = 0; i < hd / 2; ++i) {
          const double ang = s * std::pow(m.rope_theta, -2.0 * i / hd);
          double& a = x[s][h * hd + i];
          double& b = x[s][h * hd + i + hd / 2];
          const double a0 = a, b0 = b;
          a = a0 * std::cos(ang) - b0 * std::sin(ang);
          b = b0 * std::cos(ang) + a0 * std::sin(ang);
        }
  };
  Reference ref{0, std::vector<double>(m.layers * H, -1e300)};
  const double* emb = P("embedding");
  for (int b = 0; b < batch; ++b) {
    Mat x(S, std::vector<double>(d));
    for (int s = 0; s < S; ++s)
      for (int j = 0; j < d; ++j) x[s][j] = emb[tokens[b * (S + 1) + s] * d + j];
    for (int l = 0; l < m.layers; ++l) {
      const std::string pre = "layers." + std::to_string(l) + ".";
      Mat xn = rms(x, P(pre + "attn_norm"));
      Mat q = lin(xn, P(pre + "attn.wq"), H * hd), k = lin(xn, P(pre + "attn.wk"), G * hd),
          v = lin(xn, P(pre + "attn.wv"), G * hd);
      rope(q, H);
      rope(k, G);
      Mat att(S, std::vector<double>(H * hd, 0));
      for (int h = 0; h < H; ++h) {
        const int g = h / (H / G);
        for (int i = 0; i < S; ++i) {
          std::vector<double> sc(i + 1);
          for (int j = 0; j <= i; ++j) {
            double dot = 0;
            for (int t = 0; t < hd; ++t) dot += q[i][h * hd + t] * k[j][g * hd + t];
            sc[j] = dot / std::sqrt(hd);
            ref.max_logit[l * H + h] = std::max(ref.max_logit[l * H + h], sc[j]);
          }
          const double mx = *std::max_element(sc.begin(), sc.end());
          double z = 0;
          for (double& e : sc) z += (e = std::exp(e - mx));
          for (int j = 0; j <= i; ++j)
            for (int t = 0; t < hd; ++t) att[i][h * hd + t] += sc[j] / z * v[j][g * hd + t];
        }
      }
      Mat o = lin(att, P(pre + "attn.wo"), d);
      for (int s = 0; s < S; ++s)
        for (int j = 0; j < d; ++j) x[s][j] += o[s][j];
      Mat xn2 = rms(x, P(pre + "ffn_norm"));
      Mat h1 = lin(xn2, P(pre + "ffn.w1"), F), h3 = lin(xn2, P(pre + "ffn.w3"), F);
      for (int s = 0; s < S; ++s)
        for (int j = 0; j < F; ++j) h1[s][j] = h1[s][j] / (1 + std::exp(-h1[s][j])) * h3[s][j];
      Mat y = lin(h1, P(pre + "ffn.w2"), d);
      for (int s = 0; s < S; ++s)
        for (int j = 0; j < d; ++j) x[s][j] += y[s][j];
    }
    Mat xf = rms(x, P("final_norm"));
    Mat logits = lin(xf, m.tie_embeddings ? emb : P("lm_head"), V);
    for (int s = 0; s < S; ++s) {
      double mx = *std::max_element(logits[s].begin(), logits[s].end()), z = 0;
      for (double e : logits[s]) z += std::exp(e - mx);
      ref.loss += mx + std::log(z) - logits[s][tokens[b * (S + 1) + s + 1]];
    }
  }
  ref.loss /= batch * S;
  return ref;
}

TEST(ModelForward, LossAndMaxLogitsMatchNaiveReference) {
  for (int kv : {0, 2}) {
    for (bool tied : {false, true}) {
      RunConfig c = Tiny();
      c.model.kv_heads = kv;
      c.model.tie_embeddings = tied;
      c.model.seq_len = 40;  // more than one causal tile
      Model<double> model(c);
      model.Init(3);
      const int batch = 3;
      const auto tokens = RandomTokens(batch, c.model.seq_len, c.model.vocab_size, 9);
      StepStats stats;
      const double obj = model.Forward(tokens.data(), batch, &stats);
      const Reference ref = NaiveForward(c, model.param_infos(), model.params(), tokens, batch);
      EXPECT_NEAR(obj, ref.loss, 1e-12);
      ASSERT_EQ(stats.max_logit.size(), ref.max_logit.size());
      for (size_t i = 0; i < ref.max_logit.size(); ++i) {
        EXPECT_NEAR(stats.max_logit[i], ref.max_logit[i], 1e-5 * std::abs(ref.max_logit[i]));
        EXPECT_EQ(stats.max_logit[i], stats.max_logit_raw[i]);
      }
      // ForwardBackward computes the same objective and statistics.
      StepStats s2;
      EXPECT_EQ(model.ForwardBackward(tokens.data(), batch, &s2), obj);
      EXPECT_EQ(s2.max_logit, stats.max_logit);
    }
  }
}

// MLA: layer 0's per-head max logit recomputed from the parameters by brute force (latents,
// norms, per-head q^C/q^R, shared rotary key, scale 1/sqrt(nope + rope)).
TEST(ModelForward, MlaMaxLogitMatchesBruteForce) {
  RunConfig c = Tiny();
  c.model.heads = 3;
  UseMla(&c.model, {.q_lora = 8, .kv_lora = 6, .nope = 4, .rope = 4, .v = 5});
  Model<double> model(c);
  model.Init(5);
  const int batch = 2, S = c.model.seq_len, d = c.model.d_model, H = 3, rq = 8, rkv = 6, dn = 4,
            dr = 4;
  const auto tokens = RandomTokens(batch, S, c.model.vocab_size, 3);
  StepStats stats;
  model.Forward(tokens.data(), batch, &stats);
  auto P = [&](const std::string& name) {
    for (const ParamInfo& p : model.param_infos())
      if (p.name == name) return model.params() + p.offset;
    ADD_FAILURE() << name;
    return model.params();
  };
  using Vec = std::vector<double>;
  auto rms = [&](Vec x, const double* g) {
    double ss = 0;
    for (double v : x) ss += v * v;
    const double r = 1 / std::sqrt(ss / x.size() + c.model.norm_eps);
    for (size_t j = 0; j < x.size(); ++j) x[j] *= r * g[j];
    return x;
  };
  auto mat = [](const double* W, const Vec& x, int rows) {
    Vec y(rows, 0);
    for (int o = 0; o < rows; ++o)
      for (size_t k = 0; k < x.size(); ++k) y[o] += W[o * x.size() + k] * x[k];
    return y;
  };
  auto rope = [&](Vec v, int pos) {  // rotate-half over the whole vector
    const int half = v.size() / 2;
    for (int i = 0; i < half; ++i) {
      const double a = pos * std::pow(c.model.rope_theta, -2.0 * i / v.size());
      const double x = v[i], y = v[i + half];
      v[i] = x * std::cos(a) - y * std::sin(a);
      v[i + half] = y * std::cos(a) + x * std::sin(a);
    }
    return v;
  };
  std::vector<double> want(H, -1e300);
  for (int b = 0; b < batch; ++b) {
    std::vector<std::vector<Vec>> q(S, std::vector<Vec>(H)), k(S, std::vector<Vec>(H));
    for (int s = 0; s < S; ++s) {
      const int tok = tokens[b * (S + 1) + s];
      const Vec x = rms(Vec(P("embedding") + tok * d, P("embedding") + (tok + 1) * d),
                        P("layers.0.attn_norm"));
      const Vec cq = rms(mat(P("layers.0.attn.q_a"), x, rq), P("layers.0.attn.q_a_norm"));
      const Vec qn = mat(P("layers.0.attn.q_b_nope"), cq, H * dn);
      const Vec qr = mat(P("layers.0.attn.q_b_rope"), cq, H * dr);
      const Vec ckv = rms(mat(P("layers.0.attn.kv_a"), x, rkv), P("layers.0.attn.kv_a_norm"));
      const Vec kn = mat(P("layers.0.attn.kv_b_k"), ckv, H * dn);
      const Vec kr = rope(mat(P("layers.0.attn.k_rope"), x, dr), s);
      for (int h = 0; h < H; ++h) {
        q[s][h] = Vec(qn.begin() + h * dn, qn.begin() + (h + 1) * dn);
        const Vec r = rope(Vec(qr.begin() + h * dr, qr.begin() + (h + 1) * dr), s);
        q[s][h].insert(q[s][h].end(), r.begin(), r.end());
        k[s][h] = Vec(kn.begin() + h * dn, kn.begin() + (h + 1) * dn);
        k[s][h].insert(k[s][h].end(), kr.begin(), kr.end());
      }
    }
    for (int h = 0; h < H; ++h)
      for (int i = 0; i < S; ++i)
        for (int j = 0; j <= i; ++j) {
          double dot = 0;
          for (int t = 0; t < dn + dr; ++t) dot += q[i][h][t] * k[j][h][t];
          want[h] = std::max(want[h], dot / std::sqrt(dn + dr));
        }
  }
  for (int h = 0; h < H; ++h) EXPECT_NEAR(stats.max_logit[h], want[h], 1e-5 * std::abs(want[h]));
}

TEST(ModelForward, SoftcapRecordsRawAndCappedMaxLogits) {
  RunConfig c = Tiny();
  Model<double> plain(c);
  plain.Init(3);
  c.model.logit_softcap = 1.5;
  Model<double> capped(c);
  capped.Init(3);
  const auto tokens = RandomTokens(2, c.model.seq_len, c.model.vocab_size, 9);
  StepStats sp, sc;
  plain.Forward(tokens.data(), 2, &sp);
  const double obj = capped.Forward(tokens.data(), 2, &sc);
  // Layer 0 sees the same inputs in both models, so its raw logits are the same.
  for (int h = 0; h < c.model.heads; ++h) {
    EXPECT_NEAR(sc.max_logit_raw[h], sp.max_logit[h], 1e-6);
    EXPECT_NEAR(sc.max_logit[h], 1.5 * std::tanh(sc.max_logit_raw[h] / 1.5), 1e-6);
    EXPECT_LT(sc.max_logit[h], 1.5);
  }
  EXPECT_NE(obj, plain.Forward(tokens.data(), 2, nullptr));
}

TEST(ModelLayout, MlaAndQkNormParameters) {
  RunConfig c = Tiny();
  c.model.heads = 2;
  UseMla(&c.model, {.q_lora = 8, .kv_lora = 6, .nope = 4, .rope = 2, .v = 3});
  Model<float> m(c);
  std::vector<std::string> names;
  for (const ParamInfo& p : m.param_infos())
    if (p.layer == 0)
      names.push_back(p.name + " " + ParamKindName(p.kind) + " " + std::to_string(p.rows) + "x" +
                      std::to_string(p.cols));
  const std::vector<std::string> want = {
      "layers.0.attn_norm norm 1x16",    "layers.0.attn.q_a mla 8x16",
      "layers.0.attn.q_a_norm norm 1x8", "layers.0.attn.q_b_nope mla 8x8",
      "layers.0.attn.q_b_rope mla 4x8",  "layers.0.attn.kv_a mla 6x16",
      "layers.0.attn.k_rope mla 2x16",   "layers.0.attn.kv_a_norm norm 1x6",
      "layers.0.attn.kv_b_k mla 8x6",    "layers.0.attn.kv_b_v mla 6x6",
      "layers.0.attn.wo attn_o 16x6",    "layers.0.ffn_norm norm 1x16",
      "layers.0.ffn.w1 ffn 24x16",       "layers.0.ffn.w3 ffn 24x16",
      "layers.0.ffn.w2 ffn 16x24"};
  EXPECT_EQ(names, want);
  c.model.qk_norm = true;
  EXPECT_THROW(Model<float> bad(c), std::invalid_argument);
  RunConfig q = Tiny();
  q.model.qk_norm = true;
  Model<float> qm(q);
  int norms = 0;
  for (const ParamInfo& p : qm.param_infos())
    if (p.name.ends_with("attn.q_norm") || p.name.ends_with("attn.k_norm")) {
      ++norms;
      EXPECT_EQ(p.cols, 4);
    }
  EXPECT_EQ(norms, 4);
}

TEST(ModelMoe, UpdateRouterBiasMovesEachLayerTowardsBalance) {
  RunConfig c = TinyMoe();
  c.moe.dense_layers = 0;  // two MoE layers
  c.moe.balance = "aux_free";
  Model<float> m(c);
  ASSERT_EQ(m.moe_layers(), 2);
  // Layer 0: expert 0 overloaded; layer 1: expert 3 underloaded.
  m.UpdateRouterBias({10, 2, 2, 2, 4, 4, 4, 0}, 0.01);
  const std::vector<float> want = {-0.01f, 0.01f, 0.01f, 0.01f, -0.01f, -0.01f, -0.01f, 0.01f};
  EXPECT_EQ(m.router_bias(), want);
  EXPECT_THROW(m.UpdateRouterBias({1, 2}, 0.01), std::invalid_argument);
}

// ---------------------------------------------------------------------------------------------
// Precision, determinism, batch changes.

template <typename T>
void CopyParams(const Model<double>& from, Model<T>& to) {
  for (size_t i = 0; i < to.num_params(); ++i) to.params()[i] = static_cast<T>(from.params()[i]);
}

TEST(ModelPrecision, FloatMatchesDouble) {
  for (RunConfig c : {Tiny(), TinyMoe()}) {
    c.model.init_std = 0.1;
    Model<double> md(c);
    Model<float> mf(c);
    md.Init(4);
    CopyParams(md, mf);
    const auto tokens = RandomTokens(2, c.model.seq_len, c.model.vocab_size, 1);
    StepStats sd, sf;
    const double ld = md.ForwardBackward(tokens.data(), 2, &sd);
    const double lf = mf.ForwardBackward(tokens.data(), 2, &sf);
    EXPECT_NEAR(lf, ld, 1e-4 * std::abs(ld));
    EXPECT_EQ(sd.expert_counts, sf.expert_counts);
    for (size_t i = 0; i < sd.max_logit.size(); ++i)
      EXPECT_NEAR(sf.max_logit[i], sd.max_logit[i], 1e-4 * (1 + std::abs(sd.max_logit[i])));
    double gmax = 0;
    for (size_t i = 0; i < md.num_params(); ++i) gmax = std::max(gmax, std::abs(md.grads()[i]));
    for (size_t i = 0; i < md.num_params(); ++i)
      ASSERT_NEAR(mf.grads()[i], md.grads()[i], 1e-4 * gmax) << i;
  }
}

TEST(ModelDeterminism, SameSeedSameThreadsBitIdentical) {
  RunConfig c = TinyMoe();
  c.model.seq_len = 64;
  c.model.d_model = 32;
  c.model.ffn_hidden = 64;
  c.model.init_std = 0.02;
  const auto tokens = RandomTokens(4, c.model.seq_len, c.model.vocab_size, 2);
  auto run = [&](int threads, std::vector<float>* grads) {
    omp_set_num_threads(threads);
    Model<float> m(c);
    m.Init(1);
    StepStats s;
    double loss = 0;
    for (int step = 0; step < 3; ++step) {
      loss = m.ForwardBackward(tokens.data(), 4, &s);
      // A crude SGD step so later steps see different weights.
      for (size_t i = 0; i < m.num_params(); ++i) m.params()[i] -= 0.1f * m.grads()[i];
    }
    grads->assign(m.grads(), m.grads() + m.num_params());
    return loss;
  };
  const int saved = omp_get_max_threads();
  std::vector<float> g1, g2, g3;
  const double a = run(2, &g1), b = run(2, &g2);
  EXPECT_EQ(a, b);
  EXPECT_EQ(std::memcmp(g1.data(), g2.data(), g1.size() * sizeof(float)), 0);
  const double one = run(1, &g3);
  EXPECT_TRUE(std::isfinite(one));
  EXPECT_NEAR(one, a, 1e-4 * std::abs(a));
  omp_set_num_threads(saved);
}

TEST(ModelBatch, GrowingAndShrinkingBatchReusesTheArena) {
  RunConfig c = Tiny();
  Model<double> m(c);
  m.Init(2);
  const auto tokens = RandomTokens(3, c.model.seq_len, c.model.vocab_size, 4);
  const double one = m.Forward(tokens.data(), 1, nullptr);
  const double three = m.Forward(tokens.data(), 3, nullptr);
  EXPECT_NE(one, three);
  EXPECT_EQ(m.Forward(tokens.data(), 1, nullptr), one);
  std::vector<int32_t> bad = tokens;
  bad[0] = c.model.vocab_size;
  EXPECT_THROW(m.Forward(bad.data(), 1, nullptr), std::out_of_range);
}

// The chunked LM head + cross-entropy (issue 25: the [n, vocab] logits never exist at once)
// against the unchunked one on a float model: the same loss and gradients up to float rounding,
// and an activation arena smaller by the logits it no longer holds.
TEST(ModelOutput, ChunkedLogitsMatchUnchunkedAndShrinkTheArena) {
  RunConfig c = TinyMoe();
  c.model.vocab_size = 256;
  c.model.z_loss = 1e-4;
  const int batch = 4;  // 32 rows
  const auto tokens = RandomTokens(batch, c.model.seq_len, c.model.vocab_size, 9);
  auto run = [&](long chunk, std::vector<float>* grads, size_t* bytes) {
    const LogitChunkScope scope(chunk);
    Model<float> m(c);
    m.Init(4);
    StepStats s;
    const double obj = m.ForwardBackward(tokens.data(), batch, &s);
    grads->assign(m.grads(), m.grads() + m.num_params());
    *bytes = m.activation_bytes();
    return obj;
  };
  std::vector<float> whole, chunked;
  size_t whole_bytes = 0, chunked_bytes = 0;
  const double a = run(0, &whole, &whole_bytes);
  const double b = run(5L * c.model.vocab_size, &chunked, &chunked_bytes);  // 7 chunks
  EXPECT_NEAR(b, a, 1e-6 * std::abs(a));
  double gmax = 0, diff = 0;
  for (size_t i = 0; i < whole.size(); ++i) {
    gmax = std::max(gmax, static_cast<double>(std::abs(whole[i])));
    diff = std::max(diff, static_cast<double>(std::abs(whole[i] - chunked[i])));
  }
  EXPECT_LT(diff, 1e-5 * gmax);
  EXPECT_LE(chunked_bytes + sizeof(float) * (32 - 5) * c.model.vocab_size, whole_bytes);
}

}  // namespace
}  // namespace moelab
