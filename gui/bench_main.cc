// moelab-gui-bench: frame time of the Curves and Max-logits views and time to first frame on a
// synthetic database of 100 runs × 100k steps (loss, lr, grad norm, tokens, FLOPs, tokens/s,
// wall time; an evaluation every 1000 steps; per-head max logits for 8 layers × 16 heads every
// `--logit-every` steps; expert counts for 8 MoE layers × 16 experts every 100 steps).
//
//   xvfb-run -a -s "-screen 0 1280x800x24" moelab-gui-bench [--db FILE] [--runs 100]
//       [--steps 100000] [--logit-every 10] [--frames 120] [--make-only]
//
// The database is written once through db::RunWriter (as trainers write it) and reused while
// its run count and length match.
#include <imgui.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <string>
#include <vector>

#include "core/metrics.h"
#include "db/schema.h"
#include "db/sqlite.h"
#include "db/writer.h"
#include "gui/app.h"
#include "gui/window.h"
#include "sweeps/store.h"

namespace {

using Clock = std::chrono::steady_clock;
double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}
double ThreadCpuMs() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

struct Options {
  std::string db = "/tmp/moelab-gui-bench.db";
  int runs = 100;
  int steps = 100000;
  int logit_every = 10;
  int frames = 120;
  bool make_only = false;
};

constexpr int kLayers = 8, kHeads = 16, kMoeLayers = 8, kExperts = 16;

// Deterministic noise in [-1, 1] without a generator per run.
double Hash(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ULL;
  x ^= x >> 33;
  return (x >> 11) * (2.0 / 9007199254740992.0) - 1.0;
}

// Written through db::RunWriter (the writer every trainer uses) and sweeps::Store (the sweep
// engine's bookkeeping): the benchmark reads exactly what real runs write.
void MakeDatabase(const Options& o) {
  std::filesystem::remove(o.db);
  std::filesystem::remove(o.db + "-wal");
  std::filesystem::remove(o.db + "-shm");
  const int64_t sweep_id = moelab::sweeps::Store(o.db).UpsertSweep("bench", "{}");
  const int sparsities[] = {8, 16, 32, 48};
  for (int r = 0; r < o.runs; ++r) {
    const auto t0 = Clock::now();
    const int sparsity = sparsities[r % 4];
    const bool clip = r % 2 == 1;
    const double tau = clip ? 100.0 : 0.0;
    const double size = std::pow(2.0, (r / 4) % 8);  // model size multiplier
    const double n_active = 2e6 * size;
    nlohmann::json cfg = {
        {"model", {{"layers", kLayers}, {"heads", kHeads}, {"d_model", 256 * (1 + r / 32)}}},
        {"moe", {{"experts_total", sparsity * 8}, {"experts_active", 8}}},
        {"optimizer", {{"name", clip ? "muonclip" : "muon"}, {"qk_clip_tau", tau}}},
        {"train", {{"steps", o.steps}}}};
    moelab::db::RunInfo info;
    info.name = "s" + std::to_string(sparsity) + "-n" + std::to_string(static_cast<int>(size)) +
                (clip ? "-clip" : "") + "-" + std::to_string(r + 1);
    info.config_json = cfg.dump();
    info.config_hash = "bench-" + std::to_string(r);
    info.sweep_id = sweep_id;
    info.shape = moelab::db::RunShape{kLayers,
                                      kHeads,
                                      kMoeLayers,
                                      kExperts,
                                      static_cast<int64_t>(n_active * sparsity),
                                      static_cast<int64_t>(n_active),
                                      6 * n_active,
                                      o.steps};
    moelab::db::WriterOptions wo;
    wo.flush_interval_s = 0.5;
    auto w = moelab::db::RunWriter::Create(o.db, info, wo);
    moelab::db::RunWriter::SetRunVar(o.db, w->run_id(), "sparsity", std::to_string(sparsity));
    moelab::db::RunWriter::SetRunVar(o.db, w->run_id(), "clip", clip ? "on" : "off");
    // Sparser families reach a given loss with less compute (the K2 report's finding), so the
    // scaling-law view of this database shows multipliers above one against sparsity 8.
    const double E = 1.8, A = 4.0 * std::pow(sparsity / 8.0, -0.12), alpha = 0.35 + 0.01 * (r % 7);
    const int64_t batch_tokens = 65536;
    auto loss_at = [&](int64_t s) {
      const double tokens = static_cast<double>(s) * batch_tokens;
      return E + A * std::pow(tokens * n_active / 1e12 + 1.0, -alpha);
    };
    moelab::StepStats stats;
    std::vector<moelab::ClipEvent> clips;
    for (int64_t s = 1; s <= o.steps; ++s) {
      moelab::StepRecord rec;
      rec.step = s;
      rec.loss = loss_at(s) * (1 + 0.02 * Hash(r * 1000003ULL + s));
      rec.aux_loss = 0.01;
      rec.lr = 3e-3 * std::min(1.0, s / 2000.0) * (0.55 + 0.45 * std::cos(M_PI * s / o.steps));
      rec.grad_norm = 0.3 + 2.0 / std::sqrt(static_cast<double>(s)) + 0.05 * Hash(s * 7 + r);
      rec.tokens = s * batch_tokens;
      rec.flops = rec.tokens * 6 * n_active;
      rec.step_time_s = 0.05;
      rec.tokens_per_s = batch_tokens / 0.05 * (1 + 0.05 * Hash(s * 13 + r));
      stats.max_logit.clear();
      stats.max_logit_raw.clear();
      stats.expert_counts.clear();
      if (s % o.logit_every == 0) {
        const double t = static_cast<double>(s) / o.steps;
        clips.clear();
        stats.max_logit.resize(kLayers * kHeads);
        for (int l = 0; l < kLayers; ++l) {
          for (int h = 0; h < kHeads; ++h) {
            double v = 8 + 160 * t * (0.3 + 0.7 * ((l * 7 + h * 3) % 11) / 10.0) *
                               (1 + 0.05 * Hash(s * 131 + l * 17 + h));
            if (tau > 0 && v > tau) {
              clips.push_back({s, l, h, v, tau / v});
              v = tau;
            }
            stats.max_logit[l * kHeads + h] = static_cast<float>(v);
          }
        }
        stats.max_logit_raw = stats.max_logit;
        if (!clips.empty()) w->OnClip(clips);
      }
      if (s % 100 == 0) {
        const double decay = std::exp(-5.0 * s / o.steps);
        stats.expert_counts.resize(kMoeLayers * kExperts);
        for (int l = 0; l < kMoeLayers; ++l) {
          for (int e = 0; e < kExperts; ++e) {
            stats.expert_counts[l * kExperts + e] = static_cast<int64_t>(
                4096 * (1 + decay * 3 * ((e * 5 + l) % 7 == 0) + 0.1 * Hash(s * 31 + l * 7 + e)));
          }
        }
      }
      w->OnStep(rec, stats);
      if (s % 1000 == 0) w->OnEval(s, rec.tokens, rec.flops, loss_at(s) + 0.05);
    }
    w->OnEnd(moelab::RunStatus::kDone, "");
    if (r == 0) {
      std::fprintf(stderr, "  run 1 written in %.2f s (%d more)\n", Seconds(t0, Clock::now()),
                   o.runs - 1);
    }
  }
}

bool DatabaseMatches(const Options& o) {
  if (!std::filesystem::exists(o.db)) return false;
  try {
    moelab::db::Connection c = moelab::db::OpenForRead(o.db);
    return c.QueryInt("SELECT COUNT(*) FROM runs") == o.runs &&
           c.QueryInt("SELECT MAX(last_step) FROM run_summary") == o.steps;
  } catch (const std::exception&) {
    return false;
  }
}

struct Stats {
  double mean = 0, p50 = 0, p95 = 0, max = 0;
};
Stats Summarize(std::vector<double> ms) {
  Stats s;
  if (ms.empty()) return s;
  std::sort(ms.begin(), ms.end());
  s.mean = std::accumulate(ms.begin(), ms.end(), 0.0) / ms.size();
  s.p50 = ms[ms.size() / 2];
  s.p95 = ms[std::min(ms.size() - 1, ms.size() * 95 / 100)];
  s.max = ms.back();
  return s;
}
void Print(const char* what, const Stats& s, size_t n) {
  std::printf("%-44s mean %6.2f ms  p50 %6.2f  p95 %6.2f  max %6.2f  (%zu frames)\n", what, s.mean,
              s.p50, s.p95, s.max, n);
}

}  // namespace

int main(int argc, char** argv) {
  const auto process_start = Clock::now();
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> const char* {
      if (i + 1 >= argc) {
        std::cerr << "missing value for " << a << "\n";
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--db")
      o.db = next();
    else if (a == "--runs")
      o.runs = std::atoi(next());
    else if (a == "--steps")
      o.steps = std::atoi(next());
    else if (a == "--logit-every")
      o.logit_every = std::max(1, std::atoi(next()));
    else if (a == "--frames")
      o.frames = std::max(1, std::atoi(next()));
    else if (a == "--make-only")
      o.make_only = true;
    else {
      std::cerr << "usage: moelab-gui-bench [--db FILE] [--runs N] [--steps N] [--logit-every N] "
                   "[--frames N] [--make-only]\n";
      return 2;
    }
  }
  if (!DatabaseMatches(o)) {
    std::fprintf(stderr, "writing %s: %d runs x %d steps ...\n", o.db.c_str(), o.runs, o.steps);
    const auto t0 = Clock::now();
    MakeDatabase(o);
    std::fprintf(stderr, "database written in %.1f s (%.0f MB)\n", Seconds(t0, Clock::now()),
                 std::filesystem::file_size(o.db) / 1e6);
  }
  if (o.make_only) return 0;

  using moelab::gui::App;
  using moelab::gui::View;
  try {
    moelab::gui::WindowOptions wo;
    wo.vsync = false;
    wo.headless = true;
    const auto t_window = Clock::now();
    moelab::gui::Window window(wo);
    const auto t_app = Clock::now();
    moelab::gui::AppOptions ao;
    ao.db_path = o.db;
    ao.view = "curves";
    ao.headless = true;
    App app(ao);
    // Per frame: UI build (app.Frame: caches, downsampling, ImGui vertex generation) and
    // render (ImGui::Render + GL draw + swap + glFinish, i.e. llvmpipe rasterisation).
    // Per frame, split (the profile): app.Frame() = UI build, of which the curve panels'
    // decimation (downsample) and CPU rasterisation of their canvases (raster, with the texture
    // upload); the rest of the build is ImGui widgets and ImDrawList building. Then
    // ImGui::Render + the GL draw calls (gl), and llvmpipe rasterising them + the swap (present,
    // up to glFinish).
    struct Split {
      double build = 0, downsample = 0, raster = 0, gl = 0, present = 0, cpu = 0;
      double build_cpu = 0, ui_cpu = 0;  // UI-thread CPU: app.Frame(), the whole frame
      int vertices = 0, downsamples = 0, rasters = 0;
      int stale_panels = 0, deferred = 0;  // refinement left for later frames
    };
    Split last;
    std::vector<Split> splits;
    auto frame = [&]() {
      const std::clock_t cpu0 = std::clock();
      const double ui0 = ThreadCpuMs();
      const auto a = Clock::now();
      window.BeginFrame(0);
      app.Frame();
      const auto b = Clock::now();
      last.build_cpu = ThreadCpuMs() - ui0;
      window.EndFrame(false);
      const auto c = Clock::now();
      window.Swap();
      window.Finish();
      const auto d = Clock::now();
      last.ui_cpu = ThreadCpuMs() - ui0;
      last.build = Seconds(a, b) * 1e3;
      last.downsample = app.frame_profile().downsample_ms;
      last.raster = app.frame_profile().raster_ms;
      last.downsamples = app.frame_profile().downsamples;
      last.rasters = app.frame_profile().rasters;
      last.stale_panels = app.frame_profile().stale_panels;
      last.deferred = app.frame_profile().deferred_canvases;
      last.gl = Seconds(b, c) * 1e3;
      last.present = Seconds(c, d) * 1e3;
      last.vertices = ImGui::GetDrawData() ? ImGui::GetDrawData()->TotalVtxCount : 0;
      // Process CPU time (UI thread, poller and llvmpipe's threads): the cost on an idle machine
      // when other processes compete for the cores.
      last.cpu = 1e3 * static_cast<double>(std::clock() - cpu0) / CLOCKS_PER_SEC;
      splits.push_back(last);
      return Seconds(a, d) * 1e3;
    };
    // The mean split of the frames since `from`.
    auto breakdown = [&](size_t from = 0) {
      Split m;
      const size_t n = splits.size() - std::min(from, splits.size());
      for (size_t i = splits.size() - n; i < splits.size(); ++i) {
        const Split& s = splits[i];
        m.build += s.build / n, m.downsample += s.downsample / n, m.raster += s.raster / n;
        m.gl += s.gl / n, m.present += s.present / n, m.cpu += s.cpu / n;
        m.build_cpu += s.build_cpu / n, m.ui_cpu += s.ui_cpu / n;
        m.vertices = std::max(m.vertices, s.vertices);
        m.downsamples += s.downsamples, m.rasters += s.rasters;
        m.stale_panels += s.stale_panels, m.deferred += s.deferred;
      }
      std::printf(
          "%-44s wall: build %.2f ms, gl %.2f, present %.2f | CPU: UI thread %.2f ms (build "
          "%.2f = downsample %.2f x%d + raster %.2f x%d + widgets %.2f), all threads %.2f ms | "
          "<= %d vertices | left for later frames: %d panels' decimation, %d canvases\n",
          "", m.build, m.gl, m.present, m.ui_cpu, m.build_cpu, m.downsample, m.downsamples,
          m.raster, m.rasters, m.build_cpu - m.downsample - m.raster, m.cpu, m.vertices,
          m.stale_panels, m.deferred);
    };
    const double first_ms = frame();
    const auto t_first = Clock::now();
    std::printf("moelab-gui-bench: %d runs x %d steps, logits %dx%d every %d steps\n", o.runs,
                o.steps, kLayers, kHeads, o.logit_every);
    std::printf(
        "time to first frame: %.0f ms from process start (window + GL %.0f ms, first "
        "frame %.1f ms)\n",
        Seconds(process_start, t_first) * 1e3, Seconds(t_window, t_app) * 1e3, first_ms);

    // Curves, all runs (nothing selected), while the store loads in the background.
    std::vector<double> loading;
    const auto t_load = Clock::now();
    while (!app.Settled() && Seconds(t_load, Clock::now()) < 600) loading.push_back(frame());
    std::printf("curves: all %d runs x 5 metrics loaded after %.1f s\n", o.runs,
                Seconds(t_app, Clock::now()));
    Print("curves, frames while loading", Summarize(loading), loading.size());
    std::vector<double> steady;
    size_t mark = splits.size();
    for (int i = 0; i < o.frames; ++i) steady.push_back(frame());
    Print("curves, all runs, steady (cached downsample)", Summarize(steady), steady.size());
    breakdown(mark);
    std::vector<double> zoom;
    mark = splits.size();
    for (int i = 0; i < std::min(o.frames, 60); ++i) {
      // A new x range every frame: every run's M4 downsample is recomputed.
      const double lo = o.steps * 0.002 * i, hi = o.steps * (1.0 - 0.004 * i);
      app.SetCurveXRange(lo, hi);
      zoom.push_back(frame());
    }
    Print("curves, all runs, zooming (re-downsample)", Summarize(zoom), zoom.size());
    breakdown(mark);
    // The zoom stops: frames until every plot shows the full-quality picture of the last range
    // (the refinement spread over frames during the zoom, finished).
    std::vector<double> settle;
    const auto t_settle = Clock::now();
    while (!app.Settled() && settle.size() < 1000) settle.push_back(frame());
    std::printf("curves, refined %zu frames (%.0f ms) after the zoom stopped\n", settle.size(),
                Seconds(t_settle, Clock::now()) * 1e3);
    if (!settle.empty())
      Print("curves, frames refining after the zoom", Summarize(settle), settle.size());

    app.Select({1, 2});
    app.SetView(View::kLogits);
    std::vector<double> lload;
    const auto t_logits = Clock::now();
    while (!app.Settled() && Seconds(t_logits, Clock::now()) < 300) lload.push_back(frame());
    std::printf("max logits: 2 runs loaded after %.2f s\n", Seconds(t_logits, Clock::now()));
    Print("max logits, frames while loading", Summarize(lload), lload.size());
    std::vector<double> logits;
    mark = splits.size();
    for (int i = 0; i < o.frames; ++i) logits.push_back(frame());
    Print("max logits, 2 runs side by side, steady", Summarize(logits), logits.size());
    breakdown(mark);
    app.SetView(View::kRuns);
    std::vector<double> table;
    mark = splits.size();
    for (int i = 0; i < std::min(o.frames, 30); ++i) table.push_back(frame());
    Print("runs table (baseline: text only)", Summarize(table), table.size());
    breakdown(mark);
  } catch (const std::exception& e) {
    std::cerr << "moelab-gui-bench: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
