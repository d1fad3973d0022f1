// MoE layer: central finite differences in double for dx and every weight under every routing
// option, plus routing invariants, the bias rule, Dispatch/Combine, float/double agreement and
// determinism.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iomanip>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "core/model/cpu_moe.h"
#include "kernels/cpu/moe_experts.h"
#include "kernels/cpu/moe_routing.h"
#include "kernels/cpu/swiglu.h"
#include "tests/common/random_fill.h"

namespace moelab {

namespace {

struct Shape {
  int d = 12, hidden = 10, experts = 5, k = 2, shared = 0, n = 12;
  std::string router = "softmax";
  std::string balance = "none";
  double coef = 0.0;
  double route_scale = 1.0;
  bool bias = false;
};

ModelConfig MakeModel(const Shape& s) {
  ModelConfig m;
  m.d_model = s.d;
  return m;
}

MoEConfig MakeMoe(const Shape& s) {
  return {.experts_total = s.experts,
          .experts_active = s.k,
          .shared_experts = s.shared,
          .expert_hidden = s.hidden,
          .router = s.router,
          .route_scale = s.route_scale,
          .balance = s.balance,
          .aux_loss_coef = s.coef};
}

// Parameters of one layer in a flat arena, with MoeWeights views.
template <typename T>
struct Arena {
  std::vector<T> data;
  size_t router, w1, w3, w2, sw1, sw3, sw2;
  int shared;

  explicit Arena(const Shape& s) : shared(s.shared) {
    const size_t E = s.experts, d = s.d, H = s.hidden, S = s.shared;
    size_t off = 0;
    auto take = [&](size_t n) {
      const size_t o = off;
      off += n;
      return o;
    };
    router = take(E * d);
    w1 = take(E * H * d);
    w3 = take(E * H * d);
    w2 = take(E * d * H);
    sw1 = take(S * H * d);
    sw3 = take(S * H * d);
    sw2 = take(S * d * H);
    data.assign(off, T(0));
  }
  MoeWeights<T> view() {
    T* p = data.data();
    return {p + router,
            p + w1,
            p + w3,
            p + w2,
            shared ? p + sw1 : nullptr,
            shared ? p + sw3 : nullptr,
            shared ? p + sw2 : nullptr};
  }
};

std::vector<double> RandomVec(size_t n, double stddev, uint64_t seed) {
  return test::RandomNormal<double>(n, stddev, seed);
}

template <typename To>
std::vector<To> Cast(const std::vector<double>& v) {
  return std::vector<To>(v.begin(), v.end());
}

// Objective J = Σ y⊙R + aux, so dJ/dy = R and dJ/daux = 1.
struct Problem {
  Shape s;
  std::vector<double> params, x, r, bias;
  explicit Problem(const Shape& shape, uint64_t seed = 7) : s(shape) {
    Arena<double> a(s);
    params = RandomVec(a.data.size(), 0.35, seed);
    // A stronger router spreads the scores so that no routing decision sits near a tie.
    for (size_t i = 0; i < static_cast<size_t>(s.experts) * s.d; ++i) params[a.router + i] *= 3;
    x = RandomVec(static_cast<size_t>(s.n) * s.d, 1.0, seed + 1);
    r = RandomVec(static_cast<size_t>(s.n) * s.d, 1.0, seed + 2);
    bias.assign(s.experts, 0.0);
    if (s.bias) {
      for (int e = 0; e < s.experts; ++e) bias[e] = 0.3 * ((e * 7) % 5 - 2);
    }
  }
};

double Objective(CpuMoeLayer<double>& layer, const Problem& p, Arena<double>& a,
                 const std::vector<double>& x, std::vector<int>* topk) {
  std::vector<double> y(x.size());
  std::vector<int64_t> counts(p.s.experts);
  const double aux = layer.Forward(a.view(), p.s.bias ? p.bias.data() : nullptr, x.data(), p.s.n,
                                   y.data(), counts.data());
  if (topk) *topk = layer.cpu_experts().topk();
  double j = aux;
  for (size_t i = 0; i < y.size(); ++i) j += y[i] * p.r[i];
  return j;
}

// Checks an analytic gradient against central differences; every perturbation must keep every
// routing decision.
template <typename Perturb>
void CheckTensor(const char* name, const std::vector<double>& analytic, size_t count,
                 Perturb perturb, const std::vector<int>& topk_ref) {
  constexpr double kEps = 1e-6;
  constexpr double kAbsFloor = 1e-2;  // i.e. an absolute error bound of 1e-8
  std::vector<double> numeric(count);
  double scale = 0;
  for (size_t i = 0; i < count; ++i) {
    std::vector<int> tp, tm;
    const double jp = perturb(i, +kEps, &tp);
    const double jm = perturb(i, -kEps, &tm);
    ASSERT_EQ(tp, topk_ref) << name << "[" << i << "] +eps flips a routing decision";
    ASSERT_EQ(tm, topk_ref) << name << "[" << i << "] -eps flips a routing decision";
    numeric[i] = (jp - jm) / (2 * kEps);
    scale = std::max(scale, std::abs(numeric[i]));
  }
  double worst = 0;
  for (size_t i = 0; i < count; ++i) {
    // Relative error with a floor at 1% of the tensor's largest entry and at kAbsFloor: FD
    // roundoff is absolute (about |J|·2^-52/eps ≈ 1e-9 here), so exact zeros (the router with
    // k = 1 and no aux loss) and tiny entries cannot be held to a relative bound.
    const double denom = std::max({std::abs(numeric[i]), 1e-2 * scale, kAbsFloor});
    const double rel = std::abs(analytic[i] - numeric[i]) / denom;
    worst = std::max(worst, rel);
    EXPECT_LT(rel, 1e-6) << name << "[" << i << "] analytic " << analytic[i] << " numeric "
                         << numeric[i];
  }
  std::ostringstream os;
  os << std::scientific << std::setprecision(2) << worst;
  ::testing::Test::RecordProperty(std::string("max_rel_err_") + name, os.str());
}

void GradCheck(const Shape& s, uint64_t seed = 7) {
  // Thousands of tiny forwards: team start-up would dominate, and one thread keeps it quick.
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  Problem p(s, seed);
  CpuMoeLayer<double> layer(MakeModel(s), MakeMoe(s));
  Arena<double> a(s), g(s);
  a.data = p.params;

  std::vector<int> topk_ref;
  Objective(layer, p, a, p.x, &topk_ref);
  if (s.bias) {
    // The bias must actually matter for the case to test anything.
    Problem unbiased = p;
    unbiased.s.bias = false;
    CpuMoeLayer<double> plain(MakeModel(s), MakeMoe(s));
    std::vector<int> topk_plain;
    Objective(plain, unbiased, a, p.x, &topk_plain);
    EXPECT_NE(topk_plain, topk_ref) << "the selection bias changes no routing decision";
  }
  std::vector<double> dx(p.x.size());
  layer.Backward(a.view(), g.view(), p.x.data(), p.r.data(), s.n, dx.data());

  // Counts: n·k assignments in total.
  std::vector<int64_t> counts(s.experts, 0);
  for (int e : topk_ref) ++counts[e];
  EXPECT_EQ(std::accumulate(counts.begin(), counts.end(), int64_t{0}),
            static_cast<int64_t>(s.n) * s.k);

  CheckTensor(
      "dx", dx, p.x.size(),
      [&](size_t i, double eps, std::vector<int>* tk) {
        std::vector<double> xp = p.x;
        xp[i] += eps;
        return Objective(layer, p, a, xp, tk);
      },
      topk_ref);

  struct Named {
    const char* name;
    size_t off, size;
  };
  const size_t E = s.experts, d = s.d, H = s.hidden, S = s.shared;
  std::vector<Named> tensors = {{"router", a.router, E * d},
                                {"w1", a.w1, E * H * d},
                                {"w3", a.w3, E * H * d},
                                {"w2", a.w2, E * d * H}};
  if (S > 0) {
    tensors.push_back({"shared_w1", a.sw1, S * H * d});
    tensors.push_back({"shared_w3", a.sw3, S * H * d});
    tensors.push_back({"shared_w2", a.sw2, S * d * H});
  }
  for (const Named& t : tensors) {
    std::vector<double> analytic(g.data.begin() + t.off, g.data.begin() + t.off + t.size);
    CheckTensor(
        t.name, analytic, t.size,
        [&](size_t i, double eps, std::vector<int>* tk) {
          const double saved = a.data[t.off + i];
          a.data[t.off + i] = saved + eps;
          const double j = Objective(layer, p, a, p.x, tk);
          a.data[t.off + i] = saved;
          return j;
        },
        topk_ref);
  }
  omp_set_num_threads(threads);
}

// One finite-difference check per routing option; the name says what differs from Shape{}.
struct GradCase {
  const char* name;
  Shape shape;
};

class MoeGradCheck : public ::testing::TestWithParam<GradCase> {};

TEST_P(MoeGradCheck, MatchesFiniteDifferences) { GradCheck(GetParam().shape); }

INSTANTIATE_TEST_SUITE_P(
    Routing, MoeGradCheck,
    ::testing::Values(
        GradCase{"SoftmaxTop2", {}}, GradCase{"SoftmaxTop1", {.experts = 4, .k = 1}},
        GradCase{"SigmoidTop2", {.router = "sigmoid"}},
        GradCase{"SigmoidTop1RouteScale", {.k = 1, .router = "sigmoid", .route_scale = 2.5}},
        GradCase{"SharedOne", {.d = 8, .hidden = 8, .shared = 1}},
        GradCase{"SharedTwoSigmoid", {.experts = 6, .shared = 2, .router = "sigmoid"}},
        // coef large so that the aux gradient is a visible part of the router gradient.
        GradCase{"AuxLossSoftmax", {.balance = "aux_loss", .coef = 0.5}},
        GradCase{"AuxLossSigmoidSharedRouteScale",
                 {.d = 16,
                  .experts = 6,
                  .shared = 1,
                  .router = "sigmoid",
                  .balance = "aux_loss",
                  .coef = 0.5,
                  .route_scale = 2.5}},
        // With k = 1 the gate is constant: the router learns only through the aux loss.
        GradCase{"AuxLossTop1", {.k = 1, .balance = "aux_loss", .coef = 0.5}},
        GradCase{"SelectionBias", {.shared = 1, .route_scale = 1.7, .bias = true}},
        GradCase{"SelectionBiasSigmoidAux",
                 {.router = "sigmoid", .balance = "aux_loss", .coef = 0.3, .bias = true}}),
    [](const auto& info) { return std::string(info.param.name); });

TEST(MoeRouting, AuxLossValue) {
  // Hand-computed Switch loss: 2 tokens, 2 experts, top-1, softmax.
  const std::vector<double> scores = {0.75, 0.25, 0.375, 0.625};
  const std::vector<int64_t> counts = {1, 1};
  // f = (0.5, 0.5), P = (0.5625, 0.4375): coef·E·Σ f·P = 0.1·2·0.5 = 0.1.
  EXPECT_NEAR(cpu::MoeAuxLoss(scores.data(), counts.data(), 2, 2, 1, false, 0.1), 0.1, 1e-15);
  // Sigmoid normalises each row first.
  const std::vector<double> sig = {0.5, 0.5, 0.2, 0.6};
  // s̃ rows: (0.5, 0.5), (0.25, 0.75) -> P = (0.375, 0.625); f = (1, 0) -> 0.1·2·0.375.
  const std::vector<int64_t> c2 = {2, 0};
  EXPECT_NEAR(cpu::MoeAuxLoss(sig.data(), c2.data(), 2, 2, 1, true, 0.1), 0.075, 1e-15);
}

TEST(MoeRouting, BiasChangesSelectionOnly) {
  Shape s;
  s.n = 32;
  s.experts = 6;
  Problem p(s);
  Arena<double> a(s);
  a.data = p.params;
  CpuMoeLayer<double> layer(MakeModel(s), MakeMoe(s));
  std::vector<double> y(p.x.size());
  std::vector<int64_t> counts(s.experts);
  layer.Forward(a.view(), nullptr, p.x.data(), s.n, y.data(), counts.data());
  EXPECT_EQ(std::accumulate(counts.begin(), counts.end(), int64_t{0}), s.n * s.k);
  // A bias of +10 on experts 3 and 5 (scores are in [0,1]) puts them in every token's top-2, in
  // index order when tied... unless their biased scores differ, so just check the set.
  std::vector<double> bias(s.experts, 0.0);
  bias[3] = 10;
  bias[5] = 10;
  layer.Forward(a.view(), bias.data(), p.x.data(), s.n, y.data(), counts.data());
  std::vector<int64_t> expect(s.experts, 0);
  expect[3] = expect[5] = s.n;
  EXPECT_EQ(counts, expect);
  // The gates use unbiased scores: y equals a forward without bias where selection happens to
  // match, checked through MoeRoute directly.
  const int E = s.experts;
  std::vector<double> logits(E * 2), scores(E * 2), gates(4);
  std::vector<int> topk(4);
  std::vector<int64_t> c(E);
  for (int i = 0; i < E * 2; ++i) logits[i] = 0.1 * i;
  cpu::MoeRoute(logits.data(), 2, E, 2, false, bias.data(), 1.0, scores.data(), topk.data(),
                gates.data(), c.data());
  for (int t = 0; t < 2; ++t) {
    // Experts 3 and 5 have equal bias; 5 has the higher score, so it takes slot 0.
    EXPECT_EQ(topk[t * 2], 5);
    EXPECT_EQ(topk[t * 2 + 1], 3);
    const double s3 = scores[t * E + 3], s5 = scores[t * E + 5];
    EXPECT_NEAR(gates[t * 2], s5 / (s3 + s5), 1e-15);
    EXPECT_NEAR(gates[t * 2 + 1], s3 / (s3 + s5), 1e-15);
  }
  // Exact ties go to the lower index.
  std::vector<double> flat(E, 0.0);
  cpu::MoeRoute<double>(flat.data(), 1, E, 2, true, nullptr, 1.0, scores.data(), topk.data(),
                        gates.data(), c.data());
  EXPECT_EQ(topk[0], 0);
  EXPECT_EQ(topk[1], 1);
  EXPECT_NEAR(gates[0], 0.5, 1e-15);
}

TEST(MoeRouting, TopKMatchesSortReference) {
  // Values on a coarse grid make exact ties common; the reference is a stable sort by value,
  // descending, so ties keep the lower index first.
  std::mt19937 rng(9);
  for (int E : {4, 17, 64}) {
    for (int k : {1, 2, 3, 8}) {
      if (k > E) continue;
      const int n = 50;
      std::vector<double> scores(n * E), bias(E), gates(n * k);
      std::vector<int> topk(n * k);
      std::vector<int64_t> counts(E);
      std::uniform_int_distribution<int> grid(0, 4);
      std::vector<double> logits(n * E);
      for (auto& v : logits) v = 0.5 * grid(rng);
      for (auto& v : bias) v = 0.05 * grid(rng);
      cpu::MoeRoute(logits.data(), n, E, k, true, bias.data(), 1.0, scores.data(), topk.data(),
                    gates.data(), counts.data());
      for (int t = 0; t < n; ++t) {
        std::vector<int> order(E);
        std::iota(order.begin(), order.end(), 0);
        const double* s = scores.data() + t * E;
        std::stable_sort(order.begin(), order.end(),
                         [&](int a, int b) { return s[a] + bias[a] > s[b] + bias[b]; });
        for (int j = 0; j < k; ++j) {
          EXPECT_EQ(topk[t * k + j], order[j]) << "E " << E << " k " << k << " token " << t;
        }
      }
    }
  }
}

TEST(MoeRouting, UnderflowingSigmoidScoresStayFinite) {
  // Float sigmoid of -100 is exactly 0: gates fall back to route_scale/k, gradients to 0.
  const int E = 4, k = 2;
  std::vector<float> logits(E, -100.f), scores(E), gates(k), dg = {1.f, -2.f}, dz(E);
  std::vector<int> topk(k);
  std::vector<int64_t> counts(E);
  cpu::MoeRoute<float>(logits.data(), 1, E, k, true, nullptr, 2.0, scores.data(), topk.data(),
                       gates.data(), counts.data());
  EXPECT_EQ(gates[0], 1.f);
  EXPECT_EQ(gates[1], 1.f);
  EXPECT_EQ(cpu::MoeAuxLoss(scores.data(), counts.data(), 1, E, k, true, 0.1), 0.0);
  cpu::MoeRouteBackward(scores.data(), topk.data(), dg.data(), counts.data(), 1, E, k, true, 2.0,
                        0.1, dz.data());
  for (float v : dz) EXPECT_EQ(v, 0.f);
}

TEST(MoeRouting, UpdateSelectionBiasRule) {
  const std::vector<int64_t> counts = {5, 3, 4, 4, 8, 0};  // mean 4
  std::vector<float> bias = {0.f, 0.5f, -0.25f, 0.f, 1.f, 0.f};
  UpdateSelectionBias(bias.data(), counts.data(), 6, 1e-3);
  const std::vector<float> expect = {-1e-3f, 0.5f + 1e-3f, -0.25f, 0.f, 1.f - 1e-3f, 1e-3f};
  for (int i = 0; i < 6; ++i) EXPECT_FLOAT_EQ(bias[i], expect[i]) << i;
  // Non-integer mean: nobody sits exactly at the mean.
  const std::vector<int64_t> c2 = {1, 2};
  std::vector<double> b2 = {0, 0};
  UpdateSelectionBias(b2.data(), c2.data(), 2, 0.5);
  EXPECT_EQ(b2[0], 0.5);
  EXPECT_EQ(b2[1], -0.5);
}

TEST(MoeDispatch, StableCountingSortAndRoundTrip) {
  const int n = 50, E = 7, k = 3, d = 5;
  std::mt19937 rng(3);
  std::vector<int> topk(n * k);
  for (int t = 0; t < n; ++t) {
    std::vector<int> perm(E);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    for (int s = 0; s < k; ++s) topk[t * k + s] = perm[s];
  }
  std::vector<int64_t> offsets(E + 1);
  std::vector<int> row_token(n * k), slot_row(n * k);
  cpu::MoeDispatchPlan(topk.data(), n, E, k, offsets.data(), row_token.data(), slot_row.data());
  EXPECT_EQ(offsets[0], 0);
  EXPECT_EQ(offsets[E], n * k);
  for (int e = 0; e < E; ++e) {
    for (int64_t r = offsets[e]; r < offsets[e + 1]; ++r) {
      const int t = row_token[r];
      // The row belongs to expert e, and rows of an expert are in token order.
      bool has = false;
      for (int s = 0; s < k; ++s) has |= (topk[t * k + s] == e && slot_row[t * k + s] == r);
      EXPECT_TRUE(has);
      if (r > offsets[e]) {
        EXPECT_LT(row_token[r - 1], t);
      }
    }
  }
  // Gather then Combine with gates 1/k (exact in binary for k = 4... use k-independent check).
  std::vector<double> x = RandomVec(n * d, 1.0, 5), xe(n * k * d), y(n * d);
  cpu::MoeGather(x.data(), d, row_token.data(), n * k, xe.data());
  std::vector<double> gates(n * k, 1.0);
  cpu::MoeCombine(xe.data(), slot_row.data(), gates.data(), n, k, d, y.data(), false);
  for (int i = 0; i < n * d; ++i) EXPECT_EQ(y[i], 3 * x[i]);
  // GatherBackward is the adjoint of Gather: the same k-fold sum.
  std::vector<double> dx(n * d);
  cpu::MoeGatherBackward(xe.data(), slot_row.data(), n, k, d, dx.data(), false);
  EXPECT_EQ(dx, y);
}

TEST(MoeExperts, ExpertComputeMatchesPerExpertSwiglu) {
  // The standalone ExpertCompute (what expert parallelism will call between the all-to-alls):
  // both schedules equal SwiGLU run on each expert's block, an empty expert gets zero grads.
  const int E = 4, d = 8, H = 6;
  const std::vector<int64_t> offsets = {0, 5, 5, 12, 20};  // expert 1 has no rows
  const int rows = 20;
  const size_t hd = static_cast<size_t>(H) * d;
  const auto xe = RandomVec(rows * d, 1.0, 1), dye = RandomVec(rows * d, 1.0, 2);
  const auto w1 = RandomVec(E * hd, 0.3, 3), w3 = RandomVec(E * hd, 0.3, 4),
             w2 = RandomVec(E * hd, 0.3, 5);
  std::vector<double> ref_y(rows * d), ref_dx(rows * d), ref_dw(3 * E * hd, 0.0);
  for (int e = 0; e < E; ++e) {
    const int r0 = offsets[e], m = offsets[e + 1] - offsets[e];
    if (m == 0) continue;
    std::vector<double> h1(m * H), h3(m * H), act(m * H), scratch(m * 2 * H);
    cpu::SwigluForward(xe.data() + r0 * d, m, d, H, w1.data() + e * hd, w3.data() + e * hd,
                       w2.data() + e * hd, h1.data(), h3.data(), act.data(), ref_y.data() + r0 * d);
    cpu::SwigluBackward(xe.data() + r0 * d, m, d, H, w1.data() + e * hd, w3.data() + e * hd,
                        w2.data() + e * hd, h1.data(), h3.data(), act.data(), dye.data() + r0 * d,
                        ref_dx.data() + r0 * d, ref_dw.data() + e * hd,
                        ref_dw.data() + (E + e) * hd, ref_dw.data() + (2 * E + e) * hd,
                        scratch.data());
  }
  for (auto schedule :
       {cpu::MoeExpertSchedule::kExpertParallel, cpu::MoeExpertSchedule::kBlasParallel}) {
    std::vector<double> h1(rows * H), h3(rows * H), act(rows * H), ye(rows * d), dxe(rows * d),
        dw(3 * E * hd, 7.0), scratch(rows * 2 * H);
    cpu::MoeExpertsForward(xe.data(), offsets.data(), E, d, H, w1.data(), w3.data(), w2.data(),
                           h1.data(), h3.data(), act.data(), ye.data(), schedule);
    cpu::MoeExpertsBackward(xe.data(), offsets.data(), E, d, H, w1.data(), w3.data(), w2.data(),
                            h1.data(), h3.data(), act.data(), dye.data(), dxe.data(), dw.data(),
                            dw.data() + E * hd, dw.data() + 2 * E * hd, scratch.data(), schedule);
    EXPECT_EQ(ye, ref_y);
    EXPECT_EQ(dxe, ref_dx);
    EXPECT_EQ(dw, ref_dw);  // includes expert 1's zeros over the 7.0 garbage
  }
}

template <typename T>
struct RunResult {
  std::vector<T> y, dx, grads;
  std::vector<int64_t> counts;
  double aux;
};

template <typename T>
RunResult<T> RunLayer(const Shape& s, const Problem& p, bool expert_parallel) {
  CpuMoeLayer<T> layer(MakeModel(s), MakeMoe(s));
  layer.cpu_experts().set_task_parallel(expert_parallel);
  Arena<T> a(s), g(s);
  a.data = Cast<T>(p.params);
  const std::vector<T> x = Cast<T>(p.x), r = Cast<T>(p.r), bias = Cast<T>(p.bias);
  RunResult<T> out;
  out.y.resize(x.size());
  out.dx.resize(x.size());
  out.counts.resize(s.experts);
  out.aux = layer.Forward(a.view(), s.bias ? bias.data() : nullptr, x.data(), s.n, out.y.data(),
                          out.counts.data());
  layer.Backward(a.view(), g.view(), x.data(), r.data(), s.n, out.dx.data());
  out.grads = g.data;
  return out;
}

template <typename A, typename B>
void ExpectClose(const std::vector<A>& a, const std::vector<B>& b, double rtol, const char* what) {
  ASSERT_EQ(a.size(), b.size());
  double scale = 0;
  for (auto v : b) scale = std::max(scale, std::abs(static_cast<double>(v)));
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_NEAR(a[i], b[i], rtol * scale) << what << "[" << i << "]";
  }
}

// The same expert counts, the aux loss within aux_tol, and y, dx and the gradients within rtol
// (relative to want's largest element).
template <typename A, typename B>
void ExpectRunsClose(const RunResult<A>& got, const RunResult<B>& want, double aux_tol,
                     double rtol) {
  EXPECT_EQ(got.counts, want.counts);
  EXPECT_NEAR(got.aux, want.aux, aux_tol);
  ExpectClose(got.y, want.y, rtol, "y");
  ExpectClose(got.dx, want.dx, rtol, "dx");
  ExpectClose(got.grads, want.grads, rtol, "grads");
}

TEST(MoeLayer, FloatMatchesDouble) {
  const Shape s{.d = 32,
                .hidden = 24,
                .experts = 8,
                .shared = 1,
                .n = 64,
                .router = "sigmoid",
                .balance = "aux_loss",
                .coef = 0.1,
                .bias = true};
  Problem p(s);
  const auto rd = RunLayer<double>(s, p, true);
  const auto rf = RunLayer<float>(s, p, true);
  ExpectRunsClose(rf, rd, 1e-6, 1e-5);
}

TEST(MoeLayer, DeterministicAcrossRunsThreadCountsAndSchedules) {
  // The expert-parallel schedule (the default) is bit-identical for any thread count, including
  // more threads than cores (the dynamic task loop then hands experts to threads in varying
  // order): every GEMM runs single-threaded on a fixed piece of work. The BLAS-parallel schedule
  // is bit-identical run to run at a given thread count only: OpenBLAS splits a threaded GEMM,
  // and rounds, by the thread count.
  // n large enough that every OpenMP loop and BLAS call actually goes parallel.
  const Shape s{.d = 64,
                .hidden = 64,
                .experts = 8,
                .shared = 2,
                .n = 600,
                .balance = "aux_loss",
                .coef = 0.01,
                .bias = true};
  Problem p(s);
  const int threads = omp_get_max_threads();
  omp_set_num_threads(2);
  const auto ref = RunLayer<float>(s, p, true);
  for (int nt : {1, 2, 3}) {
    omp_set_num_threads(nt);
    for (bool ep : {true, false}) {
      const auto first = RunLayer<float>(s, p, ep);
      for (int rep = 0; rep < 2; ++rep) {
        const auto r = RunLayer<float>(s, p, ep);
        const auto& want = ep ? ref : first;
        EXPECT_EQ(r.counts, want.counts) << nt << " threads, expert_parallel " << ep;
        EXPECT_EQ(r.aux, want.aux) << nt << " threads, expert_parallel " << ep;
        EXPECT_TRUE(r.y == want.y) << nt << " threads, expert_parallel " << ep;
        EXPECT_TRUE(r.dx == want.dx) << nt << " threads, expert_parallel " << ep;
        EXPECT_TRUE(r.grads == want.grads) << nt << " threads, expert_parallel " << ep;
      }
    }
  }
  omp_set_num_threads(threads);
}

TEST(MoeLayer, SchedulesAgree) {
  // The expert-parallel schedule splits shared experts into row chunks (n = 1100: 3 chunks,
  // partial weight gradients) where the finite-difference tests (n = 12) have one; it must
  // agree with the unsplit BLAS-parallel schedule to rounding.
  const Shape s{.d = 16,
                .hidden = 12,
                .experts = 6,
                .shared = 2,
                .n = 1100,
                .router = "sigmoid",
                .balance = "aux_loss",
                .coef = 0.1,
                .bias = true};
  Problem p(s);
  const auto a = RunLayer<double>(s, p, true);
  const auto b = RunLayer<double>(s, p, false);
  ExpectRunsClose(a, b, 1e-15, 1e-13);
}

TEST(MoeLayer, GrowingAndShrinkingN) {
  // Buffers are sized by the largest n seen; a smaller n afterwards must not read stale rows.
  Shape s;
  s.n = 40;
  s.shared = 1;
  Problem big(s);
  Shape small = s;
  small.n = 9;
  Problem p9(small, 11);
  CpuMoeLayer<double> layer(MakeModel(s), MakeMoe(s));
  Arena<double> a(s), g(s);
  a.data = big.params;
  std::vector<double> y(big.x.size()), dx(big.x.size());
  std::vector<int64_t> counts(s.experts);
  layer.Forward(a.view(), nullptr, big.x.data(), s.n, y.data(), counts.data());
  layer.Backward(a.view(), g.view(), big.x.data(), big.r.data(), s.n, dx.data());
  layer.Forward(a.view(), nullptr, p9.x.data(), small.n, y.data(), counts.data());
  layer.Backward(a.view(), g.view(), p9.x.data(), p9.r.data(), small.n, dx.data());
  // A fresh layer on the small problem gives identical results.
  CpuMoeLayer<double> fresh(MakeModel(s), MakeMoe(s));
  Arena<double> g2(s);
  std::vector<double> y2(y.size()), dx2(dx.size());
  fresh.Forward(a.view(), nullptr, p9.x.data(), small.n, y2.data(), counts.data());
  fresh.Backward(a.view(), g2.view(), p9.x.data(), p9.r.data(), small.n, dx2.data());
  EXPECT_TRUE(std::equal(y2.begin(), y2.begin() + small.n * s.d, y.begin()));
  EXPECT_TRUE(std::equal(dx2.begin(), dx2.begin() + small.n * s.d, dx.begin()));
  EXPECT_EQ(g2.data, g.data);
}

TEST(MoeLayer, OverwritesGradientsAndZeroesIdleExperts) {
  Shape s;
  s.bias = true;
  Problem p(s);
  // Expert 0 never chosen: a large negative bias.
  p.bias.assign(s.experts, 0.0);
  p.bias[0] = -100;
  CpuMoeLayer<double> layer(MakeModel(s), MakeMoe(s));
  Arena<double> a(s), g(s);
  a.data = p.params;
  std::fill(g.data.begin(), g.data.end(), 123.0);  // garbage that must be overwritten
  std::vector<double> y(p.x.size()), dx(p.x.size(), 5.0);
  std::vector<int64_t> counts(s.experts);
  layer.Forward(a.view(), p.bias.data(), p.x.data(), s.n, y.data(), counts.data());
  EXPECT_EQ(counts[0], 0);
  layer.Backward(a.view(), g.view(), p.x.data(), p.r.data(), s.n, dx.data());
  const size_t hd = static_cast<size_t>(s.hidden) * s.d;
  for (size_t i = 0; i < hd; ++i) {
    EXPECT_EQ(g.data[a.w1 + i], 0.0);
    EXPECT_EQ(g.data[a.w3 + i], 0.0);
    EXPECT_EQ(g.data[a.w2 + i], 0.0);
  }
  for (double v : g.data) EXPECT_NE(v, 123.0);
  // And the whole result equals a run from zeroed buffers.
  const auto ref = RunLayer<double>(s, p, true);
  EXPECT_EQ(g.data, ref.grads);
  EXPECT_EQ(dx, ref.dx);
}

}  // namespace
}  // namespace moelab
