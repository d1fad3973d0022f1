// moelab-gui-bench: frame time of the Curves and Max-logits views and time to first frame on a
// synthetic database of 100 runs × 100k steps (loss, lr, grad norm, tokens, FLOPs, tokens/s,
// wall time; an evaluation every 1000 steps; per-head max logits for 8 layers × 16 heads every
// `--logit-every` steps; expert counts for 8 MoE layers × 16 experts every 100 steps).
//
//   xvfb-run -a -s "-screen 0 1280x800x24" moelab-gui-bench [--db FILE] [--runs 100]
//       [--steps 100000] [--logit-every 10] [--frames 120] [--make-only]
//
// The database is written once with raw SQLite bulk inserts matching docs/database.md (one
// transaction per run, prepared statements) and reused while its run count matches.
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

#include "db/schema.h"
#include "db/sqlite.h"
#include "gui/app.h"
#include "gui/window.h"

namespace {

using Clock = std::chrono::steady_clock;
double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
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

void MakeDatabase(const Options& o) {
  std::filesystem::remove(o.db);
  std::filesystem::remove(o.db + "-wal");
  std::filesystem::remove(o.db + "-shm");
  moelab::db::Connection c = moelab::db::OpenForWrite(o.db);
  c.Exec("PRAGMA synchronous = OFF");
  c.Exec("INSERT INTO sweeps(id, name, spec_json, created_at) VALUES (1, 'bench', '{}', 0)");
  const int sparsities[] = {8, 16, 32, 48};
  const double now = 1.7e9;
  for (int r = 0; r < o.runs; ++r) {
    const auto t0 = Clock::now();
    c.Exec("BEGIN");
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
    {
      auto st = c.Prepare(
          "INSERT INTO runs(id, name, sweep_id, config_json, config_hash, status, pid, host, "
          "created_at, started_at, heartbeat_at, ended_at, params_total, params_active, "
          "flops_per_token, layers, heads, moe_layers, experts) VALUES "
          "(?1, ?2, 1, ?3, ?4, 'done', 1, 'bench', ?5, ?5, ?6, ?6, ?7, ?8, ?9, ?10, ?11, ?12, "
          "?13)");
      st.Bind(1, int64_t{r + 1})
          .Bind(2, "s" + std::to_string(sparsity) + "-n" + std::to_string(static_cast<int>(size)) +
                       (clip ? "-clip" : "") + "-" + std::to_string(r + 1))
          .Bind(3, cfg.dump())
          .Bind(4, "bench-" + std::to_string(r))
          .Bind(5, now)
          .Bind(6, now + o.steps * 0.05)
          .Bind(7, static_cast<int64_t>(n_active * sparsity))
          .Bind(8, static_cast<int64_t>(n_active))
          .Bind(9, 6 * n_active)
          .Bind(10, kLayers)
          .Bind(11, kHeads)
          .Bind(12, kMoeLayers)
          .Bind(13, kExperts);
      st.Run();
      auto v = c.Prepare("INSERT INTO run_vars(run_id, key, value) VALUES (?1, ?2, ?3)");
      v.Bind(1, int64_t{r + 1}).Bind(2, "sparsity").Bind(3, std::to_string(sparsity)).Run();
      v.Bind(1, int64_t{r + 1}).Bind(2, "clip").Bind(3, clip ? "on" : "off").Run();
    }
    // Sparser families reach a given loss with less compute (the K2 report's finding), so the
    // scaling-law view of this database shows multipliers above one against sparsity 8.
    const double E = 1.8, A = 4.0 * std::pow(sparsity / 8.0, -0.12), alpha = 0.35 + 0.01 * (r % 7);
    const int64_t batch_tokens = 65536;
    auto loss_at = [&](int64_t s) {
      const double tokens = static_cast<double>(s) * batch_tokens;
      return E + A * std::pow(tokens * n_active / 1e12 + 1.0, -alpha);
    };
    double last_loss = 0, best_val = 1e9, last_val = 0;
    {
      auto st = c.Prepare(
          "INSERT INTO steps(run_id, step, loss, aux_loss, lr, grad_norm, tokens, flops, "
          "step_time_s, tokens_per_s, wall_time) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, "
          "?11)");
      auto ev = c.Prepare(
          "INSERT INTO evals(run_id, step, tokens, flops, val_loss, wall_time) VALUES (?1, ?2, ?3, "
          "?4, ?5, ?6)");
      for (int64_t s = 1; s <= o.steps; ++s) {
        const double loss = loss_at(s) * (1 + 0.02 * Hash(r * 1000003ULL + s));
        const double lr =
            3e-3 * std::min(1.0, s / 2000.0) * (0.55 + 0.45 * std::cos(M_PI * s / o.steps));
        const int64_t tokens = s * batch_tokens;
        const double wall = now + s * 0.05 * (1 + 0.1 * Hash(s));
        st.Bind(1, int64_t{r + 1})
            .Bind(2, s)
            .Bind(3, loss)
            .Bind(4, 0.01)
            .Bind(5, lr)
            .Bind(6, 0.3 + 2.0 / std::sqrt(static_cast<double>(s)) + 0.05 * Hash(s * 7 + r))
            .Bind(7, tokens)
            .Bind(8, tokens * 6 * n_active)
            .Bind(9, 0.05)
            .Bind(10, batch_tokens / 0.05 * (1 + 0.05 * Hash(s * 13 + r)))
            .Bind(11, wall);
        st.Run();
        last_loss = loss;
        if (s % 1000 == 0) {
          const double val = loss_at(s) + 0.05;
          ev.Bind(1, int64_t{r + 1})
              .Bind(2, s)
              .Bind(3, tokens)
              .Bind(4, tokens * 6 * n_active)
              .Bind(5, val)
              .Bind(6, wall);
          ev.Run();
          best_val = std::min(best_val, val);
          last_val = val;
        }
      }
    }
    {
      auto st = c.Prepare("INSERT INTO max_logits(run_id, step, max_logit) VALUES (?1, ?2, ?3)");
      auto ce = c.Prepare(
          "INSERT INTO clip_events(run_id, step, layer, head, s_max, gamma) VALUES (?1, ?2, ?3, "
          "?4, ?5, ?6)");
      std::vector<float> m(kLayers * kHeads);
      for (int64_t s = o.logit_every; s <= o.steps; s += o.logit_every) {
        const double t = static_cast<double>(s) / o.steps;
        for (int l = 0; l < kLayers; ++l) {
          for (int h = 0; h < kHeads; ++h) {
            double v = 8 + 160 * t * (0.3 + 0.7 * ((l * 7 + h * 3) % 11) / 10.0) *
                               (1 + 0.05 * Hash(s * 131 + l * 17 + h));
            if (tau > 0 && v > tau) {
              ce.Bind(1, int64_t{r + 1})
                  .Bind(2, s)
                  .Bind(3, l)
                  .Bind(4, h)
                  .Bind(5, v)
                  .Bind(6, tau / v);
              ce.Run();
              v = tau;
            }
            m[l * kHeads + h] = static_cast<float>(v);
          }
        }
        st.Bind(1, int64_t{r + 1}).Bind(2, s).BindBlob(3, m.data(), m.size() * sizeof(float));
        st.Run();
      }
      auto ex = c.Prepare(
          "INSERT INTO expert_counts(run_id, step, elem_bytes, counts) VALUES (?1, ?2, 4, ?3)");
      std::vector<int32_t> counts(kMoeLayers * kExperts);
      for (int64_t s = 100; s <= o.steps; s += 100) {
        const double decay = std::exp(-5.0 * s / o.steps);
        for (int l = 0; l < kMoeLayers; ++l) {
          for (int e = 0; e < kExperts; ++e) {
            counts[l * kExperts + e] = static_cast<int32_t>(
                4096 * (1 + decay * 3 * ((e * 5 + l) % 7 == 0) + 0.1 * Hash(s * 31 + l * 7 + e)));
          }
        }
        ex.Bind(1, int64_t{r + 1}).Bind(2, s).BindBlob(3, counts.data(), counts.size() * 4);
        ex.Run();
      }
    }
    {
      auto st = c.Prepare(
          "INSERT INTO run_summary(run_id, last_step, total_steps, last_loss, best_val_loss, "
          "last_val_loss, tokens, flops, tokens_per_s, updated_at) VALUES "
          "(?1, ?2, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)");
      st.Bind(1, int64_t{r + 1})
          .Bind(2, int64_t{o.steps})
          .Bind(3, last_loss)
          .Bind(4, best_val)
          .Bind(5, last_val)
          .Bind(6, int64_t{o.steps} * batch_tokens)
          .Bind(7, o.steps * batch_tokens * 6 * n_active)
          .Bind(8, batch_tokens / 0.05)
          .Bind(9, now + o.steps * 0.05);
      st.Run();
    }
    c.Exec("COMMIT");
    if (r == 0) {
      std::fprintf(stderr, "  run 1 written in %.2f s (%d more)\n", Seconds(t0, Clock::now()),
                   o.runs - 1);
    }
  }
  c.Exec("PRAGMA wal_checkpoint(TRUNCATE)");
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
    double build_ms = 0, render_ms = 0, cpu_ms = 0;
    int vertices = 0;
    auto frame = [&]() {
      const std::clock_t cpu0 = std::clock();
      const auto a = Clock::now();
      window.BeginFrame(0);
      app.Frame();
      const auto b = Clock::now();
      window.EndFrame(true);
      window.Finish();
      const auto c = Clock::now();
      build_ms = Seconds(a, b) * 1e3;
      render_ms = Seconds(b, c) * 1e3;
      vertices = ImGui::GetDrawData() ? ImGui::GetDrawData()->TotalVtxCount : 0;
      // Process CPU time (UI thread, poller and llvmpipe's threads): the cost on an idle machine
      // when other processes compete for the cores.
      cpu_ms = 1e3 * static_cast<double>(std::clock() - cpu0) / CLOCKS_PER_SEC;
      return Seconds(a, c) * 1e3;
    };
    auto breakdown = [&]() {
      std::printf(
          "%-44s last frame: build %.2f ms, render %.2f ms, process CPU %.2f ms, %d vertices\n", "",
          build_ms, render_ms, cpu_ms, vertices);
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
    for (int i = 0; i < o.frames; ++i) steady.push_back(frame());
    Print("curves, all runs, steady (cached downsample)", Summarize(steady), steady.size());
    breakdown();
    std::vector<double> zoom;
    for (int i = 0; i < std::min(o.frames, 60); ++i) {
      // A new x range every frame: every run's M4 downsample is recomputed.
      const double lo = o.steps * 0.002 * i, hi = o.steps * (1.0 - 0.004 * i);
      app.SetCurveXRange(lo, hi);
      zoom.push_back(frame());
    }
    Print("curves, all runs, zooming (re-downsample)", Summarize(zoom), zoom.size());
    breakdown();

    app.Select({1, 2});
    app.SetView(View::kLogits);
    std::vector<double> lload;
    const auto t_logits = Clock::now();
    while (!app.Settled() && Seconds(t_logits, Clock::now()) < 300) lload.push_back(frame());
    std::printf("max logits: 2 runs loaded after %.2f s\n", Seconds(t_logits, Clock::now()));
    Print("max logits, frames while loading", Summarize(lload), lload.size());
    std::vector<double> logits;
    for (int i = 0; i < o.frames; ++i) logits.push_back(frame());
    Print("max logits, 2 runs side by side, steady", Summarize(logits), logits.size());
    breakdown();
    app.SetView(View::kRuns);
    std::vector<double> table;
    for (int i = 0; i < std::min(o.frames, 30); ++i) table.push_back(frame());
    Print("runs table (baseline: text only)", Summarize(table), table.size());
    breakdown();
  } catch (const std::exception& e) {
    std::cerr << "moelab-gui-bench: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
