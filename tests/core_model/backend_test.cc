// The backend seam (core/model/backend.h) proven on the CPU: a checking backend that forwards to
// the CPU one but refuses any pointer outside its own allocations shows that the one model and
// the one trainer never touch host memory where a device backend would hold the data (which would
// crash or read garbage on a GPU), and that running through it changes no bit.
#include "core/model/backend.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/metrics.h"
#include "core/model/model.h"
#include "core/optim/qk_clip_plan.h"
#include "core/train/micro_batch.h"
#include "core/train/trainer.h"
#include "tests/common/tiny_configs.h"

namespace moelab {
namespace {

// Forwards every op to the CPU backend after checking that each pointer argument lies inside
// one of this backend's live allocations (null allowed where an op takes optional buffers).
template <typename T>
class CheckingBackend final : public Backend<T> {
 public:
  CheckingBackend() : cpu_(MakeCpuBackend<T>()) {}
  int violations = 0;
  std::string first_violation;
  int ops = 0;

  std::string name() const override { return "checking-cpu"; }
  bool is_host() const override { return false; }  // the model must not rely on host pointers
  void* Allocate(size_t bytes) override {
    void* p = cpu_->Allocate(bytes);
    if (p) live_[static_cast<const char*>(p)] = bytes;
    return p;
  }
  void Release(void* p) noexcept override {
    live_.erase(static_cast<const char*>(p));
    cpu_->Release(p);
  }
  void ToBackend(void* dst, const void* host, size_t bytes) override {
    Check(dst, "ToBackend");
    cpu_->ToBackend(dst, host, bytes);
  }
  void ToHost(void* host, const void* src, size_t bytes) const override {
    const_cast<CheckingBackend*>(this)->Check(src, "ToHost");
    cpu_->ToHost(host, src, bytes);
  }
  void Copy(void* dst, const void* src, size_t bytes) override {
    Check(dst, "Copy"), Check(src, "Copy");
    cpu_->Copy(dst, src, bytes);
  }
  void Zero(void* p, size_t bytes) override {
    Check(p, "Zero");
    cpu_->Zero(p, bytes);
  }
  void SetWeights(const T* p, size_t n) override {
    Check(p, "SetWeights");
    cpu_->SetWeights(p, n);
  }
  void WeightsChanged() override { cpu_->WeightsChanged(); }

  void Linear(const T* x, const T* w, int n, int in, int out, T* y, bool acc) override {
    All("Linear", {x, w, y});
    cpu_->Linear(x, w, n, in, out, y, acc);
  }
  void LinearBackward(const T* x, const T* w, const T* dy, int n, int in, int out, T* dx, T* dw,
                      bool acc_dx, bool acc_dw) override {
    All("LinearBackward", {x, w, dy, dx, dw});
    cpu_->LinearBackward(x, w, dy, n, in, out, dx, dw, acc_dx, acc_dw);
  }
  void FfnForward(const T* x, int n, int d, int h, const T* w1, const T* w3, const T* w2, T* h1,
                  T* h3, T* act, T* y) override {
    All("FfnForward", {x, w1, w3, w2, h1, h3, act, y});
    cpu_->FfnForward(x, n, d, h, w1, w3, w2, h1, h3, act, y);
  }
  void FfnBackward(const T* x, int n, int d, int h, const T* w1, const T* w3, const T* w2,
                   const T* h1, const T* h3, const T* act, const T* dy, T* dx, T* dw1, T* dw3,
                   T* dw2, T* scratch) override {
    All("FfnBackward", {x, w1, w3, w2, h1, h3, act, dy, dx, dw1, dw3, dw2, scratch});
    cpu_->FfnBackward(x, n, d, h, w1, w3, w2, h1, h3, act, dy, dx, dw1, dw3, dw2, scratch);
  }
  void RmsNorm(const T* x, const T* g, int n, int d, double eps, T* y, T* rstd) override {
    All("RmsNorm", {x, g, y, rstd});
    cpu_->RmsNorm(x, g, n, d, eps, y, rstd);
  }
  void RmsNormBackward(const T* x, const T* g, const T* rstd, const T* dy, int n, int d, T* dx,
                       T* dg, bool acc) override {
    All("RmsNormBackward", {x, g, rstd, dy, dx, dg});
    cpu_->RmsNormBackward(x, g, rstd, dy, n, d, dx, dg, acc);
  }
  void AddRmsNorm(const T* a, const T* b, T* sum, const T* g, int n, int d, double eps, T* y,
                  T* rstd) override {
    All("AddRmsNorm", {a, b, sum, g, y, rstd});
    cpu_->AddRmsNorm(a, b, sum, g, n, d, eps, y, rstd);
  }
  void RmsNormGroups(const T* x, int ldx, T* y, int ldy, int n, int groups, int d, const T* g,
                     double eps, T* rstd) override {
    All("RmsNormGroups", {x, y, g, rstd});
    cpu_->RmsNormGroups(x, ldx, y, ldy, n, groups, d, g, eps, rstd);
  }
  void RmsNormGroupsBackward(const T* x, int ldx, const T* g, const T* rstd, const T* dy, int lddy,
                             T* dx, int lddx, int n, int groups, int d, T* dg) override {
    All("RmsNormGroupsBackward", {x, g, rstd, dy, dx, dg});
    cpu_->RmsNormGroupsBackward(x, ldx, g, rstd, dy, lddy, dx, lddx, n, groups, d, dg);
  }
  size_t AttentionSavedElements(const cpu::AttentionDims& a) override {
    return cpu_->AttentionSavedElements(a);
  }
  size_t AttentionScratchElements(const cpu::AttentionDims& a) override {
    return cpu_->AttentionScratchElements(a);
  }
  // With rope_in_attention, the attention takes the model's RoPE as a fusing device backend does
  // (AttentionAppliesRope): it rotates compact copies of q and k, runs the CPU attention on them
  // and takes dq and dk back through the inverse rotation.
  bool AttentionAppliesRope(const cpu::AttentionDims& a) override {
    return rope_in_attention && rope_cos_ != nullptr && rope_dim_ == a.qk_dim;
  }
  void SetAttentionRope(const T* cs, const T* sn, int rot_dim) override {
    All("SetAttentionRope", {cs, sn});
    rope_cos_ = cs, rope_sin_ = sn, rope_dim_ = rot_dim;
  }
  void AttentionForward(const cpu::AttentionDims& a, const T* q, const T* k, const T* v, T* saved,
                        T* out, T* pair_max) override {
    All("AttentionForward", {q, k, v, saved, out, pair_max});
    if (!AttentionAppliesRope(a)) return cpu_->AttentionForward(a, q, k, v, saved, out, pair_max);
    ++attention_ropes;
    cpu::AttentionDims c = a;
    std::vector<T> rq = Compact(q, a.ldq, a.heads, a, &c.ldq),
                   rk = Compact(k, a.ldk, a.kv_heads, a, &c.ldk);
    Rotate(a, rq, rk, /*inverse=*/false);
    cpu_->AttentionForward(c, rq.data(), rk.data(), v, saved, out, pair_max);
  }
  void AttentionBackward(const cpu::AttentionDims& a, const T* q, const T* k, const T* v,
                         const T* out, const T* saved, const T* dout, T* dq, T* dk, T* dv,
                         T* scratch) override {
    All("AttentionBackward", {q, k, v, out, saved, dout, dq, dk, dv, scratch});
    if (!AttentionAppliesRope(a)) {
      return cpu_->AttentionBackward(a, q, k, v, out, saved, dout, dq, dk, dv, scratch);
    }
    ++attention_ropes;
    cpu::AttentionDims c = a;
    std::vector<T> rq = Compact(q, a.ldq, a.heads, a, &c.ldq),
                   rk = Compact(k, a.ldk, a.kv_heads, a, &c.ldk);
    Rotate(a, rq, rk, /*inverse=*/false);
    std::vector<T> gq(rq.size()), gk(rk.size());
    cpu_->AttentionBackward(c, rq.data(), rk.data(), v, out, saved, dout, gq.data(), gk.data(), dv,
                            scratch);
    Rotate(a, gq, gk, /*inverse=*/true);
    Expand(gq, a.heads, a, dq, a.ldq);
    Expand(gk, a.kv_heads, a, dk, a.ldk);
  }
  bool rope_in_attention = false;
  int attention_ropes = 0, rope_ops = 0;
  void HeadMax(const T* pair_max, int batch, int heads, T* head_max) override {
    All("HeadMax", {pair_max, head_max});
    cpu_->HeadMax(pair_max, batch, heads, head_max);
  }
  void Rope(T* x, int n, int seq, int ld, int heads, int stride, int offset, int rot, const T* cs,
            const T* sn, bool inverse) override {
    All("Rope", {x, cs, sn});
    cpu_->Rope(x, n, seq, ld, heads, stride, offset, rot, cs, sn, inverse);
  }
  void RopeQk(const cpu::RopeSlice<T>& q, const cpu::RopeSlice<T>& k, int n, int seq, int rot,
              const T* cs, const T* sn, bool inverse) override {
    All("RopeQk", {q.x, k.x, cs, sn});
    ++rope_ops;
    cpu_->RopeQk(q, k, n, seq, rot, cs, sn, inverse);
  }
  void CopyHeads(const T* src, int lds, int ss, int so, T* dst, int ldd, int ds, int dof, int n,
                 int heads, int width) override {
    All("CopyHeads", {src, dst});
    cpu_->CopyHeads(src, lds, ss, so, dst, ldd, ds, dof, n, heads, width);
  }
  void SumHeads(const T* src, int lds, int ss, int so, T* dst, int ldd, int n, int heads,
                int width) override {
    All("SumHeads", {src, dst});
    cpu_->SumHeads(src, lds, ss, so, dst, ldd, n, heads, width);
  }
  void CopyRows(const T* src, int lds, T* dst, int ldd, int rows, int cols) override {
    All("CopyRows", {src, dst});
    cpu_->CopyRows(src, lds, dst, ldd, rows, cols);
  }
  void Embedding(const T* table, const int32_t* tokens, int n, int d, T* out) override {
    All("Embedding", {table, out});
    Check(tokens, "Embedding");
    cpu_->Embedding(table, tokens, n, d, out);
  }
  void EmbeddingBackward(const int32_t* tokens, const T* dout, int n, int d, T* dt) override {
    All("EmbeddingBackward", {dout, dt});
    Check(tokens, "EmbeddingBackward");
    cpu_->EmbeddingBackward(tokens, dout, n, d, dt);
  }
  LossTerms CrossEntropy(T* logits, const int32_t* targets, int n, int vocab, double z,
                         bool backward, double* rows) override {
    All("CrossEntropy", {logits});
    Check(targets, "CrossEntropy"), Check(rows, "CrossEntropy");
    return cpu_->CrossEntropy(logits, targets, n, vocab, z, backward, rows);
  }
  LossTerms LmHeadLossChunk(const LmHeadChunk<T>& c) override {
    All("LmHeadLossChunk", {c.x, c.w, c.logits, c.dx, c.dw});
    Check(c.targets, "LmHeadLossChunk"), Check(c.row_scratch, "LmHeadLossChunk");
    return cpu_->LmHeadLossChunk(c);
  }
  void Add(const T* a, const T* b, T* out, size_t n) override {
    All("Add", {a, b, out});
    cpu_->Add(a, b, out, n);
  }
  std::unique_ptr<MoeExperts<T>> MakeMoeExperts(const ModelConfig& m, const MoEConfig& e, int first,
                                                int count) override {
    return std::make_unique<CheckingMoe>(this, cpu_->MakeMoeExperts(m, e, first, count));
  }
  double SumSquares(const T* x, size_t n) override {
    All("SumSquares", {x});
    return cpu_->SumSquares(x, n);
  }
  void Scale(T* x, size_t n, T s) override {
    All("Scale", {x});
    cpu_->Scale(x, n, s);
  }
  void ScaledSum(const T* g, double w, bool first, T* acc, size_t n) override {
    All("ScaledSum", {g, acc});
    cpu_->ScaledSum(g, w, first, acc, n);
  }
  void FinishScaledSum(const T* acc, double w, T* g, size_t n) override {
    All("FinishScaledSum", {acc, g});
    cpu_->FinishScaledSum(acc, w, g, n);
  }
  void ScaleRows(const std::vector<RowScale>& rows, T* arena) override {
    All("ScaleRows", {arena});
    cpu_->ScaleRows(rows, arena);
  }

 private:
  // The MoE ops' weights, inputs, outputs and bias must be backend memory too.
  class CheckingMoe final : public MoeExperts<T> {
   public:
    CheckingMoe(CheckingBackend* be, std::unique_ptr<MoeExperts<T>> inner)
        : be_(be), inner_(std::move(inner)) {}
    void Reserve(int n, bool ep) override { inner_->Reserve(n, ep); }
    void Route(const T* router, const T* bias, const T* x, int n, int64_t* counts) override {
      be_->All("MoeRoute", {router, bias, x});
      inner_->Route(router, bias, x, n, counts);
    }
    void AuxStatistics(int64_t* counts, double* sums) override {
      inner_->AuxStatistics(counts, sums);
    }
    double LocalAuxLoss(const MoeShape& shape, int n) override {
      return inner_->LocalAuxLoss(shape, n);
    }
    void SetAuxCounts(const int64_t* counts) override { inner_->SetAuxCounts(counts); }
    const int64_t* Dispatch(const T* x) override {
      be_->All("MoeDispatch", {x});
      return inner_->Dispatch(x);
    }
    MoeRowBuffers LocalRows() override { return inner_->LocalRows(); }
    MoeRowBuffers OwnedRows(int64_t rows) override { return inner_->OwnedRows(rows); }
    void ExpertsForward(const MoeWeights<T>& w, const T* x, const MoeRoutedRows& rows,
                        T* y) override {
      be_->All("MoeExpertsForward", {w.router, w.w1, w.w3, w.w2, w.shared_w1, x, y});
      inner_->ExpertsForward(w, x, rows, y);
    }
    void Combine(T* y) override {
      be_->All("MoeCombine", {y});
      inner_->Combine(y);
    }
    void CombineBackward(const T* dy) override {
      be_->All("MoeCombineBackward", {dy});
      inner_->CombineBackward(dy);
    }
    void RouteBackward(double coef) override { inner_->RouteBackward(coef); }
    void ExpertsBackward(const MoeWeights<T>& w, const MoeWeights<T>& g, const T* x, const T* dy,
                         const MoeRoutedRows& rows, T* dx) override {
      be_->All("MoeExpertsBackward", {w.router, w.w1, g.router, g.w1, g.w2, x, dy, dx});
      inner_->ExpertsBackward(w, g, x, dy, rows, dx);
    }
    void DispatchBackward(const T* router, T* dx) override {
      be_->All("MoeDispatchBackward", {router, dx});
      inner_->DispatchBackward(router, dx);
    }
    size_t workspace_bytes() const override { return inner_->workspace_bytes(); }

   private:
    CheckingBackend* be_;
    std::unique_ptr<MoeExperts<T>> inner_;
  };

  void Check(const void* p, const char* op) {
    ++ops;
    if (!p) return;
    const char* c = static_cast<const char*>(p);
    auto it = live_.upper_bound(c);
    if (it != live_.begin()) {
      --it;
      if (c < it->first + it->second) return;
    }
    if (violations++ == 0) first_violation = op;
  }
  void All(const char* op, std::initializer_list<const void*> ptrs) {
    for (const void* p : ptrs) Check(p, op);
  }

  // The head columns of x (rows of stride ld) packed to rows of heads·qk_dim (*ld_out).
  static std::vector<T> Compact(const T* x, int ld, int heads, const cpu::AttentionDims& a,
                                int* ld_out) {
    const int w = heads * a.qk_dim;
    *ld_out = w;
    std::vector<T> c(size_t(a.batch) * a.seq * w);
    for (size_t r = 0; r < size_t(a.batch) * a.seq; ++r) {
      std::copy(x + r * ld, x + r * ld + w, c.begin() + r * w);
    }
    return c;
  }
  static void Expand(const std::vector<T>& c, int heads, const cpu::AttentionDims& a, T* x,
                     int ld) {
    const int w = heads * a.qk_dim;
    for (size_t r = 0; r < size_t(a.batch) * a.seq; ++r) {
      std::copy(c.begin() + r * w, c.begin() + (r + 1) * w, x + r * ld);
    }
  }
  void Rotate(const cpu::AttentionDims& a, std::vector<T>& q, std::vector<T>& k, bool inverse) {
    const int d = a.qk_dim;
    cpu_->RopeQk({q.data(), a.heads * d, a.heads, d, 0},
                 {k.data(), a.kv_heads * d, a.kv_heads, d, 0}, a.batch * a.seq, a.seq, d, rope_cos_,
                 rope_sin_, inverse);
  }

  std::unique_ptr<Backend<T>> cpu_;
  std::map<const char*, size_t> live_;
  const T *rope_cos_ = nullptr, *rope_sin_ = nullptr;
  int rope_dim_ = 0;
};

// test::SmallMoeConfig() with experts of hidden 16 (dense without `moe`), under MLA or GQA
// with QK-norm and a logit softcap.
RunConfig Small(const std::string& attention, bool moe) {
  RunConfig c = test::SmallMoeConfig();
  c.moe.expert_hidden = 16;
  if (!moe) c.moe = MoEConfig{};
  c.model.attention = attention;
  if (attention == "mla") {
    test::UseMla(&c.model, {.q_lora = 16, .kv_lora = 16, .nope = 8, .rope = 4, .v = 8});
  } else {
    c.model.kv_heads = 2;
    c.model.qk_norm = true;
    c.model.logit_softcap = 20;
  }
  c.train.batch_size = 4;
  return c;
}

std::vector<int32_t> Tokens(const RunConfig& c) {
  std::vector<int32_t> t(static_cast<size_t>(c.train.batch_size) * (c.model.seq_len + 1));
  for (size_t i = 0; i < t.size(); ++i) t[i] = static_cast<int32_t>((i * 29 + 7) % 64);
  return t;
}

// One forward and backward of the same tokens by the model on a CheckingBackend and on the CPU
// backend (both initialised with seed 5).
struct SeamAgainstCpu {
  SeamAgainstCpu(const RunConfig& c, bool rope_in_attention)
      : seam(c, ExpertShard{}, MakeChecking(rope_in_attention, &checking)), cpu(c) {
    seam.Init(5);
    cpu.Init(5);
    const std::vector<int32_t> tokens = Tokens(c);
    loss_seam = seam.ForwardBackward(tokens.data(), c.train.batch_size, &stats_seam);
    loss_cpu = cpu.ForwardBackward(tokens.data(), c.train.batch_size, &stats_cpu);
  }
  static std::unique_ptr<CheckingBackend<float>> MakeChecking(bool rope_in_attention,
                                                              CheckingBackend<float>** out) {
    auto owned = std::make_unique<CheckingBackend<float>>();
    owned->rope_in_attention = rope_in_attention;
    *out = owned.get();
    return owned;
  }
  // Loss, S_max, expert counts and gradients: the same bits.
  void ExpectSameBits() {
    EXPECT_EQ(loss_seam, loss_cpu);
    EXPECT_EQ(stats_seam.max_logit_raw, stats_cpu.max_logit_raw);
    EXPECT_EQ(stats_seam.expert_counts, stats_cpu.expert_counts);
    std::vector<float> g(seam.num_params());
    checking->ToHost(g.data(), seam.grads(), sizeof(float) * g.size());
    EXPECT_EQ(std::memcmp(g.data(), cpu.grads(), sizeof(float) * g.size()), 0);
  }
  CheckingBackend<float>* checking = nullptr;  // owned by seam
  Model<float> seam, cpu;
  StepStats stats_seam, stats_cpu;
  double loss_seam = 0, loss_cpu = 0;
};

// Every pointer the model hands an op is backend memory, and the results are the CPU backend's
// bit for bit: MHA/GQA with QK-norm and soft-cap, MLA, dense and MoE layers, forward and backward.
TEST(BackendSeam, ModelTouchesOnlyBackendMemoryAndMatchesTheCpuBackend) {
  for (const std::string attention : {"mha", "mla"}) {
    SCOPED_TRACE(attention);
    const RunConfig c = Small(attention, /*moe=*/true);
    SeamAgainstCpu run(c, /*rope_in_attention=*/false);
    EXPECT_EQ(run.checking->violations, 0)
        << "first outside backend memory: " << run.checking->first_violation;
    EXPECT_GT(run.checking->ops, 100);
    run.ExpectSameBits();
    std::vector<float> pa(run.seam.num_params());
    run.seam.ReadParams(pa.data());
    EXPECT_EQ(std::memcmp(pa.data(), run.cpu.params(), sizeof(float) * pa.size()), 0);
  }
}

// A backend that applies RoPE inside its attention (AttentionAppliesRope; the CUDA backend with
// train.kernels.rope "fused"): the model skips its own RopeQk calls, hands the attention q and k
// un-rotated (after QK-norm) in forward and backward, and gets the CPU backend's bits: GQA with
// QK-norm and soft-cap, dense and MoE layers. MLA keeps its own RoPE (a partial rotation).
TEST(BackendSeam, AttentionThatAppliesRopeGivesTheSameBits) {
  for (const std::string attention : {"mha", "mla"}) {
    SCOPED_TRACE(attention);
    const RunConfig c = Small(attention, /*moe=*/true);
    SeamAgainstCpu run(c, /*rope_in_attention=*/true);
    const CheckingBackend<float>* checking = run.checking;
    EXPECT_EQ(checking->violations, 0) << checking->first_violation;
    if (attention == "mha") {
      EXPECT_EQ(checking->attention_ropes, 2 * c.model.layers);  // forward and backward
      EXPECT_EQ(checking->rope_ops, 0) << "the model still ran RopeQk";
    } else {
      EXPECT_EQ(checking->attention_ropes, 0);
      EXPECT_EQ(checking->rope_ops, 2 * c.model.layers);
    }
    run.ExpectSameBits();
  }
}

// The planted fault the check exists for: a host pointer handed to an op is caught.
TEST(BackendSeam, TheCheckCatchesAHostPointer) {
  CheckingBackend<float> be;
  std::vector<float> host(8, 1.0f);
  be.Scale(host.data(), host.size(), 2.0f);
  EXPECT_EQ(be.violations, 1);
  EXPECT_EQ(be.first_violation, "Scale");
}

// The training loop's whole-arena ops over the seam: micro-batch accumulation, norm, scaling and
// QK-Clip's row scalings touch backend memory only.
TEST(BackendSeam, TrainerArenaOpsTouchOnlyBackendMemory) {
  RunConfig c = Small("mha", /*moe=*/false);
  auto owned = std::make_unique<CheckingBackend<float>>();
  CheckingBackend<float>* checking = owned.get();
  Model<float> model(c, ExpertShard{}, std::move(owned));
  model.Init(2);
  c.train.micro_batch = 2;
  const std::vector<int32_t> tokens = Tokens(c);
  GradAccumulator acc(model.backend(), model.num_params());
  StepStats stats;
  ForwardBackwardMicroBatched(model, tokens.data(), c.model.seq_len,
                              PlanMicroBatches(c, c.train.batch_size), &stats, acc);
  const double norm = model.backend().L2Norm(model.grads(), model.num_params());
  EXPECT_GT(norm, 0);
  model.backend().Scale(model.grads(), model.num_params(), 0.5f);
  EXPECT_NEAR(model.backend().L2Norm(model.grads(), model.num_params()), 0.5 * norm, 1e-6 * norm);
  model.backend().ScaleRows({RowScale{0, 4, 0.5f}}, model.params());
  model.ParamsChanged();
  EXPECT_EQ(checking->violations, 0) << checking->first_violation;
}

TEST(BackendSeam, DoublePrecisionIsCpuOnly) {
  RunConfig c = Small("mha", false);
  c.train.device = "cuda";
  EXPECT_THROW(MakeBackend<double>(c), std::invalid_argument);
  c.train.device = "cpu";
  EXPECT_EQ(MakeBackend<double>(c)->name(), "cpu");
}

}  // namespace
}  // namespace moelab
