// Shared by the GUI tests that run the real app under xvfb-run: running it with --script,
// reading its PNGs, and reading the SVG that File > Save plot as writes (gui/plot_export.h).
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "tests/common/test_util.h"
#include "tests/gui/fixture.h"

namespace moelab::gui::testing {

bool HaveXvfb();
// moelab-gui --script under xvfb-run at 1280x800 (extra: more arguments); the exit status, the
// app's output in `log`.
int RunGuiScript(const std::string& db, const std::string& script, const std::string& log,
                 const std::string& extra = "", const std::string& size = "1280x800");
// The text a view shows once settled (the script's dump-text: ImGui's log of the frame, table
// cells joined by '|', plus a "CLIPPED ..." line per cut-off table or header), opened with
// `args` (e.g. "--view compare --run 1 2") in a window of `size`; "" when the app failed (its
// log is then at `log`).
std::string ViewText(const std::string& db, const std::string& args, const std::string& log,
                     const std::string& size = "1280x800");

struct Image {
  int w = 0, h = 0;
  std::vector<unsigned char> px;  // RGB
  const unsigned char* at(int x, int y) const {
    return px.data() + (static_cast<size_t>(y) * w + x) * 3;
  }
};
Image LoadPng(const std::string& path);
// Pixels within `tol` (per channel) of rgb inside [x0, x1) x [y0, y1) (x1, y1 < 0: the edge).
int CountNear(const Image& img, int r, int g, int b, int tol = 12, int x0 = 0, int y0 = 0,
              int x1 = -1, int y1 = -1);
// MOELAB_GUI_DOCS_DIR=docs/images: copies the PNG there as gui-<name> (docs/gui.md's pictures).
void CopyToDocs(const std::string& png, const std::string& name);

// What a saved SVG plot holds, in its pixel coordinates.
struct SvgPoint {
  float x = 0, y = 0;
};
struct SvgPlot {
  float width = 0, height = 0;
  float clip_x0 = 0, clip_y0 = 0, clip_x1 = 0, clip_y1 = 0;  // the data area
  std::vector<float> vertical_grid;                          // x of vertical grid lines
  struct Polyline {
    uint32_t rgb = 0;  // 0xRRGGBB
    float opacity = 1;
    std::vector<SvgPoint> points;
  };
  std::vector<Polyline> polylines;
  struct Circle {
    uint32_t rgb = 0;
    float x = 0, y = 0, r = 0;
  };
  std::vector<Circle> circles;
  std::vector<std::string> texts;
  // Polylines of one colour.
  std::vector<const Polyline*> Lines(uint32_t rgb) const;
};
// Parses the SVG moelab-gui writes; an empty plot (width 0) when the file cannot be read.
SvgPlot LoadSvg(const std::string& path);
uint32_t Rgb(float r, float g, float b);  // 0xRRGGBB of a colour with channels in [0, 1]

// A suite of screenshot tests on one gap database (BuildGapFixture), built once per suite in a
// temp folder named Suite::kFolder; each test is skipped where xvfb-run is missing.
template <typename Suite>
class GapFixtureSuite : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new test::TempDir(Suite::kFolder);
    db_ = (*dir_ / "gaps.db");
    BuildGapFixture(db_);
  }
  static void TearDownTestSuite() { delete dir_; }
  void SetUp() override {
    if (!HaveXvfb()) GTEST_SKIP() << "xvfb-run not installed (apt-get install xvfb xauth)";
  }

  static inline test::TempDir* dir_ = nullptr;
  static inline std::string db_;
};

}  // namespace moelab::gui::testing
