// GPU twins of the whole training step (skip with the reason where no GPU is usable): the one
// trainer and model (core/train/trainer.cc, core/model/model.cc) on the CUDA backend (fp32)
// against the CPU backend over 20 steps for dense, MoE with shared experts,
// MLA, GQA and MuonClip; bf16 against fp32 over 200 steps, and with bf16 experts over 30 steps;
// bf16's fused attention against the reference path; RoPE fused into the mma attention kernels
// bitwise equal to the separate rope kernels; S_max equal to the CPU's; QK-Clip exact on the
// device; same seed ⇒ same losses.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "core/config.h"
#include "core/cuda_profiler.h"
#include "core/device.h"
#include "core/metrics.h"
#include "core/model/backend.h"
#include "core/model/model.h"
#include "core/optim/qk_clip_plan.h"
#include "core/train/trainer.h"
#if MOELAB_HAVE_CUDA
#include "kernels/cuda/cudnn_grouped_matmul.h"
#endif
#include "tests/common/test_util.h"
#include "tests/common/tiny_configs.h"

namespace moelab {
namespace {

namespace fs = std::filesystem;
using test::UseMla;
using test::UseMoe;

class CudaModelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string why = CudaSkipReason();
    if (!why.empty()) GTEST_SKIP() << why;
  }
};

struct Recorder : NullSink {
  std::vector<double> loss, grad_norm;
  std::vector<std::vector<float>> s_max;
  std::vector<std::vector<int64_t>> expert_counts;  // per step: [MoE layer][expert]
  RunStatus status = RunStatus::kRunning;
  std::string error;
  void OnStep(const StepRecord& r, const StepStats& s) override {
    loss.push_back(r.loss);
    grad_norm.push_back(r.grad_norm);
    s_max.push_back(s.max_logit_raw);
    expert_counts.push_back(s.expert_counts);
  }
  void OnEnd(RunStatus st, const std::string& e) override {
    status = st;
    error = e;
  }
};

RunConfig Small() {
  RunConfig c;
  c.model = {
      .vocab_size = 128, .d_model = 64, .layers = 2, .heads = 4, .ffn_hidden = 128, .seq_len = 32};
  test::UseShortMarkovRun(&c, /*batch_size=*/4, /*steps=*/20);
  c.schedule.warmup_steps = 2;
  c.eval.batches = 1;
  return c;
}

// Small() as a bf16 MoE on "cuda" for the expert-path comparisons: 512 tokens · top-2 over 4
// experts (256 rows an expert on average), one shared expert, no dense layer.
RunConfig SmallMoeBf16() {
  RunConfig c = Small();
  c.train.batch_size = 8;
  c.model.seq_len = 64;
  UseMoe(&c.moe, {.experts = 4, .top_k = 2, .shared = 1, .hidden = 32, .dense_layers = 0});
  c.train.precision = "bf16";
  c.train.device = "cuda";
  return c;
}

// Both runs finished, with as many steps, and every step's loss of `got` within `nats` of
// `want`'s (wrap in ASSERT_NO_FATAL_FAILURE: a failed ASSERT ends only this function).
void ExpectLossesTrack(const Recorder& got, const Recorder& want, double nats) {
  ASSERT_EQ(got.status, RunStatus::kDone) << got.error;
  ASSERT_EQ(want.status, RunStatus::kDone) << want.error;
  ASSERT_EQ(got.loss.size(), want.loss.size());
  for (size_t i = 0; i < got.loss.size(); ++i) {
    EXPECT_NEAR(got.loss[i], want.loss[i], nats) << "step " << i + 1;
  }
}

Recorder RunOn(RunConfig c, const std::string& device, const std::string& precision) {
  c.train.device = device;
  c.train.precision = precision;
  Recorder r;
  TrainOptions o;
  o.progress = false;
  o.checkpoint_dir = (fs::temp_directory_path() /
                      ("moelab_cuda_model_test_" + device + "_" + precision + "_" +
                       std::to_string(::testing::UnitTest::GetInstance()->random_seed())))
                         .string();
  fs::remove_all(o.checkpoint_dir);
  Train(c, &r, o);
  fs::remove_all(o.checkpoint_dir);
  return r;
}

// fp32 on the GPU against the CPU: per-step loss within 2e-4 relative (the kernels' sums run in
// a different order; 20 optimizer steps amplify 1e-6 differences by about 100×), S_max of the
// first step within 1e-5 relative (same weights, one forward: the per-op tolerance).
void ExpectTwins(const RunConfig& c) {
  const Recorder cpu = RunOn(c, "cpu", "fp32");
  const Recorder gpu = RunOn(c, "cuda", "fp32");
  ASSERT_EQ(cpu.status, RunStatus::kDone) << cpu.error;
  ASSERT_EQ(gpu.status, RunStatus::kDone) << gpu.error;
  ASSERT_EQ(gpu.loss.size(), cpu.loss.size());
  for (size_t i = 0; i < cpu.loss.size(); ++i) {
    EXPECT_NEAR(gpu.loss[i], cpu.loss[i], 2e-4 * std::fabs(cpu.loss[i])) << "step " << i + 1;
  }
  ASSERT_EQ(gpu.s_max[0].size(), cpu.s_max[0].size());
  for (size_t h = 0; h < cpu.s_max[0].size(); ++h) {
    EXPECT_NEAR(gpu.s_max[0][h], cpu.s_max[0][h], 1e-5 * std::fabs(cpu.s_max[0][h]) + 1e-6)
        << "head " << h;
  }
}

// The profiler's classes (ms) over one forward and backward of c on fixed tokens: which GPU
// paths a run under the current switches takes.
std::map<std::string, double> OneStepProfile(const RunConfig& c) {
  Model<float> model(c);
  model.Init(c.train.seed);
  CudaOpProfiler profiler;
  model.backend().set_profiler(&profiler);
  std::vector<int32_t> tokens(size_t(c.train.batch_size) * (c.model.seq_len + 1));
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = int32_t((i * 37 + 11) % 128);
  StepStats stats;
  model.ForwardBackward(tokens.data(), c.train.batch_size, &stats);
  const auto t = profiler.Totals();
  model.backend().set_profiler(nullptr);
  return t;
}

TEST_F(CudaModelTest, DenseMatchesCpu) { ExpectTwins(Small()); }

TEST_F(CudaModelTest, MoeWithSharedExpertsMatchesCpu) {
  RunConfig c = Small();
  UseMoe(&c.moe, {.experts = 8, .top_k = 2, .shared = 1, .hidden = 32, .dense_layers = 1});
  c.moe.balance = "aux_free";
  ExpectTwins(c);
  c.moe.balance = "aux_loss";
  c.moe.router = "sigmoid";
  c.moe.shared_experts = 2;
  ExpectTwins(c);
}

// The Switch aux loss over micro-batches (issue 22): the device layer hands its counts and score
// sums to the micro-batching loop's global-batch hook, as the CPU layer does.
TEST_F(CudaModelTest, AuxLossOverMicroBatchesMatchesCpu) {
  RunConfig c = Small();
  UseMoe(&c.moe, {.experts = 8, .top_k = 2, .shared = 1, .hidden = 32});
  c.moe.balance = "aux_loss";
  c.moe.aux_loss_coef = 0.05;
  c.train.micro_batch = 2;
  ExpectTwins(c);
}

TEST_F(CudaModelTest, MlaMatchesCpu) {
  RunConfig c = Small();
  UseMla(&c.model, {.q_lora = 32, .kv_lora = 32, .nope = 16, .rope = 8, .v = 16});
  ExpectTwins(c);
}

TEST_F(CudaModelTest, GqaWithQkNormAndSoftcapMatchesCpu) {
  RunConfig c = Small();
  c.model.kv_heads = 2;
  c.model.qk_norm = true;
  c.model.logit_softcap = 30;
  c.model.z_loss = 1e-4;
  ExpectTwins(c);
}

TEST_F(CudaModelTest, MuonClipMatchesCpu) {
  RunConfig c = Small();
  c.optimizer.name = "muonclip";
  c.optimizer.lr = 0.02;
  c.optimizer.qk_clip_tau = 2.0;  // low enough to clip in 20 steps
  ExpectTwins(c);
}

// bf16 compute against fp32 over 200 steps: stated tolerance 0.05 nats on the mean loss of the
// last 20 steps, and no step's loss more than 0.15 nats away.
TEST_F(CudaModelTest, Bf16TracksFp32Over200Steps) {
  RunConfig c = Small();
  c.train.steps = 200;
  c.schedule.warmup_steps = 20;
  const Recorder fp32 = RunOn(c, "cuda", "fp32");
  const Recorder bf16 = RunOn(c, "cuda", "bf16");
  ASSERT_EQ(fp32.status, RunStatus::kDone) << fp32.error;
  ASSERT_EQ(bf16.status, RunStatus::kDone) << bf16.error;
  double a = 0, b = 0;
  for (size_t i = 180; i < 200; ++i) a += fp32.loss[i], b += bf16.loss[i];
  EXPECT_NEAR(a / 20, b / 20, 0.05);
  for (size_t i = 0; i < 200; ++i) EXPECT_NEAR(bf16.loss[i], fp32.loss[i], 0.15) << i + 1;
}

// bf16 experts (routed and shared experts as bf16 GEMMs with fp32 accumulation on the bf16
// weight copy, bf16 expert activations, fp32 master gradients) against fp32 on the same MoE runs
// over 30 steps: the first step's loss within 1e-2 nats (same weights, one forward: bf16
// rounding only) and every step within 0.05 nats. Softmax routing, aux-free, one shared expert,
// a dense first layer; sigmoid routing with the aux loss and two shared experts (their sum in
// fp32); no shared expert (the combine alone writes the output).
TEST_F(CudaModelTest, Bf16ExpertsTrackFp32) {
  struct Variant {
    const char* name;
    const char* router;
    const char* balance;
    int shared, dense_layers;
  };
  for (const Variant& v : {Variant{"softmax aux-free 1 shared", "softmax", "aux_free", 1, 1},
                           Variant{"sigmoid aux-loss 2 shared", "sigmoid", "aux_loss", 2, 0},
                           Variant{"no shared", "softmax", "aux_free", 0, 0}}) {
    SCOPED_TRACE(v.name);
    RunConfig c = Small();
    c.train.steps = 30;
    UseMoe(&c.moe, {.experts = 8,
                    .top_k = 2,
                    .shared = v.shared,
                    .hidden = 32,
                    .dense_layers = v.dense_layers});
    c.moe.router = v.router;
    c.moe.balance = v.balance;
    const Recorder fp32 = RunOn(c, "cuda", "fp32");
    const Recorder bf16 = RunOn(c, "cuda", "bf16");
    ASSERT_NO_FATAL_FAILURE(ExpectLossesTrack(bf16, fp32, 0.05));
    EXPECT_NEAR(bf16.loss[0], fp32.loss[0], 1e-2);
  }
}

// bf16 experts over the chunked layout (train.kernels.experts "chunked") against the grouped GEMMs
// (the default) on the same 20-step runs: every loss within 0.02 nats (the same products, cuBLAS's
// summation orders differ), and the profiler shows which path ran ("moe/experts" chunked,
// "moe/experts grouped" otherwise).
TEST_F(CudaModelTest, ChunkedExpertsTrackGroupedExperts) {
  const RunConfig c = SmallMoeBf16();
  RunConfig cc = c;
  cc.train.kernels.experts = "chunked";
  // Which path one forward and backward takes, from the profiler's sub-classes.
  auto paths = [&](const RunConfig& run) {
    const auto t = OneStepProfile(run);
    return std::make_pair(t.count("moe/experts") > 0, t.count("moe/experts grouped") > 0);
  };
  const auto chunked_paths = paths(cc);
  EXPECT_TRUE(chunked_paths.first) << "the chunked layout never ran";
  EXPECT_FALSE(chunked_paths.second) << "a layer ran the grouped GEMMs";
  const Recorder chunked = RunOn(cc, "cuda", "bf16");
  const auto grouped_paths = paths(c);  // the default
  const Recorder grouped = RunOn(c, "cuda", "bf16");
  EXPECT_FALSE(grouped_paths.first);
  EXPECT_TRUE(grouped_paths.second);
  ASSERT_NO_FATAL_FAILURE(ExpectLossesTrack(chunked, grouped, 0.02));
}

// The experts on cuDNN's grouped matmul (train.kernels.experts "cudnn": device-side expert offsets,
// no host sync in the layer's forward; the counts reach the recorder through a host function)
// against the grouped GEMMs on the same 20-step runs: every loss within 0.02 nats, the first
// layer's expert counts of the first step recorded alike (its input is the same bits on both
// paths), and the profiler shows "moe/experts cudnn".
TEST_F(CudaModelTest, CudnnExpertsTrackGroupedExperts) {
  std::string why;
#if MOELAB_HAVE_CUDA
  if (!cuda::CudnnGroupedMatmulAvailable(&why)) GTEST_SKIP() << "cuDNN test skipped: " << why;
#else
  GTEST_SKIP() << "built without CUDA";
#endif
  RunConfig c = SmallMoeBf16();
  c.moe.balance = "aux_free";
  RunConfig on = c;
  on.train.kernels.experts = "cudnn";
  const auto t = OneStepProfile(on);
  EXPECT_GT(t.count("moe/experts cudnn"), 0u) << "the cuDNN experts never ran";
  EXPECT_EQ(t.count("moe/experts grouped"), 0u) << "a layer ran the grouped GEMMs";
  const Recorder cudnn = RunOn(on, "cuda", "bf16");
  const Recorder grouped = RunOn(c, "cuda", "bf16");
  ASSERT_NO_FATAL_FAILURE(ExpectLossesTrack(cudnn, grouped, 0.02));
  ASSERT_FALSE(cudnn.expert_counts.empty());
  ASSERT_FALSE(grouped.expert_counts.empty());
  const std::vector<int64_t>& got = cudnn.expert_counts.front();
  const std::vector<int64_t>& want = grouped.expert_counts.front();
  ASSERT_EQ(got.size(), want.size());
  ASSERT_GE(got.size(), 4u);
  int64_t routed = 0;
  for (int e = 0; e < 4; ++e) {
    EXPECT_EQ(got[e], want[e]) << "layer 0, expert " << e;
    routed += got[e];
  }
  EXPECT_EQ(routed, 8 * 64 * 2) << "every token's two choices counted";
}

// The experts on the device-shaped grouped GEMM (train.kernels.experts "device"), which read the
// dispatch plan's offsets on the device (the layer downloads none: the routing counts reach the
// host through the pinned staging, after the step), against the grouped GEMMs on the same 20-step
// bf16 runs with aux-loss-free balancing (so the counts feed the bias update): every loss within
// 0.02 nats and the first step's counts equal.
TEST_F(CudaModelTest, DeviceExpertsTrackGroupedExperts) {
  RunConfig c = SmallMoeBf16();
  c.moe.balance = "aux_free";
  RunConfig on = c;
  on.train.kernels.experts = "device";
  const auto t = OneStepProfile(on);
  EXPECT_GT(t.count("moe/experts device"), 0u) << "the device-shaped experts never ran";
  EXPECT_EQ(t.count("moe/experts grouped"), 0u) << "a layer ran the grouped GEMMs";
  const Recorder device = RunOn(on, "cuda", "bf16");
  const Recorder grouped = RunOn(c, "cuda", "bf16");
  ASSERT_NO_FATAL_FAILURE(ExpectLossesTrack(device, grouped, 0.02));
  ASSERT_FALSE(device.expert_counts.empty());
  ASSERT_FALSE(grouped.expert_counts.empty());
  EXPECT_EQ(device.expert_counts.front(), grouped.expert_counts.front());
}

// bf16 attention activations (train.kernels.attention_acts "bf16": qkv, att and datt held in bf16,
// RoPE on bf16 heads) against fp32 ones on the same 20-step bf16 runs, with GQA: every loss within
// 0.02 nats and the first step's S_max within 2e-2 relative, and not the same bits (the narrower
// path ran: its q, k, v are rounded before RoPE); with QK-norm, which keeps the fp32 path, the same
// bits.
TEST_F(CudaModelTest, Bf16AttentionActsTrackFp32Acts) {
  RunConfig c = Small();
  c.model.heads = 4;
  c.model.kv_heads = 2;
  c.train.precision = "bf16";
  c.train.device = "cuda";
  RunConfig bf16_acts = c;
  bf16_acts.train.kernels.attention_acts = "bf16";
  const Recorder narrow = RunOn(bf16_acts, "cuda", "bf16");
  const Recorder wide = RunOn(c, "cuda", "bf16");
  ASSERT_NO_FATAL_FAILURE(ExpectLossesTrack(narrow, wide, 0.02));
  EXPECT_NE(narrow.loss, wide.loss) << "the bf16 activations never ran";
  // S_max (QK-Clip's input) of the first step: q and k rounded before RoPE instead of after.
  ASSERT_EQ(narrow.s_max[0].size(), wide.s_max[0].size());
  for (size_t h = 0; h < wide.s_max[0].size(); ++h) {
    EXPECT_NEAR(narrow.s_max[0][h], wide.s_max[0][h], 2e-2 * std::fabs(wide.s_max[0][h]) + 1e-3)
        << "head " << h;
  }
  c.model.qk_norm = true;
  bf16_acts.model.qk_norm = true;
  const Recorder normed_narrow = RunOn(bf16_acts, "cuda", "bf16");
  const Recorder normed = RunOn(c, "cuda", "bf16");
  ASSERT_EQ(normed_narrow.status, RunStatus::kDone) << normed_narrow.error;
  EXPECT_EQ(normed_narrow.loss, normed.loss) << "QK-norm keeps the fp32 activations";
}

// The bf16 mode's gated FFN (train.kernels.ffn "fused": gate and up in one GEMM, bf16
// intermediates) for the dense FFN and the shared expert, against the split FFN (the default) on
// the same 20-step run of a model with both: every loss within 0.02 nats (h1, h3 and dact now
// rounded to bf16), and the profiler shows which path ran (the fused dense FFN is one "ffn"
// bracket; split, its GEMMs are "gemm").
TEST_F(CudaModelTest, FusedGatedFfnTracksSplitFfn) {
  RunConfig c = Small();
  UseMoe(&c.moe, {.experts = 4, .top_k = 2, .shared = 1, .hidden = 32, .dense_layers = 1});
  c.train.precision = "bf16";
  c.train.device = "cuda";
  auto ffn_bracket = [&](const RunConfig& run) { return OneStepProfile(run).count("ffn") > 0; };
  RunConfig fused_ffn = c;
  fused_ffn.train.kernels.ffn = "fused";
  const bool fused_bracket = ffn_bracket(fused_ffn);
  const Recorder fused = RunOn(fused_ffn, "cuda", "bf16");
  const bool split_bracket = ffn_bracket(c);
  const Recorder split = RunOn(c, "cuda", "bf16");
  EXPECT_TRUE(fused_bracket) << "the fused FFN never ran";
  EXPECT_FALSE(split_bracket);
  ASSERT_NO_FATAL_FAILURE(ExpectLossesTrack(fused, split, 0.02));
}

// bf16 mode's fused attention (kernels/cuda/flash_attention.h) against the reference path on
// the same run (train.kernels.attention forces each): per-step loss within 0.05 nats over 20 steps
// and the first step's S_max within 2e-2 relative (the fused kernels attend with bf16 q, k, v and
// round P and dS to bf16; the reference path keeps them fp32). MHA with head dim 16 and 64 with
// a soft-cap, GQA, and MLA's 48/32.
TEST_F(CudaModelTest, FusedAttentionTracksReferencePathInBf16) {
  struct Shape {
    const char* name;
    int heads, kv_heads;
    double softcap;
    const char* attention;
  };
  for (const Shape& shape :
       {Shape{"mha 16", 4, 0, 0.0, "mha"}, Shape{"mha 64 cap", 1, 0, 5.0, "mha"},
        Shape{"gqa 16", 4, 2, 0.0, "mha"}, Shape{"mla 48/32", 4, 0, 0.0, "mla"}}) {
    SCOPED_TRACE(shape.name);
    RunConfig c = Small();
    c.model.heads = shape.heads;
    c.model.kv_heads = shape.kv_heads;
    c.model.logit_softcap = shape.softcap;
    c.model.attention = shape.attention;
    c.train.kernels.attention = "reference";
    const Recorder ref = RunOn(c, "cuda", "bf16");
    c.train.kernels.attention = "fused";
    const Recorder fused = RunOn(c, "cuda", "bf16");
    ASSERT_EQ(ref.status, RunStatus::kDone) << ref.error;
    ASSERT_EQ(fused.status, RunStatus::kDone) << fused.error;
    for (size_t i = 0; i < ref.loss.size(); ++i) {
      EXPECT_NEAR(fused.loss[i], ref.loss[i], 0.05) << "step " << i + 1;
    }
    ASSERT_EQ(fused.s_max[0].size(), ref.s_max[0].size());
    for (size_t h = 0; h < ref.s_max[0].size(); ++h) {
      EXPECT_NEAR(fused.s_max[0][h], ref.s_max[0][h], 2e-2 * std::fabs(ref.s_max[0][h]) + 1e-3)
          << "head " << h;
    }
  }
}

// RoPE inside the mma attention kernels (train.kernels.rope "fused", with attention_kernel "mma")
// against the separate rope kernels around them: the kernels rotate with the rope kernel's own
// arithmetic before the same bf16 rounding, so 5 bf16 steps give the same losses to the bit; the
// profiler shows that the fused run launched no rope op. MHA, and GQA with QK-norm (the norm
// writes q and k before the rotation) and a soft-cap.
TEST_F(CudaModelTest, FusedRopeEqualsSeparateRopeBitwise) {
  struct Shape {
    const char* name;
    int heads, kv_heads;
    bool qk_norm;
    double softcap;
  };
  for (const Shape& shape :
       {Shape{"mha 16", 4, 0, false, 0.0}, Shape{"gqa 16 qk-norm cap", 4, 2, true, 5.0}}) {
    SCOPED_TRACE(shape.name);
    RunConfig c = Small();
    c.train.steps = 5;
    c.model.heads = shape.heads;
    c.model.kv_heads = shape.kv_heads;
    c.model.qk_norm = shape.qk_norm;
    c.model.logit_softcap = shape.softcap;
    c.train.precision = "bf16";
    c.train.device = "cuda";
    c.train.kernels.attention_kernel = "mma";
    // Fused RoPE acts on fp32 q and k (bf16 attention activations rotate their own heads).
    c.train.kernels.attention_acts = "fp32";
    // rope launches in one forward and backward
    auto rope_ops = [&] { return OneStepProfile(c).count("rope"); };
    c.train.kernels.rope = "separate";
    const Recorder separate = RunOn(c, "cuda", "bf16");
    const size_t separate_ops = rope_ops();
    c.train.kernels.rope = "fused";
    const Recorder fused = RunOn(c, "cuda", "bf16");
    const size_t fused_ops = rope_ops();
    EXPECT_GT(separate_ops, 0u);
    EXPECT_EQ(fused_ops, 0u) << "the fused run still launched the rope kernel";
    ASSERT_EQ(separate.status, RunStatus::kDone) << separate.error;
    ASSERT_EQ(fused.status, RunStatus::kDone) << fused.error;
    ASSERT_EQ(fused.loss.size(), separate.loss.size());
    for (size_t i = 0; i < separate.loss.size(); ++i) {
      EXPECT_EQ(fused.loss[i], separate.loss[i]) << "step " << i + 1;
    }
  }
}

TEST_F(CudaModelTest, SameSeedSameLosses) {
  RunConfig c = Small();
  UseMoe(&c.moe, {.experts = 4, .top_k = 2, .shared = 1, .hidden = 32});
  const Recorder a = RunOn(c, "cuda", "bf16");
  const Recorder b = RunOn(c, "cuda", "bf16");
  ASSERT_EQ(a.status, RunStatus::kDone) << a.error;
  EXPECT_EQ(a.loss, b.loss);
  EXPECT_EQ(a.grad_norm, b.grad_norm);
}

// After clipping on the device, the same batch's max logit of every clipped head equals τ.
TEST_F(CudaModelTest, QkClipExactOnDevice) {
  for (const std::string attention : {"mha", "mla"}) {
    RunConfig c = Small();
    c.model.attention = attention;
    c.model.layers = 1;      // a clipped layer changes the next layer's input, so one layer
    c.model.init_std = 0.2;  // large logits at init
    c.train.device = "cuda";
    c.train.precision = "fp32";
    Model<float> model(c);
    model.Init(3);
    std::vector<int32_t> tokens(static_cast<size_t>(c.train.batch_size) * (c.model.seq_len + 1));
    for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>((i * 37) % 128);
    StepStats before, after;
    model.Forward(tokens.data(), c.train.batch_size, &before);
    float lo = 1e30f;
    for (float s : before.max_logit_raw) lo = std::min(lo, s);
    c.optimizer.qk_clip_tau = 0.9 * lo;  // clips every head
    const QkClipPlan plan = PlanQkClip(c, model.param_infos(), before.max_logit_raw, 1);
    ASSERT_FALSE(plan.events.empty());
    model.backend().ScaleRows(plan.scales, model.params());
    model.ParamsChanged();
    model.Forward(tokens.data(), c.train.batch_size, &after);
    for (const ClipEvent& e : plan.events) {
      const float s = after.max_logit_raw[static_cast<size_t>(e.layer) * c.model.heads + e.head];
      EXPECT_NEAR(s, c.optimizer.qk_clip_tau, 1e-5 * c.optimizer.qk_clip_tau)
          << attention << " layer " << e.layer << " head " << e.head;
    }
  }
}

}  // namespace
}  // namespace moelab
