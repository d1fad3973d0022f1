// The optimizers over the backend seam, checked on the CPU: one AdamW / Muon over an op table
// whose memory is not host memory (the path a device backend takes: state in backend arrays, host
// mirrors synchronised around checkpoints) gives the host optimizer's bits; and OptimizerTraits
// answers what the optimizers themselves do (state buffers, their sizes, Muon's rule).
#include "core/model/optimizer_ops.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/config.h"
#include "core/model/model.h"
#include "core/optimizer_traits.h"
#include "core/optim/optimizer.h"
#include "tests/common/tiny_configs.h"

namespace moelab {
namespace {

// Host memory that says it is not: StateArray then keeps the state apart from its host mirror.
class MirroredMemory final : public BackendMemory {
 public:
  std::string name() const override { return "mirrored-cpu"; }
  bool is_host() const override { return false; }
  void* Allocate(size_t bytes) override { return bytes ? std::calloc(bytes, 1) : nullptr; }
  void Release(void* p) noexcept override { std::free(p); }
  void ToBackend(void* dst, const void* host, size_t bytes) override {
    if (bytes) std::memcpy(dst, host, bytes);
  }
  void ToHost(void* host, const void* src, size_t bytes) const override {
    if (bytes) std::memcpy(host, src, bytes);
  }
  void Copy(void* dst, const void* src, size_t bytes) override {
    if (bytes) std::memcpy(dst, src, bytes);
  }
  void Zero(void* p, size_t bytes) override {
    if (bytes) std::memset(p, 0, bytes);
  }
};

// The host arithmetic over MirroredMemory.
class MirroredOps final : public OptimizerOps {
 public:
  BackendMemory& memory() override { return memory_; }
  std::unique_ptr<AdamWTable> MakeAdamWTable(const std::vector<AdamWTensor>& t) override {
    return host().MakeAdamWTable(t);
  }
  void AdamWStep(const AdamWTable& t, const AdamWScalars& s, float* w, const float* g, float* m,
                 float* v, WeightCopy* copy) override {
    host().AdamWStep(t, s, w, g, m, v, copy);
  }
  std::unique_ptr<MuonBank> MakeMuonBank(const std::vector<MuonTensor>& t,
                                         const std::vector<MuonBankShape>& s) override {
    return host().MakeMuonBank(t, s);
  }
  void MuonMomentum(MuonBank& b, const float* g, float* m, float mu, bool nesterov) override {
    host().MuonMomentum(b, g, m, mu, nesterov);
  }
  void NewtonSchulz(MuonBank& b, const cpu::NewtonSchulzOptions& o) override {
    host().NewtonSchulz(b, o);
  }
  void MuonApply(MuonBank& b, float* w, double lr, float decay, WeightCopy* copy) override {
    host().MuonApply(b, w, lr, decay, copy);
  }
  double SumSquares(const float* x, size_t n) override { return host().SumSquares(x, n); }
  void Scale(float* x, size_t n, float s) override { host().Scale(x, n, s); }
  void ScaleRows(const std::vector<RowScale>& r, float* a, WeightCopy* copy) override {
    host().ScaleRows(r, a, copy);
  }

 private:
  static OptimizerOps& host() { return CpuOptimizerOps(); }
  MirroredMemory memory_;
};

RunConfig SmallMoe(const std::string& optimizer) {
  RunConfig c = test::SmallMoeConfig();
  c.model.kv_heads = 2;
  c.model.ffn_hidden = 48;
  c.model.seq_len = 8;
  c.moe.expert_hidden = 16;
  c.optimizer.name = optimizer;
  return c;
}

std::vector<float> Gradient(size_t n, int step) {
  std::mt19937 rng(100 + step);
  std::normal_distribution<float> nd(0.0f, 0.02f);
  std::vector<float> g(n);
  for (float& x : g) x = nd(rng);
  return g;
}

class OptimizerOpsTest : public ::testing::TestWithParam<std::string> {};

TEST_P(OptimizerOpsTest, BackendMemoryStateGivesTheHostBitsAndRoundTrips) {
  const RunConfig c = SmallMoe(GetParam());
  Model<float> model(c);
  model.Init(4);
  const size_t n = model.num_params();
  std::vector<float> w_host(model.params(), model.params() + n), w_mirror = w_host;
  MirroredOps ops;
  std::unique_ptr<Optimizer> host = MakeOptimizer(c.optimizer, model.param_infos());
  std::unique_ptr<Optimizer> mirror = MakeOptimizer(c.optimizer, model.param_infos(), ops);
  for (int step = 1; step <= 3; ++step) {
    const std::vector<float> g = Gradient(n, step);
    host->Step(w_host.data(), g.data(), 1e-2, step);
    mirror->Step(w_mirror.data(), g.data(), 1e-2, step);
  }
  ASSERT_EQ(std::memcmp(w_host.data(), w_mirror.data(), n * sizeof(float)), 0);
  // The mirrors hold nothing until synchronised, then the host optimizer's state exactly.
  const std::vector<StateBuffer> hs = host->state(), ms = mirror->state();
  ASSERT_EQ(hs.size(), ms.size());
  for (const StateBuffer& s : ms) {
    for (float x : *s.data) ASSERT_EQ(x, 0.0f) << s.name;
  }
  mirror->SyncToHost();
  for (size_t i = 0; i < hs.size(); ++i) {
    EXPECT_EQ(ms[i].name, hs[i].name);
    EXPECT_EQ(*ms[i].data, *hs[i].data) << hs[i].name;
  }
  // A checkpoint load: the same edited state into both, then the trajectories still agree.
  for (size_t i = 0; i < hs.size(); ++i) {
    for (float& x : *hs[i].data) x *= 0.5f;
    *ms[i].data = *hs[i].data;
  }
  mirror->SyncToDevice();
  const std::vector<float> g = Gradient(n, 4);
  host->Step(w_host.data(), g.data(), 1e-2, 4);
  mirror->Step(w_mirror.data(), g.data(), 1e-2, 4);
  EXPECT_EQ(std::memcmp(w_host.data(), w_mirror.data(), n * sizeof(float)), 0);
}

TEST_P(OptimizerOpsTest, TraitsDescribeTheOptimizersState) {
  const RunConfig c = SmallMoe(GetParam());
  Model<float> model(c);
  const OptimizerTraits traits = TraitsOf(c.optimizer);
  EXPECT_EQ(traits.muon, GetParam() != "adamw");
  EXPECT_EQ(traits.owns_bank, traits.muon);
  std::unique_ptr<Optimizer> opt = MakeOptimizer(c.optimizer, model.param_infos());
  // Every buffer the optimizer has is one the traits name, in their order, with the size the
  // traits give its tensors.
  std::vector<std::string> names;
  size_t state = 0, expected = 0;
  for (const StateBuffer& s : opt->state()) {
    names.push_back(s.name);
    state += s.data->size();
  }
  for (const ParamInfo& p : model.param_infos()) {
    expected += traits.StateElements(p);
    for (const std::string& b : traits.StateOf(p)) {
      EXPECT_NE(std::find(names.begin(), names.end(), b), names.end()) << p.name << " " << b;
    }
  }
  EXPECT_EQ(names, traits.state_names);
  EXPECT_EQ(state, expected);
  // Muon's rule: the groups say "muon" exactly where the traits put a hidden matrix.
  const auto groups = opt->groups();
  for (size_t i = 0; i < groups.size(); ++i) {
    const ParamInfo& p = model.param_infos()[i];
    EXPECT_EQ(groups[i].second == "muon", traits.muon && p.is_hidden_matrix()) << p.name;
  }
}

INSTANTIATE_TEST_SUITE_P(Optimizers, OptimizerOpsTest,
                         ::testing::Values("adamw", "muon", "muonclip"));

TEST(OptimizerTraits, RefusesAnUnknownName) {
  OptimizerConfig c;
  c.name = "sgd";
  EXPECT_THROW(TraitsOf(c), std::runtime_error);
}

}  // namespace
}  // namespace moelab
