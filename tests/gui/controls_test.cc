// The views and controls a newcomer found wanting (issue 24), on the real app under xvfb-run:
// Compare with long run names, a stopped run's progress, the status line of a database that
// cannot be read, Rerun asking first, and the Promote tab driven by --script.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>

#include "gui/sweep_control.h"
#include "gui/view_model.h"
#include "tests/common/test_util.h"
#include "tests/gui/fixture.h"
#include "tests/gui/harness.h"

namespace moelab::gui {
namespace {

using testing::Image;

class GuiControls : public testing::GapFixtureSuite<GuiControls> {
 public:
  static constexpr const char* kFolder = "gui_controls";

 protected:
  static Image Shot(const std::string& name, const std::string& args, const std::string& db = db_) {
    const std::string png = *dir_ / (name + ".png");
    const int rc = testing::RunGuiScript(db, "wait-settled 60\nscreenshot " + png + "\nquit\n",
                                         *dir_ / (name + ".log"), args);
    EXPECT_EQ(rc, 0) << test::Slurp(*dir_ / (name + ".log"));
    return testing::LoadPng(png);
  }
};

int Near(const Image& img, const Rgba& c, int tol, int x0, int y0, int x1, int y1) {
  return testing::CountNear(img, std::lround(c.r * 255), std::lround(c.g * 255),
                            std::lround(c.b * 255), tol, x0, y0, x1, y1);
}

TEST_F(GuiControls, CompareKeepsEveryRunColumnInViewWithLongNames) {
  // Two runs whose names are wider than the table: the second run's column (its colour
  // swatch in the header) used to be pushed out of the half-window table.
  Image img = Shot("compare", "--view compare --run 1 2");
  ASSERT_EQ(img.w, 1280);
  testing::CopyToDocs(*dir_ / "compare.png", "compare-long-names.png");
  for (int i = 0; i < 2; ++i) {
    EXPECT_GT(Near(img, CategoryColor(i), 6, 0, 40, 636, 120), 40)
        << "run " << i + 1 << "'s column is not in the config table";
    EXPECT_GT(Near(img, CategoryColor(i), 6, 640, 40, 1280, 120), 40)
        << "run " << i + 1 << "'s column is not in the summary table";
  }
}

TEST_F(GuiControls, AStoppedRunShowsHowFarItGotNotAFullBar) {
  // Run 3 stopped at step 100 of 400: a quarter-filled bar in the stopped colour.
  Image img = Shot("runs", "--view runs");
  ASSERT_EQ(img.w, 1280);
  const int r = 220, g = 190, b = 90;  // StatusColor(kStopped)
  int longest = 0;
  for (int y = 40; y < img.h - 40; ++y) {
    int run = 0;
    for (int x = 0; x < img.w; ++x) {
      const unsigned char* p = img.at(x, y);
      run = std::abs(p[0] - r) <= 2 && std::abs(p[1] - g) <= 2 && std::abs(p[2] - b) <= 2 ? run + 1
                                                                                          : 0;
      longest = std::max(longest, run);
    }
  }
  // The status column is ~110 px wide: a quarter is ~27 px, a full bar the whole column.
  EXPECT_GT(longest, 12) << "no progress bar for the stopped run";
  EXPECT_LT(longest, 60) << "the stopped run's bar is (nearly) full";
}

TEST_F(GuiControls, AnUnreadableDatabaseIsNotUpToDate) {
  const std::string foreign = *dir_ / "foreign.db";
  std::ofstream(foreign) << "this is not a database\n";
  Image img = Shot("foreign", "--view runs", foreign);
  ASSERT_EQ(img.w, 1280);
  // The status line (bottom ~25 px) says why in red, where it used to say "up to date".
  EXPECT_GT(testing::CountNear(img, 240, 110, 99, 14, 0, img.h - 26, img.w, img.h), 30);
}

TEST_F(GuiControls, RerunAsksBeforeRetrainingASweep) {
  const std::string before = *dir_ / "rerun0.png", dialog = *dir_ / "rerun1.png";
  const std::string script = "view sweeps\nwait-settled 60\nscreenshot " + before +
                             "\nrerun-sweep gaps\nsleep 0.3\nscreenshot " + dialog +
                             "\ncancel\nsleep 0.3\nquit\n";
  ASSERT_EQ(testing::RunGuiScript(db_, script, *dir_ / "rerun.log"), 0)
      << test::Slurp(*dir_ / "rerun.log");
  // The confirmation dialog (its title bar: ImGui's TitleBgActive) appeared...
  const Image a = testing::LoadPng(before), b = testing::LoadPng(dialog);
  ASSERT_EQ(b.w, 1280);
  EXPECT_GT(testing::CountNear(b, 41, 74, 122, 3) - testing::CountNear(a, 41, 74, 122, 3), 2000);
  // ... and Cancel launched nothing.
  for (const std::string& r : LaunchRecords(db_))
    EXPECT_EQ(r.find("rerun"), std::string::npos) << r;
}

TEST_F(GuiControls, PromoteTabIsDrivenByScript) {
  const std::string db = *dir_ / "promote.db";
  testing::BuildScalingFixture(db);
  const std::string fit = test::BinPath("moelab") + " fit --db '" + db +
                          "' --sweep heads --by heads --resamples 100 > '" + (*dir_ / "fit.log") +
                          "' 2>&1";
  ASSERT_EQ(std::system(fit.c_str()), 0) << test::Slurp(*dir_ / "fit.log");
  const std::string png = *dir_ / "promote.png";
  // A family the stored fit does not have is refused by name...
  ASSERT_EQ(testing::RunGuiScript(db,
                                  "promote-set sweep heads\npromote-set family heads=7\n"
                                  "promote-plan\nwait-promote 60\nquit\n",
                                  *dir_ / "promote_bad.log"),
            1);
  EXPECT_NE(test::Slurp(*dir_ / "promote_bad.log").find("no family 'heads=7'"), std::string::npos)
      << test::Slurp(*dir_ / "promote_bad.log");
  // ... and a real one is planned as the Plan button would.
  const std::string script =
      "promote-set sweep heads\npromote-set family heads=8\npromote-set budget 1e15\n"
      "promote-set threads 1\npromote-plan\nwait-promote ok 240\nscreenshot " +
      png + "\nquit\n";
  ASSERT_EQ(testing::RunGuiScript(db, script, *dir_ / "promote.log"), 0)
      << test::Slurp(*dir_ / "promote.log");
  EXPECT_EQ(testing::LoadPng(png).w, 1280);
}

}  // namespace
}  // namespace moelab::gui
