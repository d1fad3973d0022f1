// GPU twins of the optimizer ops (skip with the reason where no GPU is usable): the one AdamW and
// Muon over the CUDA ops (fp32 Newton–Schulz) against the same optimizers over the CPU ops for
// several steps on a real model's parameter layout, the QK-Clip plan on the device against the
// plan on the host, the device gradient norm.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <random>
#include <vector>

#include "core/config.h"
#include "core/device.h"
#include "core/model/backend.h"
#include "core/model/model.h"
#include "core/optim/optimizer.h"
#include "core/optim/qk_clip_plan.h"
#include "tests/common/tiny_configs.h"

#if MOELAB_HAVE_CUDA
#include <cuda_bf16.h>

#include "core/model/cuda_optimizer_ops.h"
#include "kernels/cuda/device.h"
#endif

namespace moelab {
namespace {

class CudaOptimizerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string why = CudaSkipReason();
    if (!why.empty()) GTEST_SKIP() << why;
  }
};

RunConfig SmallMoe() {
  RunConfig c = test::SmallMoeConfig();
  c.model.d_model = 64;
  c.model.kv_heads = 2;
  c.model.ffn_hidden = 96;
  return c;
}

// N(0, 0.01) draws from one std::mt19937, as random gradients (and weights) for the optimizers;
// one object per test, so that each step's draws follow on from the last.
class NormalDraws {
 public:
  explicit NormalDraws(unsigned seed) : rng_(seed) {}
  void Fill(std::vector<float>* v) {
    for (float& x : *v) x = normal_(rng_);
  }

 private:
  std::mt19937 rng_;
  std::normal_distribution<float> normal_{0.0f, 0.01f};
};

#if MOELAB_HAVE_CUDA
// A CUDA backend: the device memory the optimizer state lives in.
std::unique_ptr<Backend<float>> DeviceBackend() {
  RunConfig c = SmallMoe();
  c.train.device = "cuda";
  return MakeCudaBackend(c);
}

// Max |a-b| / (max |b| + tiny) over the arena.
double RelDiff(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0, scale = 1e-30;
  for (size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::fabs(static_cast<double>(a[i]) - b[i]));
    scale = std::max(scale, std::fabs(static_cast<double>(b[i])));
  }
  return diff / scale;
}

// The model's parameters, copied to the host (where the CPU reference starts from them) and to
// `device`.
std::vector<float> CopyParams(const Model<float>& model, cuda::DeviceBuffer<float>* device) {
  std::vector<float> host(model.params(), model.params() + model.num_params());
  device->Upload(host);
  return host;
}

// Runs `steps` updates with the same random gradients on the CPU and the device optimizer.
void CompareOptimizer(const std::string& name, double tolerance, double adamw_lr = 0) {
  RunConfig c = SmallMoe();
  c.optimizer.name = name;
  c.optimizer.adamw_lr = adamw_lr;
  Model<float> model(c);
  model.Init(3);
  const size_t n = model.num_params();
  cuda::DeviceBuffer<float> dparams, dgrads(n);
  std::vector<float> cpu = CopyParams(model, &dparams);
  std::unique_ptr<Optimizer> ref = MakeOptimizer(c.optimizer, model.param_infos());
  const std::unique_ptr<Backend<float>> be = DeviceBackend();
  CudaOptimizerOps ops(be.get(), /*ns_bf16=*/false);
  std::unique_ptr<Optimizer> dev = MakeOptimizer(c.optimizer, model.param_infos(), ops);
  NormalDraws draws(5);
  std::vector<float> g(n);
  for (int step = 1; step <= 5; ++step) {
    draws.Fill(&g);
    dgrads.Upload(g.data(), n);
    ref->Step(cpu.data(), g.data(), 1e-2, step);
    dev->Step(dparams.data(), dgrads.data(), 1e-2, step);
  }
  const std::vector<float> out = dparams.Download();
  EXPECT_LT(RelDiff(out, cpu), tolerance) << name;
  // The state round-trips through the CPU layout (checkpoints).
  dev->SyncToHost();
  const std::vector<StateBuffer> ds = dev->state(), rs = ref->state();
  ASSERT_EQ(ds.size(), rs.size());
  for (size_t i = 0; i < ds.size(); ++i) {
    EXPECT_EQ(ds[i].name, rs[i].name);
    ASSERT_EQ(ds[i].data->size(), rs[i].data->size());
    EXPECT_LT(RelDiff(*ds[i].data, *rs[i].data), tolerance) << ds[i].name;
  }
}
#endif

// Tolerance: fp32 elementwise math in a different order (FMA contraction) → ~1e-6 relative.
TEST_F(CudaOptimizerTest, AdamWMatchesCpu) {
#if MOELAB_HAVE_CUDA
  CompareOptimizer("adamw", 1e-5);
#endif
}

// Newton–Schulz through cuBLAS (full GEMMs) vs OpenBLAS SYRK/SYMM, 5 steps of a quintic that
// amplifies rounding: 1e-4 relative on the parameters after 5 updates.
TEST_F(CudaOptimizerTest, MuonMatchesCpuInFp32) {
#if MOELAB_HAVE_CUDA
  CompareOptimizer("muon", 1e-4);
#endif
}

// optimizer.adamw_lr sets the AdamW group's peak under Muon (the device Muon ignored it before).
TEST_F(CudaOptimizerTest, MuonHonoursTheAdamWGroupsLearningRate) {
#if MOELAB_HAVE_CUDA
  CompareOptimizer("muon", 1e-4, /*adamw_lr=*/3e-3);
#endif
}

#if MOELAB_HAVE_CUDA
// The copy of every parameter element equals the round-to-nearest-even cast of its fp32 weight.
void ExpectCopyIsTheCast(const Model<float>& model, const cuda::DeviceBuffer<float>& params,
                         const Bf16WeightCopy& copy, const std::string& what) {
  const size_t n = model.num_params();
  const std::vector<float> w = params.Download();
  std::vector<cuda::bf16> c(n);
  MOELAB_CUDA_CHECK(
      cudaMemcpy(c.data(), copy.values(), n * sizeof(cuda::bf16), cudaMemcpyDeviceToHost));
  for (const ParamInfo& p : model.param_infos()) {
    for (size_t i = p.offset; i < p.offset + p.size(); ++i) {
      ASSERT_EQ(__bfloat162float(c[i]), __bfloat162float(__float2bfloat16(w[i])))
          << what << ": " << p.name << " element " << i - p.offset;
    }
  }
}

// The device optimizers write the bf16 copy in their update (no Refresh needed); a shard's
// optimizer (ZeRO-1) leaves the rest to Refresh, which casts what it did not mark.
void CheckWeightCopy(const std::string& name) {
  RunConfig c = SmallMoe();
  c.optimizer.name = name;
  c.optimizer.qk_clip_tau = 5;
  Model<float> model(c);
  model.Init(3);
  const size_t n = model.num_params();
  cuda::DeviceBuffer<float> dparams, dgrads(n);
  CopyParams(model, &dparams);
  Bf16WeightCopy copy;
  copy.Resize(n);
  const std::unique_ptr<Backend<float>> be = DeviceBackend();
  CudaOptimizerOps ops(be.get(), /*ns_bf16=*/true);
  std::unique_ptr<Optimizer> dev = MakeOptimizer(c.optimizer, model.param_infos(), ops);
  dev->WriteWeightCopy(&copy);
  NormalDraws draws(5);
  std::vector<float> g(n);
  for (int step = 1; step <= 2; ++step) {
    draws.Fill(&g);
    dgrads.Upload(g.data(), n);
    dev->Step(dparams.data(), dgrads.data(), 1e-2, step);
    ExpectCopyIsTheCast(model, dparams, copy, name + " step");
    // QK-Clip after the update re-rounds the rows it scaled.
    const std::vector<float> s = {7.f, 2.f, 5.5f, 30.f, 1.f, 6.f, 5.f, 9.f};
    ops.ScaleRows(PlanQkClip(c, model.param_infos(), s, step).scales, dparams.data(), &copy);
    ExpectCopyIsTheCast(model, dparams, copy, name + " clip");
    copy.Refresh(dparams.data());
  }
  // A shard: the first half of the tensors. The others change behind its back (all-gather).
  std::vector<ParamInfo> shard(model.param_infos().begin(),
                               model.param_infos().begin() + model.param_infos().size() / 2);
  std::unique_ptr<Optimizer> part = MakeOptimizer(c.optimizer, shard, ops);
  part->WriteWeightCopy(&copy);
  part->Step(dparams.data(), dgrads.data(), 1e-2, 1);
  std::vector<float> w = dparams.Download();
  for (size_t i = shard.back().offset + shard.back().size(); i < n; ++i) w[i] += 0.25f;
  dparams.Upload(w.data(), n);
  copy.Refresh(dparams.data());
  ExpectCopyIsTheCast(model, dparams, copy, name + " shard");
}
#endif

TEST_F(CudaOptimizerTest, AdamWWritesTheBf16WeightCopy) {
#if MOELAB_HAVE_CUDA
  CheckWeightCopy("adamw");
#endif
}

TEST_F(CudaOptimizerTest, MuonWritesTheBf16WeightCopy) {
#if MOELAB_HAVE_CUDA
  CheckWeightCopy("muon");
#endif
}

// The hand-over on a bf16 CUDA model: the optimizer writes the backend's copy, QK-Clip through
// the backend re-rounds its rows, and a checkpoint load (WriteParams) refreshes everything.
TEST_F(CudaOptimizerTest, Bf16ModelsCopyFollowsUpdatesClipsAndLoads) {
#if MOELAB_HAVE_CUDA
  RunConfig c = SmallMoe();
  c.train.device = "cuda";
  c.train.precision = "bf16";
  c.optimizer.name = "muonclip";
  c.optimizer.qk_clip_tau = 5;
  Model<float> model(c);
  model.Init(2);
  Backend<float>& be = model.backend();
  ASSERT_NE(be.weight_copy(), nullptr);
  const auto* copy = static_cast<const Bf16WeightCopy*>(be.weight_copy());
  std::unique_ptr<Optimizer> opt =
      MakeOptimizer(c.optimizer, model.param_infos(), be.optimizer_ops());
  opt->WriteWeightCopy(be.weight_copy());
  const size_t n = model.num_params();
  NormalDraws draws(9);
  std::vector<float> g(n), host(n);
  // Views of the device arena for the checks.
  auto check = [&](const std::string& what) {
    model.ReadParams(host.data());
    cuda::DeviceBuffer<float> d(n);
    d.Upload(host.data(), n);
    ExpectCopyIsTheCast(model, d, *copy, what);
  };
  for (int step = 1; step <= 2; ++step) {
    draws.Fill(&g);
    be.ToBackend(model.grads(), g.data(), n * sizeof(float));
    opt->Step(model.params(), model.grads(), 1e-2, step);
    const std::vector<float> s = {7.f, 2.f, 5.5f, 30.f, 1.f, 6.f, 5.f, 9.f};
    be.ScaleRows(PlanQkClip(c, model.param_infos(), s, step).scales, model.params());
    model.ParamsChanged();
    check("step " + std::to_string(step));
  }
  // A load right after an update (the marks of the update must not survive it).
  opt->Step(model.params(), model.grads(), 1e-2, 3);
  draws.Fill(&host);
  model.WriteParams(host.data());
  check("load");
#endif
}

TEST_F(CudaOptimizerTest, QkClipPlanOnDeviceIsExact) {
#if MOELAB_HAVE_CUDA
  for (const std::string attention : {"mha", "mla"}) {
    RunConfig c = SmallMoe();
    c.model.attention = attention;
    c.optimizer.qk_clip_tau = 5;
    Model<float> model(c);
    model.Init(1);
    const size_t n = model.num_params();
    cuda::DeviceBuffer<float> d;
    std::vector<float> cpu = CopyParams(model, &d);
    const std::vector<float> s = {7.f, 2.f, 5.5f, 30.f, 1.f, 6.f, 5.f, 9.f};
    const QkClipPlan plan = PlanQkClip(c, model.param_infos(), s, 1);
    ApplyQkClipPlan(plan, cpu.data());
    const std::unique_ptr<Backend<float>> be = DeviceBackend();
    be->optimizer_ops().ScaleRows(plan.scales, d.data(), nullptr);
    const std::vector<float> out = d.Download();
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(out[i], cpu[i]) << attention << " at " << i;
  }
#endif
}

TEST_F(CudaOptimizerTest, GradNormAndScale) {
#if MOELAB_HAVE_CUDA
  const size_t n = 3'000'001;
  std::vector<float> x(n);
  double ref = 0;
  for (size_t i = 0; i < n; ++i) {
    x[i] = static_cast<float>(std::sin(0.001 * i));
    ref += static_cast<double>(x[i]) * x[i];
  }
  cuda::DeviceBuffer<float> d(n);
  d.Upload(x.data(), n);
  const std::unique_ptr<Backend<float>> be = DeviceBackend();
  OptimizerOps& ops = be->optimizer_ops();
  auto norm = [&] { return std::sqrt(ops.SumSquares(d.data(), n)); };
  EXPECT_NEAR(norm(), std::sqrt(ref), 1e-9 * std::sqrt(ref));
  EXPECT_EQ(norm(), norm());  // deterministic
  ops.Scale(d.data(), n, 0.5f);
  EXPECT_NEAR(norm(), 0.5 * std::sqrt(ref), 1e-9 * std::sqrt(ref));
#endif
}

}  // namespace
}  // namespace moelab
