// moelab-gui: the desktop app researchers keep open while a sweep runs.
//
//   moelab-gui [--db FILE] [--view NAME] [--run ID ...]
//   moelab-gui --db FILE --view NAME [--run ID ...] --screenshot out.png [--frames N]
//   moelab-gui --screenshot out.png                 (no database: the welcome screen)
//
// Views: runs, curves, logits, experts, scaling, compare. Arguments are parsed with CLI11.
#include <imgui.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include "gui/app.h"
#include "gui/window.h"

namespace {

// SIGINT/SIGTERM end the loop normally, so settings and layout are still saved.
volatile std::sig_atomic_t g_stop = 0;
void OnSignal(int) { g_stop = 1; }

}  // namespace

int main(int argc, char** argv) {
  using moelab::gui::App;
  moelab::gui::AppOptions app_options;
  std::string screenshot;
  int frames = 3;
  int width = 1280, height = 800;
  std::string size = "1280x800";
  CLI::App cli{
      "moelab-gui: watch runs live, compare them, fit scaling laws.\n"
      "keys: var:NAME (sweep variable) or a dotted config key (moe.experts_total)"};
  cli.add_option("--db", app_options.db_path, "SQLite database to open (else the last one)");
  cli.add_option("--view", app_options.view,
                 "runs, curves, logits, experts, scaling, compare, sweeps, promote, full-runs")
      ->check([](const std::string& v) {
        moelab::gui::View out;
        return App::ParseView(v, &out) ? std::string() : "unknown view '" + v + "'";
      });
  cli.add_option("--run", app_options.runs, "initial run selection (--run 3 5 7)")->expected(1, -1);
  cli.add_option("--family", app_options.family_key, "scaling-law family key");
  cli.add_option("--color-by", app_options.color_key, "curves colour key");
  cli.add_option("--screenshot", screenshot, "render headless, write this PNG and exit");
  cli.add_option("--script", app_options.script_path,
                 "run scripted actions (gui/script.h), then exit with their status");
  cli.add_option("--refine-budget-ms", app_options.refine_budget_ms,
                 "per-frame time for refining plots after a zoom (default 10; 0: the least, "
                 "to exercise progressive refinement in tests)");
  cli.add_option("--frames", frames, "settled frames before the screenshot")
      ->check(CLI::PositiveNumber);
  cli.add_option("--size", size, "window size WxH")->check([](const std::string& s) {
    int w, h;
    return std::sscanf(s.c_str(), "%dx%d", &w, &h) == 2 ? std::string() : "expected WxH";
  });
  CLI11_PARSE(cli, argc, argv);
  std::sscanf(size.c_str(), "%dx%d", &width, &height);
  const bool scripted = !app_options.script_path.empty();
  const bool headless = !screenshot.empty() || scripted;
  app_options.headless = headless;
  const std::string config_dir = moelab::gui::ConfigDir();
  if (!headless) app_options.settings_path = config_dir + "/gui.json";

  moelab::gui::WindowOptions wo;
  wo.width = width;
  wo.height = height;
  wo.title = "moelab";
  wo.vsync = !headless;
  wo.headless = headless;
  if (!headless) {
    wo.ini_path = config_dir + "/imgui.ini";
    std::error_code ec;
    std::filesystem::create_directories(config_dir, ec);
  }
  try {
    moelab::gui::Window window(wo);
    App app(app_options);
    if (!screenshot.empty()) {
      // Render until the data the view draws has loaded, then `frames` more so layouts settle.
      const auto start = std::chrono::steady_clock::now();
      int settled_frames = 0;
      bool timed_out = false;
      while (settled_frames < frames) {
        window.BeginFrame(0);
        app.Frame();
        window.EndFrame(false);
        settled_frames = app.Settled() ? settled_frames + 1 : 0;
        if (std::chrono::steady_clock::now() - start > std::chrono::seconds(60)) {
          timed_out = true;
          break;
        }
        if (settled_frames < frames) window.Swap();
      }
      if (timed_out) std::cerr << "moelab-gui: data still loading after 60 s; capturing anyway\n";
      if (!window.SavePng(screenshot)) {
        std::cerr << "moelab-gui: cannot write " << screenshot << "\n";
        return 1;
      }
      return 0;
    }
    std::signal(SIGINT, OnSignal);
    std::signal(SIGTERM, OnSignal);
    while (!window.ShouldClose() && !app.quit_requested() && !g_stop) {
      // Idle: wake 4× a second so live runs update without input. Loading or refining a zoom:
      // keep drawing (~30 fps) so the view completes without the user moving the mouse.
      window.BeginFrame(app.Settled() && !scripted ? 0.25 : 0.03);
      app.Frame();
      const std::string shot = app.TakeScreenshotRequest();
      App::PlotCapture plot;
      const bool plot_png = app.TakePlotCapture(&plot);
      if (shot.empty() && !plot_png) {
        window.EndFrame(true);
        continue;
      }
      window.EndFrame(false);
      if (!shot.empty() && !window.SavePng(shot))
        std::cerr << "moelab-gui: cannot write " << shot << "\n";
      if (plot_png) {
        app.PlotCaptureDone(window.SavePng(plot.path, plot.x0, plot.y0, plot.x1, plot.y1),
                            plot.path);
      }
      window.Swap();
    }
    if (scripted) return app.script_status() == 0 ? 0 : 1;
  } catch (const std::exception& e) {
    std::cerr << "moelab-gui: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
