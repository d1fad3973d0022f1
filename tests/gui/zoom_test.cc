// Progressive zoom refinement (issue 14): while the curves' x range changes, each frame refines
// only part of the plots (older decimations and pictures moved to the new range meanwhile);
// once the zoom stops, the refined picture must equal the one drawn at once. Under xvfb-run,
// through --script: one app zooms in steps with the least refinement budget, another opens at
// the final range; their screenshots must be pixel-identical.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <string>
#include <vector>

#include "tests/common/test_util.h"
#include "tests/gui/fixture.h"
#include "tests/gui/harness.h"

namespace moelab::gui {
namespace {

namespace fs = std::filesystem;

// moelab-gui --script on the first three runs; returns the exit status, the log in `log`.
int RunScript(const std::string& db, const std::string& script, const std::string& extra,
              const std::string& log) {
  return testing::RunGuiScript(db, script, log, "--run 1 2 3 " + extra);
}

int SettledAfter(const std::string& log) {
  std::smatch m;
  const std::string text = test::Slurp(log);
  if (!std::regex_search(text, m, std::regex("settled after (\\d+) frames"))) return -1;
  return std::stoi(m[1]);
}

TEST(GuiZoom, RefinementOverFramesEndsOnTheFullQualityPicture) {
  if (!testing::HaveXvfb()) {
    GTEST_SKIP() << "xvfb-run not installed (apt-get install xvfb xauth)";
  }
  test::TempDir dir("moelab_gui_zoom");
  const std::string db = dir / "fixture.db";
  testing::BuildFixture(db);

  // A zoom in ten steps, one per frame, with no refinement budget: every frame leaves work
  // (decimations, canvases) for later frames.
  std::string zoom = "view curves\nwait-settled\n";
  for (int i = 0; i <= 10; ++i) {
    zoom += "xrange " + std::to_string(1 + 8 * i) + " " + std::to_string(400 - 12 * i) + "\n";
  }
  zoom += "wait-settled\nscreenshot " + (dir / "zoomed.png") + "\nquit\n";
  ASSERT_EQ(RunScript(db, zoom, "--refine-budget-ms 0", dir / "zoom.log"), 0)
      << test::Slurp(dir / "zoom.log");
  // The same range at once, with the default budget.
  const std::string direct =
      "view curves\nxrange 81 280\nwait-settled\nscreenshot " + (dir / "direct.png") + "\nquit\n";
  ASSERT_EQ(RunScript(db, direct, "", dir / "direct.log"), 0) << test::Slurp(dir / "direct.log");

  EXPECT_GT(SettledAfter(dir / "zoom.log"), 1)
      << "the zoom was refined in one frame: the progressive path did not run\n"
      << test::Slurp(dir / "zoom.log");
  const testing::Image a = testing::LoadPng(dir / "zoomed.png"),
                       b = testing::LoadPng(dir / "direct.png");
  ASSERT_EQ(a.w, 1280);
  ASSERT_EQ(a.h, 800);
  ASSERT_EQ(b.w, a.w);
  ASSERT_EQ(b.h, a.h);
  int differ = 0, first = -1;
  for (size_t i = 0; i < a.px.size(); i += 3) {
    if (a.px[i] != b.px[i] || a.px[i + 1] != b.px[i + 1] || a.px[i + 2] != b.px[i + 2]) {
      if (first < 0) first = static_cast<int>(i / 3);
      ++differ;
    }
  }
  if (differ > 0) {
    // Kept for a look: the test's folder goes away with it.
    for (const char* name : {"zoomed.png", "direct.png"}) {
      fs::copy_file(dir / name,
                    fs::temp_directory_path() / (std::string("moelab_gui_zoom_") + name),
                    fs::copy_options::overwrite_existing);
    }
  }
  EXPECT_EQ(differ, 0) << "first differing pixel at (" << first % a.w << ", " << first / a.w
                       << "); both pictures: " << fs::temp_directory_path() / "moelab_gui_zoom_*";
}

}  // namespace
}  // namespace moelab::gui
