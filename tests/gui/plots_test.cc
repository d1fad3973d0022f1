// The plots a newcomer found wrong (issue 24), checked on the real app under xvfb-run through
// the SVG and PNG that File > Save plot as writes (--script save-plot): linked x axes, gaps of
// missing steps, an unsmoothed learning rate, validation lines without bead staircases, no
// empty clip panel, scaling points inside the plot, the experts view's colour scale and legend.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "gui/view_model.h"
#include "tests/common/test_util.h"
#include "tests/gui/fixture.h"
#include "tests/gui/harness.h"

namespace moelab::gui {
namespace {

namespace fs = std::filesystem;
using testing::LoadSvg;
using testing::SvgPlot;

uint32_t Color(int index) {
  const Rgba c = CategoryColor(index);
  return testing::Rgb(c.r, c.g, c.b);
}

class GuiPlots : public testing::GapFixtureSuite<GuiPlots> {
 public:
  static constexpr const char* kFolder = "gui_plots";

 protected:
  // Runs `script` (a quit is appended) with the given arguments; the app's exit status.
  static int Run(const std::string& name, const std::string& args, const std::string& script) {
    return testing::RunGuiScript(db_, script + "quit\n", *dir_ / (name + ".log"), args);
  }
  static std::string Path(const std::string& file) { return *dir_ / file; }
  static std::string Log(const std::string& name) { return test::Slurp(*dir_ / (name + ".log")); }
};

TEST_F(GuiPlots, CurvesShareOneXAxisBreakAtMissingStepsAndDoNotSmoothTheLearningRate) {
  // Runs 1 (steps 1-150 and 251-400, evaluations from step 50) and 3 (stopped at 100).
  const std::string script = "view curves\nwait-settled 60\nsave-plot " + Path("train.svg") +
                             " train loss\nsave-plot " + Path("val.svg") +
                             " validation loss\nsave-plot " + Path("lr.svg") +
                             " learning rate\nsave-plot " + Path("train.png") + " train loss\n";
  ASSERT_EQ(Run("curves", "--run 1 3", script), 0) << Log("curves");
  const SvgPlot train = LoadSvg(Path("train.svg")), val = LoadSvg(Path("val.svg")),
                lr = LoadSvg(Path("lr.svg"));
  ASSERT_GT(train.width, 0);
  ASSERT_GT(val.width, 0);

  // Linked: the same x grid in both panels, although validation starts at step 50 and the
  // training curves at step 1 (each panel used to fit x to its own data).
  ASSERT_GE(train.vertical_grid.size(), 3u);
  ASSERT_EQ(train.vertical_grid.size(), val.vertical_grid.size());
  for (size_t i = 0; i < train.vertical_grid.size(); ++i)
    EXPECT_NEAR(train.vertical_grid[i] - train.clip_x0, val.vertical_grid[i] - val.clip_x0, 0.5);

  // Run 1's training loss: two stretches with nothing drawn over steps 151-250.
  // (The faint unsmoothed copy behind it breaks the same way.)
  std::vector<const SvgPlot::Polyline*> lines, faint;
  for (const auto* l : train.Lines(Color(0))) (l->opacity == 1.0f ? lines : faint).push_back(l);
  ASSERT_EQ(lines.size(), 2u) << "the line is drawn across the missing steps";
  EXPECT_EQ(faint.size(), 2u);
  std::sort(lines.begin(), lines.end(),
            [](const auto* a, const auto* b) { return a->points[0].x < b->points[0].x; });
  const float gap_from = lines[0]->points.back().x, gap_to = lines[1]->points.front().x;
  const float px_per_step = (train.vertical_grid[1] - train.vertical_grid[0]) / 100;
  EXPECT_NEAR(gap_to - gap_from, 100 * px_per_step, 2 * px_per_step);
  // The PNG (the same rectangle) has none of run 1's colour strictly inside the gap.
  const testing::Image png = testing::LoadPng(Path("train.png"));
  ASSERT_NEAR(png.w, train.width, 1);
  const Rgba c0 = CategoryColor(0);
  EXPECT_EQ(testing::CountNear(png, std::lround(c0.r * 255), std::lround(c0.g * 255),
                               std::lround(c0.b * 255), 8, static_cast<int>(gap_from) + 3,
                               static_cast<int>(train.clip_y0), static_cast<int>(gap_to) - 3,
                               static_cast<int>(train.clip_y1)),
            0);
  EXPECT_GT(testing::CountNear(png, std::lround(c0.r * 255), std::lround(c0.g * 255),
                               std::lround(c0.b * 255), 8),
            200);

  // The learning rate is drawn as recorded: its warmup peak (step 20) where the schedule has
  // it (a 0.6 EMA moved it ~10 steps later), and no faint unsmoothed copy behind it.
  const auto lr_lines = lr.Lines(Color(0));
  ASSERT_FALSE(lr_lines.empty());
  for (const auto* l : lr_lines)
    EXPECT_EQ(l->opacity, 1.0f) << "raw lines behind an unsmoothed one";
  std::vector<testing::SvgPoint> pts;
  for (const auto* l : lr_lines) {
    if (l->opacity == 1.0f) pts.insert(pts.end(), l->points.begin(), l->points.end());
  }
  ASSERT_FALSE(pts.empty());
  const auto peak = std::min_element(pts.begin(), pts.end(),
                                     [](const auto& a, const auto& b) { return a.y < b.y; });
  const float step100 = lr.vertical_grid[0];  // the first tick is step 100
  EXPECT_NEAR(peak->x, step100 - 80 * px_per_step, 2.5 * px_per_step);
}

TEST_F(GuiPlots, DenseValidationLinesHaveNoBeadsSparseOnesMarkEachEvaluation) {
  // Run 2 is evaluated every 3 steps: dots 4 px apart used to merge into a beaded band whose
  // edge stepped with them (each disc snapped to whole pixels). Run 1: 6 evaluations, 6 dots.
  const std::string script =
      "view curves\nwait-settled 60\nsave-plot " + Path("dense.svg") + " validation loss\n";
  ASSERT_EQ(Run("dense", "--run 2 1", script), 0) << Log("dense");
  const SvgPlot val = LoadSvg(Path("dense.svg"));
  int dots[2] = {0, 0};
  for (const auto& c : val.circles) {
    for (int i = 0; i < 2; ++i) dots[i] += c.rgb == Color(i);
  }
  EXPECT_EQ(dots[0], 0) << "dots on a dense validation line";
  EXPECT_EQ(dots[1], 6);
  EXPECT_FALSE(val.Lines(Color(0)).empty());
}

TEST_F(GuiPlots, AValidationLineHasNoStaircase) {
  // Run 2 alone: its validation line is ~135 anti-aliased segments 4 px long. Two causes of
  // steps, each caught here: each joint's column was drawn by both segments (blended twice, at
  // two heights; ~23 % more colour in that column), and the canvas texture sat half a pixel
  // off the screen grid, so nearest sampling dropped a texel row at some x and the line jumped
  // a pixel there (17 %). Along a smooth line the coverage of a column (the line's colour
  // summed down the column) must vary smoothly.
  const std::string script = "view curves\nwait-settled 60\nsave-plot " + Path("even.svg") +
                             " validation loss\nsave-plot " + Path("even.png") +
                             " validation loss\n";
  ASSERT_EQ(Run("even", "--run 2", script), 0) << Log("even");
  const SvgPlot svg = LoadSvg(Path("even.svg"));
  const testing::Image png = testing::LoadPng(Path("even.png"));
  ASSERT_GT(png.w, 100);
  const Rgba c = CategoryColor(0);
  const double line[3] = {c.r * 255.0, c.g * 255.0, c.b * 255.0};
  const int x0 = static_cast<int>(svg.clip_x0) + 1, y0 = static_cast<int>(svg.clip_y0) + 1,
            y1 = static_cast<int>(svg.clip_y1) - 1;
  const unsigned char* b = png.at(static_cast<int>(svg.clip_x1) - 3, y0 + 2);  // background
  double norm = 0;
  for (int k = 0; k < 3; ++k) norm += (line[k] - b[k]) * (line[k] - b[k]);
  // Columns on a vertical grid line are left out (the grid is lighter than the background).
  std::vector<double> coverage;
  for (int x = x0; x < static_cast<int>(svg.clip_x1) - 1; ++x) {
    bool grid = false;
    for (float g : svg.vertical_grid) grid = grid || std::abs(x + 0.5f - g) < 2;
    if (grid) continue;
    double sum = 0;
    for (int y = y0; y < y1; ++y) {
      const unsigned char* p = png.at(x, y);
      double t = 0;
      for (int k = 0; k < 3; ++k) t += (p[k] - b[k]) * (line[k] - b[k]);
      sum += std::clamp(t / norm, 0.0, 1.0);
    }
    coverage.push_back(sum);
  }
  // From a third of the way (past the steep start, where the line is y-major) to the end.
  double worst = 0;
  for (size_t i = coverage.size() / 3; i + 4 < coverage.size(); ++i) {
    std::vector<double> around(coverage.begin() + i - 4, coverage.begin() + i + 5);
    std::nth_element(around.begin(), around.begin() + 4, around.end());
    worst = std::max(worst, std::abs(coverage[i] - around[4]) / around[4]);
  }
  EXPECT_LT(worst, 0.05) << "the line's coverage jumps at its joints (a staircase)";
}

TEST_F(GuiPlots, TheClipPanelIsShownOnlyWhereQkClipIsOn) {
  // Left column: run 4 (MuonClip, τ = 30); right: run 1 (AdamW). Only one clip panel exists.
  ASSERT_EQ(Run("clip_on", "--run 4 1",
                "view logits\nwait-settled 60\nsave-plot " + Path("clip.svg") +
                    " fraction of heads clipped\n"),
            0)
      << Log("clip_on");
  EXPECT_FALSE(LoadSvg(Path("clip.svg")).polylines.empty());
  ASSERT_EQ(Run("clip_off", "--run 4 1",
                "view logits\nwait-settled 60\nsave-plot " + Path("clip2.svg") +
                    " fraction of heads clipped (2)\n"),
            1)
      << "an empty clip panel is shown for the run without QK-Clip";
  EXPECT_NE(Log("clip_off").find("is not shown"), std::string::npos) << Log("clip_off");
}

TEST_F(GuiPlots, ScalingPointsStayInsideThePlot) {
  const std::string db = Path("scaling.db");
  testing::BuildScalingFixture(db);
  const std::string script = "view scaling\nwait-settled 90\nsave-plot " + Path("scaling.svg") +
                             " validation loss vs training FLOPs (log-log)\nquit\n";
  ASSERT_EQ(testing::RunGuiScript(db, script, Path("scaling.log")), 0)
      << test::Slurp(Path("scaling.log"));
  const SvgPlot s = LoadSvg(Path("scaling.svg"));
  ASSERT_GT(s.circles.size(), 10u);
  float left = 1e9f, right = -1e9f;
  for (const auto& c : s.circles) {
    EXPECT_GE(c.x - c.r, s.clip_x0 - 0.01f) << "a point is cut at the left edge";
    EXPECT_LE(c.x + c.r, s.clip_x1 + 0.01f) << "a point is cut at the right edge";
    EXPECT_GE(c.y - c.r, s.clip_y0 - 0.01f);
    EXPECT_LE(c.y + c.r, s.clip_y1 + 0.01f);
    left = std::min(left, c.x);
    right = std::max(right, c.x);
  }
  EXPECT_LT(left - s.clip_x0, 30);  // still close to the edges: the padding is small
  EXPECT_LT(s.clip_x1 - right, 30);
}

TEST_F(GuiPlots, ExpertHeatmapsHaveAColourScaleAndTheImbalanceCurvesALegend) {
  ASSERT_EQ(Run("experts", "--run 1",
                "view experts\nwait-settled 60\nscreenshot " + Path("experts.png") + "\n"),
            0)
      << Log("experts");
  const testing::Image img = testing::LoadPng(Path("experts.png"));
  ASSERT_EQ(img.w, 1280);
  // A colour bar: somewhere in the heatmap column, a row whose colours run along viridis from
  // its dark end to its bright end, left to right.
  std::vector<std::array<int, 3>> lut;
  for (int i = 0; i <= 64; ++i) {
    const Rgba c = Viridis(i / 64.0);
    lut.push_back({int(c.r * 255), int(c.g * 255), int(c.b * 255)});
  }
  auto nearest = [&](const unsigned char* p) {
    for (int i = 0; i <= 64; ++i) {
      if (std::abs(p[0] - lut[i][0]) <= 8 && std::abs(p[1] - lut[i][1]) <= 8 &&
          std::abs(p[2] - lut[i][2]) <= 8)
        return i;
    }
    return -1;
  };
  bool bar = false;
  for (int y = 60; y < img.h && !bar; ++y) {
    int lo = 99, hi = -1, last = -1;
    for (int x = 0; x < 740; ++x) {
      const int t = nearest(img.at(x, y));
      if (t < 0) continue;
      if (t < last) lo = 99, hi = -1;  // not increasing: start over
      lo = std::min(lo, t);
      hi = std::max(hi, t);
      last = t;
      if (lo <= 4 && hi >= 60) bar = true;
    }
  }
  EXPECT_TRUE(bar) << "no colour scale under the heatmaps";
  // The legend: a swatch of each layer's colour under the imbalance plots (right side, bottom).
  for (int l = 0; l < testing::kMoeLayers; ++l) {
    const Rgba c = GroupColor(l, testing::kMoeLayers, true);
    EXPECT_GT(testing::CountNear(img, std::lround(c.r * 255), std::lround(c.g * 255),
                                 std::lround(c.b * 255), 6, 740, 740, 1280, 790),
              20)
        << "no legend swatch for MoE layer " << l;
  }
}

}  // namespace
}  // namespace moelab::gui
