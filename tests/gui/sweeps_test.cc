// The Sweeps view (the control room): spec checking as you type through sweeps/, detached
// launches, and under xvfb-run the real app driven by --script: a screenshot of the editor with
// a validation error at its path, and a tiny sweep launched, stopped, resumed (per sweep and per
// run) with every step recorded exactly once.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "db/reader.h"
#include "gui/plan_calibration.h"
#include "gui/sweep_control.h"
#include "tests/common/test_util.h"
#include "tests/gui/harness.h"

namespace moelab::gui {
namespace {

using nlohmann::json;

// The tiny run config of tests/common, checkpointing every 20 steps under dir.
json Base(const std::string& dir, int steps, bool slow = false) {
  return test::TinyRunConfig(dir + "/ckpt", steps, 20, slow);
}

// A spec of two 10-step runs (experts_total 4 and 8) checkpointing under dir.
json TwoRunSpec(const std::string& name, const std::string& dir) {
  return json{{"name", name}, {"base", Base(dir, 10)}, {"grid", {{"moe.experts_total", {4, 8}}}}};
}

TEST(SpecCheck, ValidSpecGivesRunsAndThePlanTable) {
  test::TempDir dir("gui_spec");
  const json spec = TwoRunSpec("ok", dir.path());
  const SpecCheck c = CheckSpecText(spec.dump(2), dir / "ok.json");
  ASSERT_TRUE(c.ok) << c.error;
  EXPECT_EQ(c.name, "ok");
  EXPECT_EQ(c.runs, 2);
  EXPECT_EQ(c.unique, 2);
  EXPECT_NE(c.plan.find("train FLOPs"), std::string::npos) << c.plan;
}

TEST(SpecCheck, PlanShowsTheEstimatedTimeMeasuredInTheBackground) {
  // `moelab sweep plan` trains the largest run for >= 2 s before printing its time estimate;
  // the editor's check returns at once and the calibrator measures in the background.
  test::TempDir dir("gui_spec");
  const json spec = TwoRunSpec("ok", dir.path());
  PlanCalibrator calibrator;
  const auto t0 = std::chrono::steady_clock::now();
  SpecCheck c = CheckSpecText(spec.dump(2), dir / "ok.json", "", 2, &calibrator);
  const double check_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_TRUE(c.ok) << c.error;
  EXPECT_TRUE(c.calibrating);
  EXPECT_LT(check_s, 1.5) << "the check waited for the calibration";
  EXPECT_EQ(c.plan.find("wall with --parallel"), std::string::npos) << c.plan;
  EXPECT_NE(c.plan.find("measuring the rate in the background"), std::string::npos) << c.plan;

  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (calibrator.Busy() && std::chrono::steady_clock::now() < end) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_FALSE(calibrator.Busy());
  c = CheckSpecText(spec.dump(2), dir / "ok.json", "", 2, &calibrator);
  EXPECT_FALSE(c.calibrating);
  EXPECT_EQ(c.parallel, 2);
  EXPECT_EQ(c.time_estimate.rfind("measured: ", 0), 0u) << c.time_estimate;
  // sweeps::PrintPlan's own estimate lines, from the measured rate.
  EXPECT_NE(c.plan.find("wall with --parallel 2"), std::string::npos) << c.plan;
  EXPECT_NE(c.plan.find("time estimate: " + c.time_estimate), std::string::npos) << c.plan;
  // Cached: an edit that keeps the largest run measures nothing again.
  c = CheckSpecText(spec.dump(4), dir / "ok.json", "", 2, &calibrator);
  EXPECT_FALSE(c.calibrating);
  EXPECT_FALSE(calibrator.Busy());
}

TEST(SpecCheck, ErrorsCarryTheirJsonPath) {
  test::TempDir dir("gui_spec");
  json spec = {{"name", "bad"}, {"base", Base(dir.path(), 10)}};
  // An invalid run: the config path that fails.
  spec["grid"] = {{"moe.experts_active", {2, 9}}};
  SpecCheck c = CheckSpecText(spec.dump(2), dir / "bad.json");
  EXPECT_FALSE(c.ok);
  EXPECT_EQ(c.error_path, "moe.experts_active") << c.error;
  EXPECT_NE(c.error_reason.find("run #1"), std::string::npos) << c.error_reason;
  // A spec key.
  spec.erase("grid");
  spec["seeds"] = {-1};
  c = CheckSpecText(spec.dump(2), dir / "bad.json");
  EXPECT_EQ(c.error_path, "seeds") << c.error;
  // JSON syntax: line and column of the parser's stop.
  c = CheckSpecText("{\n  \"name\": \"x\",\n  \"grid\": [1,,]\n}", dir / "bad.json");
  EXPECT_FALSE(c.ok);
  EXPECT_EQ(c.line, 3) << c.error;
  EXPECT_EQ(c.column, 14) << c.error;
  EXPECT_EQ(c.error_path, "line 3, column 14");
}

TEST(SweepControl, LaunchIsDetachedLoggedAndRecorded) {
  test::TempDir dir("gui_launch");
  const std::string db = dir / "x.db";
  const Launched l =
      LaunchDetached({"/bin/sh", "-c", "echo hello; sleep 0.3"}, db, "launch", dir / "l.log");
  ASSERT_GT(l.pid, 0) << l.error;
  // Not our child (double fork): waitpid has nothing to wait for.
  EXPECT_EQ(::waitpid(l.pid, nullptr, WNOHANG), -1);
  EXPECT_EQ(errno, ECHILD);
  EXPECT_TRUE(ProcessAlive(l.pid));
  for (int i = 0; i < 200 && ProcessAlive(l.pid); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_FALSE(ProcessAlive(l.pid));
  EXPECT_EQ(test::Slurp(dir / "l.log"), "hello\n");
  const Launched bad = LaunchDetached({"/no/such/binary"}, db, "launch", dir / "bad.log");
  EXPECT_EQ(bad.pid, -1);
  EXPECT_NE(bad.error.find("cannot execute"), std::string::npos) << bad.error;
  const auto records = LaunchRecords(db);
  ASSERT_EQ(records.size(), 2u);
  EXPECT_EQ(json::parse(records[0])["pid"], l.pid);
  EXPECT_EQ(json::parse(records[1])["error"], bad.error);
}

// ---- Under xvfb-run: the app driven by --script ---------------------------------------------

using testing::CopyToDocs;
using testing::HaveXvfb;
using testing::RunGuiScript;

// Pixels within tol of rgb in the PNG (-1 when it cannot be read).
int CountNear(const std::string& png, int r, int g, int b, int tol) {
  const testing::Image img = testing::LoadPng(png);
  return img.w > 0 ? testing::CountNear(img, r, g, b, tol) : -1;
}

TEST(SweepsScreenshot, EditorShowsTheValidationErrorAtItsPath) {
  if (!HaveXvfb()) GTEST_SKIP() << "xvfb-run not installed (apt-get install xvfb xauth)";
  test::TempDir dir("gui_editor");
  std::ofstream(dir / "spec.json") << TwoRunSpec("editor", dir.path()).dump(2);
  const std::string png = dir / "editor.png";
  // The edit makes both runs invalid (experts_active 9 > experts_total 4 and 8). No database:
  // the editor checks specs without one.
  const std::string script = "open " + (dir / "spec.json") + "\nscreenshot " + (dir / "ok.png") +
                             "\nreplace \"experts_active\": 2 => \"experts_active\": 9\n" +
                             "screenshot " + png + "\nquit\n";
  ASSERT_EQ(RunGuiScript("", script, dir / "gui.log"), 0) << test::Slurp(dir / "gui.log");
  CopyToDocs(png, "sweep-editor-error.png");
  // The error line is drawn in (240, 110, 100); the valid spec shows none of it.
  EXPECT_GT(CountNear(png, 240, 110, 100, 12), 30) << "no error text";
  EXPECT_LT(CountNear(dir / "ok.png", 240, 110, 100, 12), 5) << "an error on a valid spec";
  EXPECT_GT(CountNear(dir / "ok.png", 110, 200, 110, 20), 50) << "no 'valid' line";
}

// Columns where the error line's marker is: a 3 px wide, line-high bar of the error colour.
int MarkerColumns(const std::string& png) {
  const testing::Image img = testing::LoadPng(png);
  if (img.w == 0) return -1;
  int columns = 0;
  for (int x = 0; x < img.w; ++x) {
    int run = 0, longest = 0;
    for (int y = 0; y < img.h; ++y) {
      const unsigned char* p = img.at(x, y);
      run = std::abs(p[0] - 240) <= 3 && std::abs(p[1] - 110) <= 3 && std::abs(p[2] - 100) <= 3
                ? run + 1
                : 0;
      longest = std::max(longest, run);
    }
    columns += longest >= 12;
  }
  return columns;
}

TEST(SweepsScreenshot, EditorNumbersLinesAndMarksTheLineOfASyntaxError) {
  if (!HaveXvfb()) GTEST_SKIP() << "xvfb-run not installed (apt-get install xvfb xauth)";
  test::TempDir dir("gui_editor_syntax");
  std::ofstream(dir / "spec.json") << TwoRunSpec("editor", dir.path()).dump(2);
  const std::string png = dir / "syntax.png";
  // A stray comma after "grid": { is a JSON syntax error with a line and column.
  const std::string script = "open " + (dir / "spec.json") + "\nscreenshot " + (dir / "ok.png") +
                             "\nreplace \"grid\": { => \"grid\": {,\nscreenshot " + png +
                             "\nquit\n";
  ASSERT_EQ(RunGuiScript("", script, dir / "gui.log"), 0) << test::Slurp(dir / "gui.log");
  CopyToDocs(png, "sweep-editor-syntax-error.png");
  EXPECT_GE(MarkerColumns(png), 3) << "the error's line is not marked in the editor";
  EXPECT_EQ(MarkerColumns(dir / "ok.png"), 0);
}

TEST(SweepsScreenshot, LaunchStopResumeFromTheGuiRecordsEveryStepOnce) {
  if (!HaveXvfb()) GTEST_SKIP() << "xvfb-run not installed (apt-get install xvfb xauth)";
  test::TempDir dir("gui_control");
  const std::string db = dir / "runs.db";
  // Long enough (1500 steps of a few ms) that the runner is still alive at every action even
  // when the machine is idle; the actions take a few frames each.
  const json spec = {
      {"name", "control"}, {"base", Base(dir.path(), 1500, true)}, {"seeds", {1, 2}}};
  std::ofstream(dir / "spec.json") << spec.dump(2);
  const std::string shots = dir.path().string();
  const std::string script =
      "open " + (dir / "spec.json") +
      "\n"
      "launch -j 2\n"
      "wait-step 30 120\n"  // the runs appear live, running
      "stop-run 0\n"        // one run: SIGTERM, it checkpoints and stops
      "wait-runs 1 stopped 60\n"
      "resume-run 0\n"  // `moelab train --resume` of that run
      "wait-runs 2 running 60\n"
      "screenshot " +
      shots +
      "/running.png\n"
      "stop-sweep\n"  // the whole sweep: its runner asks its trainers to stop
      "wait-idle 120\n"
      "resume-sweep\n"
      "wait-runs 2 done 300\n"
      "wait-idle 60\n"
      "screenshot " +
      shots +
      "/done.png\n"
      "quit\n";
  ASSERT_EQ(RunGuiScript(db, script, dir / "gui.log"), 0) << test::Slurp(dir / "gui.log");
  CopyToDocs(shots + "/running.png", "sweep-control-running.png");
  CopyToDocs(shots + "/done.png", "sweep-control-done.png");

  db::Reader reader(db);
  const auto runs = reader.ListRuns();
  ASSERT_EQ(runs.size(), 2u);
  for (const auto& r : runs) {
    EXPECT_EQ(r.status, RunStatus::kDone) << r.name << ": " << r.error;
    const db::Series loss = reader.GetSeries(r.id, "loss");
    ASSERT_EQ(static_cast<int64_t>(loss.steps.size()), r.shape.total_steps) << r.name;
    for (size_t i = 0; i < loss.steps.size(); ++i) {
      ASSERT_EQ(loss.steps[i], static_cast<int64_t>(i + 1)) << r.name;
    }
  }
  // Every action the GUI took is recorded once, in order.
  std::vector<std::string> actions;
  for (const std::string& line : LaunchRecords(db)) actions.push_back(json::parse(line)["action"]);
  const std::vector<std::string> expected = {"launch", "stop-run", "resume-run", "stop-sweep",
                                             "resume"};
  EXPECT_EQ(actions, expected);
}

}  // namespace
}  // namespace moelab::gui
