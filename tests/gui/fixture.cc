#include "tests/gui/fixture.h"

#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <vector>

#include "db/schema.h"
#include "db/sqlite.h"

namespace moelab::gui::testing {

void WriteSteps(db::RunWriter* writer, int from, int to, bool clip, double scale) {
  for (int step = from + 1; step <= to; ++step) {
    StepRecord r;
    r.step = step;
    // A loss curve with a deterministic wiggle, so smoothing visibly changes it.
    r.loss = scale * (2.0 + 6.0 * std::exp(-step / 60.0)) + 0.08 * std::sin(step * 0.7);
    r.aux_loss = 0.01;
    r.lr = 3e-3 * std::min(1.0, step / 20.0) * (0.55 + 0.45 * std::cos(M_PI * step / kSteps));
    r.grad_norm = 0.4 + 2.0 * std::exp(-step / 40.0);
    r.tokens = int64_t{step} * 4096;
    r.flops = r.tokens * 6.0e6 / scale;
    r.step_time_s = 0.05;
    r.tokens_per_s = 80000 + 2000 * std::sin(step * 0.1);
    StepStats s;
    std::vector<ClipEvent> events;
    for (int l = 0; l < kLayers; ++l) {
      for (int h = 0; h < kHeads; ++h) {
        // Logits grow with training; some heads much faster than others.
        float v = static_cast<float>(5 + (l + 1) * (h % 4 + 1) * step / 40.0);
        if (clip && v > kTau) {
          events.push_back({step, l, h, v, kTau / v});
          v = static_cast<float>(kTau);
        }
        s.max_logit.push_back(v);
      }
    }
    s.max_logit_raw = s.max_logit;
    for (int l = 0; l < kMoeLayers; ++l) {
      for (int e = 0; e < kExperts; ++e) {
        // Early imbalance that the balancer removes over time.
        const double skew = std::exp(-step / 150.0) * (e == 0 ? 6.0 : e == 1 ? 3.0 : 0.0);
        s.expert_counts.push_back(static_cast<int64_t>(1000 * (1.0 + skew + 0.1 * ((e + l) % 3))));
      }
    }
    writer->OnStep(r, s);
    if (!events.empty()) writer->OnClip(events);
    if (step % 50 == 0) writer->OnEval(step, r.tokens, r.flops, r.loss + 0.1);
  }
}

void BuildFixture(const std::string& path, std::unique_ptr<db::RunWriter>* live) {
  std::filesystem::remove(path);
  {
    // The sweep row (the sweep engine's job in real use).
    db::Connection c = db::OpenForWrite(path);
    c.Exec("INSERT INTO sweeps(id, name, spec_json, created_at) VALUES (1, 'sparsity', '{}', 0)");
  }
  struct Spec {
    const char* name;
    int experts;
    const char* optimizer;
    double tau;
    double scale;
  };
  const Spec specs[] = {{"s8-adamw", 8, "adamw", 0, 1.10},
                        {"s16-muon", 16, "muon", 0, 1.05},
                        {"s32-muonclip", 32, "muonclip", kTau, 1.0},
                        {"s48-muonclip", 48, "muonclip", kTau, 0.97}};
  for (const Spec& spec : specs) {
    nlohmann::json config = {
        {"model", {{"layers", kLayers}, {"heads", kHeads}, {"d_model", 256}}},
        {"moe", {{"experts_total", spec.experts}, {"experts_active", 2}}},
        {"optimizer", {{"name", spec.optimizer}, {"lr", 3e-3}, {"qk_clip_tau", spec.tau}}},
        {"train", {{"steps", kSteps}}}};
    db::RunInfo info;
    info.name = spec.name;
    info.config_json = config.dump();
    info.config_hash = spec.name;
    info.sweep_id = 1;
    info.shape =
        db::RunShape{kLayers, kHeads, kMoeLayers, kExperts, 5000000, 1000000, 6.0e6, kSteps};
    auto w = db::RunWriter::Create(path, info);
    WriteSteps(w.get(), 0, kSteps, spec.tau > 0, spec.scale);
    w->OnEnd(RunStatus::kDone, "");
    db::RunWriter::SetRunVar(path, w->run_id(), "sparsity", std::to_string(spec.experts / 1));
    db::RunWriter::SetRunVar(path, w->run_id(), "optimizer", spec.optimizer);
  }
  if (live) {
    nlohmann::json config = {{"model", {{"layers", kLayers}, {"heads", kHeads}}},
                             {"moe", {{"experts_total", 16}}},
                             {"optimizer", {{"name", "muonclip"}, {"qk_clip_tau", kTau}}}};
    db::RunInfo info;
    info.name = "live";
    info.config_json = config.dump();
    info.config_hash = "live";
    info.shape = db::RunShape{kLayers, kHeads, kMoeLayers, kExperts, 5000000, 1000000, 6.0e6, 1000};
    *live = db::RunWriter::Create(path, info);
    WriteSteps(live->get(), 0, 200, true, 1.02);
    (*live)->Flush();
  }
}

void BuildGapFixture(const std::string& path) {
  std::filesystem::remove(path);
  {
    db::Connection c = db::OpenForWrite(path);
    c.Exec("INSERT INTO sweeps(id, name, spec_json, created_at) VALUES (1, 'gaps', '{}', 0)");
  }
  auto create = [&](const std::string& name, double tau) {
    nlohmann::json config = {
        {"model", {{"layers", kLayers}, {"heads", kHeads}}},
        {"moe", {{"experts_total", 8}}},
        {"optimizer", {{"name", tau > 0 ? "muonclip" : "adamw"}, {"qk_clip_tau", tau}}},
        {"train", {{"steps", kSteps}}}};
    db::RunInfo info;
    info.name = name;
    info.config_json = config.dump();
    info.config_hash = name;
    info.sweep_id = 1;
    info.shape =
        db::RunShape{kLayers, kHeads, kMoeLayers, kExperts, 5000000, 1000000, 6.0e6, kSteps};
    return db::RunWriter::Create(path, info);
  };
  {
    auto w = create(kLongName1, 0);
    WriteSteps(w.get(), 0, 150, false, 1.0);
    WriteSteps(w.get(), 250, kSteps, false, 1.0);
    w->OnEnd(RunStatus::kDone, "");
  }
  {
    auto w = create(kLongName2, 0);
    for (int step = 1; step <= kSteps; ++step) {
      WriteSteps(w.get(), step - 1, step, false, 1.05);
      // (At multiples of 50 this replaces the evaluation WriteSteps wrote: one smooth line.)
      if (step % 3 == 0 || step % 50 == 0)
        w->OnEval(step, int64_t{step} * 4096, step * 4096 * 6.0e6,
                  2.2 + 6.0 * std::exp(-step / 60.0));
    }
    w->OnEnd(RunStatus::kDone, "");
  }
  {
    auto w = create("stopped", 0);
    WriteSteps(w.get(), 0, 100, false, 1.1);
    w->OnEnd(RunStatus::kStopped, "stopped by the user");
  }
  {
    auto w = create("clipped", kTau);
    WriteSteps(w.get(), 0, 100, true, 1.0);
    w->OnEnd(RunStatus::kDone, "");
  }
}

void BuildScalingFixture(const std::string& path) {
  std::filesystem::remove(path);
  {
    db::Connection c = db::OpenForWrite(path);
    c.Exec("INSERT INTO sweeps(id, name, spec_json, created_at) VALUES (1, 'heads', '{}', 0)");
  }
  for (int heads : {4, 8}) {
    for (int size = 0; size < 5; ++size) {
      const double n = 1e6 * std::pow(2.0, size);
      nlohmann::json config = {{"model", {{"heads", heads}, {"d_model", 128 << size}}}};
      db::RunInfo info;
      info.name = "h" + std::to_string(heads) + "-n" + std::to_string(size);
      info.config_json = config.dump();
      info.config_hash = info.name;
      info.sweep_id = 1;
      info.shape.params_active = static_cast<int64_t>(n);
      info.shape.params_total = static_cast<int64_t>(n);
      info.shape.flops_per_token = 6 * n;
      auto w = db::RunWriter::Create(path, info);
      for (int e = 1; e <= 10; ++e) {
        const int64_t tokens = int64_t{e} * 2000000;
        const double flops = 6 * n * tokens;
        // Larger models start worse and end better: the frontier switches between sizes.
        const double loss = (heads == 8 ? 0.99 : 1.0) *
                            (1.7 + 30.0 * std::pow(flops / 1e12, -0.3) * std::pow(n / 1e6, -0.25) +
                             0.05 * std::pow(n / 1e6, 0.5) / e);
        w->OnEval(e * 100, tokens, flops, loss);
      }
      w->OnEnd(RunStatus::kDone, "");
      db::RunWriter::SetRunVar(path, w->run_id(), "heads", std::to_string(heads));
    }
  }
}

}  // namespace moelab::gui::testing
