// moelab-gui: the desktop app researchers keep open while a sweep runs.
//
//   moelab-gui [--db FILE] [--view NAME] [--run ID ...]
//   moelab-gui --db FILE --view NAME [--run ID ...] --screenshot out.png [--frames N]
//
// Views: runs, curves, logits, experts, compare (and scaling when built with analysis/).
#include <imgui.h>

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

void Usage() {
  std::cerr
      << "usage: moelab-gui [--db FILE] [--view NAME] [--run ID ...] [--family KEY]\n"
         "                  [--color-by KEY] [--screenshot OUT.png [--frames N] [--size WxH]]\n"
         "keys: var:NAME (sweep variable) or a dotted config key (moe.experts_total)\n"
         "views: runs, curves, logits, experts, compare"
      << (moelab::gui::App::HasScalingView() ? ", scaling, promote, full-runs" : "") << "\n";
}

}  // namespace

int main(int argc, char** argv) {
  using moelab::gui::App;
  moelab::gui::AppOptions app_options;
  std::string screenshot;
  int frames = 3;
  int width = 1280, height = 800;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        Usage();
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--db") {
      app_options.db_path = next();
    } else if (a == "--view") {
      app_options.view = next();
      moelab::gui::View v;
      if (!App::ParseView(app_options.view, &v)) {
        std::cerr << "moelab-gui: unknown view '" << app_options.view << "'\n";
        Usage();
        return 2;
      }
    } else if (a == "--run") {
      // --run 3 5 7 or --run 3 --run 5: every following integer.
      bool any = false;
      while (i + 1 < argc && argv[i + 1][0] != '-') {
        app_options.runs.push_back(std::strtoll(argv[++i], nullptr, 10));
        any = true;
      }
      if (!any) {
        Usage();
        return 2;
      }
    } else if (a == "--family") {
      app_options.family_key = next();
    } else if (a == "--color-by") {
      app_options.color_key = next();
    } else if (a == "--screenshot") {
      screenshot = next();
    } else if (a == "--frames") {
      frames = std::max(1, std::atoi(next().c_str()));
    } else if (a == "--size") {
      if (std::sscanf(next().c_str(), "%dx%d", &width, &height) != 2) {
        Usage();
        return 2;
      }
    } else if (a == "-h" || a == "--help") {
      Usage();
      return 0;
    } else {
      std::cerr << "moelab-gui: unknown argument '" << a << "'\n";
      Usage();
      return 2;
    }
  }
  const bool headless = !screenshot.empty();
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
    if (headless) {
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
      window.BeginFrame(app.Settled() ? 0.25 : 0.03);
      app.Frame();
      window.EndFrame(true);
    }
  } catch (const std::exception& e) {
    std::cerr << "moelab-gui: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
