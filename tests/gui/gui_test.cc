// moelab-gui: view-model logic (downsampling, smoothing, grouping, colour maps, config diff,
// imbalance), the background data store against a database another writer keeps appending to,
// and headless screenshots of every view under xvfb-run checked for the elements they must show.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "db/fits.h"
#include "db/schema.h"
#include "gui/data_store.h"
#include "gui/fits.h"
#include "gui/settings.h"
#include "gui/view_model.h"
#include "tests/common/test_util.h"
#include "tests/gui/fixture.h"
#include "tests/gui/harness.h"

namespace moelab::gui {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

// ---- Downsampling ---------------------------------------------------------------------------

TEST(Downsample, KeepsExtremesFirstAndLastOfEveryColumn) {
  std::mt19937 rng(7);
  std::normal_distribution<double> noise;
  std::vector<double> xs(100000), ys(100000);
  for (size_t i = 0; i < xs.size(); ++i) {
    xs[i] = static_cast<double>(i);
    ys[i] = std::sin(i * 1e-3) + noise(rng);
  }
  ys[54321] = 50;  // a spike a reservoir sampler would miss
  const AxisMap axis{0, 99999, false};
  const int cols = 500;
  std::vector<double> ox, oy;
  DownsampleM4(xs, ys, axis, cols, &ox, &oy);
  EXPECT_LE(ox.size(), static_cast<size_t>(4 * cols + 2));
  EXPECT_GE(ox.size(), static_cast<size_t>(2 * cols));
  EXPECT_TRUE(std::is_sorted(ox.begin(), ox.end()));
  EXPECT_NE(std::find(oy.begin(), oy.end(), 50.0), oy.end());
  // Per column: the output's min and max equal the input's.
  std::map<int, std::pair<double, double>> in_mm, out_mm;
  auto col = [&](double x) { return std::min(cols - 1, static_cast<int>(axis.Forward(x) * cols)); };
  for (size_t i = 0; i < xs.size(); ++i) {
    auto [it, ok] = in_mm.try_emplace(col(xs[i]), ys[i], ys[i]);
    it->second.first = std::min(it->second.first, ys[i]);
    it->second.second = std::max(it->second.second, ys[i]);
  }
  for (size_t i = 0; i < ox.size(); ++i) {
    auto [it, ok] = out_mm.try_emplace(col(ox[i]), oy[i], oy[i]);
    it->second.first = std::min(it->second.first, oy[i]);
    it->second.second = std::max(it->second.second, oy[i]);
  }
  EXPECT_EQ(in_mm, out_mm);
  EXPECT_EQ(ox.front(), 0);
  EXPECT_EQ(ox.back(), 99999);
}

TEST(Downsample, VisibleRangeAddsOneNeighbourEachSideAndSkipsNaN) {
  std::vector<double> xs = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9};
  std::vector<double> ys = {0, 1, NAN, 3, 4, 5, 6, NAN, 8, 9};
  std::vector<double> ox, oy;
  DownsampleM4(xs, ys, AxisMap{3, 6, false}, 100, &ox, &oy);
  ASSERT_EQ(ox.size(), 6u);
  EXPECT_EQ(ox.front(), 1);  // index 2 is NaN: the nearest finite point before the range
  EXPECT_EQ(ox.back(), 8);
  for (double y : oy) EXPECT_TRUE(std::isfinite(y));
}

TEST(Downsample, LogAxisBucketsInLogSpace) {
  std::vector<double> xs, ys;
  for (int i = 1; i <= 100000; ++i) {
    xs.push_back(i);
    ys.push_back(1.0 / i);
  }
  std::vector<double> ox, oy;
  DownsampleM4(xs, ys, AxisMap{1, 100000, true}, 50, &ox, &oy);
  // The first decade (9 points) gets 10 columns: almost every early point survives.
  int early = 0;
  for (double x : ox) early += x < 10 ? 1 : 0;
  EXPECT_GE(early, 8);
  EXPECT_LE(ox.size(), 4u * 50 + 2);
}

TEST(Downsample, EmptyAndNearestIndex) {
  std::vector<double> ox, oy;
  DownsampleM4({}, {}, AxisMap{0, 1, false}, 10, &ox, &oy);
  EXPECT_TRUE(ox.empty());
  std::vector<double> xs = {1, 2, 4};
  EXPECT_EQ(NearestIndexAtOrBefore(xs, 0.5), 0);
  EXPECT_EQ(NearestIndexAtOrBefore(xs, 2), 1);
  EXPECT_EQ(NearestIndexAtOrBefore(xs, 3.9), 1);
  EXPECT_EQ(NearestIndexAtOrBefore(xs, 100), 2);
  EXPECT_EQ(NearestIndexAtOrBefore({}, 1), -1);
}

// ---- Smoothing ------------------------------------------------------------------------------

TEST(Ema, DebiasedKeepsConstantsAndFirstPoint) {
  std::vector<double> c(50, 3.5);
  for (double v : DebiasedEma(c, 0.9)) EXPECT_NEAR(v, 3.5, 1e-12);
  std::vector<double> ys = {10, 0, 0, 0};
  auto s = DebiasedEma(ys, 0.5);
  EXPECT_DOUBLE_EQ(s[0], 10);  // no pull towards zero at the start
  // m = 5, 2.5, 1.25, 0.625; debias 1-0.5^t.
  EXPECT_NEAR(s[1], 2.5 / 0.75, 1e-12);
  EXPECT_NEAR(s[3], 0.625 / 0.9375, 1e-12);
  auto id = DebiasedEma(ys, 0.0);
  EXPECT_EQ(id, ys);
}

TEST(Ema, NaNPassesThroughWithoutPoisoning) {
  std::vector<double> ys = {1, NAN, 1, 1};
  auto s = DebiasedEma(ys, 0.8);
  EXPECT_TRUE(std::isnan(s[1]));
  EXPECT_NEAR(s[2], 1, 1e-12);
  EXPECT_NEAR(s[3], 1, 1e-12);
}

// ---- Axes -----------------------------------------------------------------------------------

TEST(Ticks, NiceAndLog) {
  auto t = NiceTicks(0, 10, 5);
  EXPECT_EQ(t, (std::vector<double>{0, 2, 4, 6, 8, 10}));
  auto l = LogTicks(1e15, 1e19, 5);
  EXPECT_EQ(l.size(), 5u);
  EXPECT_DOUBLE_EQ(l.front(), 1e15);
  auto few = LogTicks(2, 30, 10);  // one decade: 2, 5, 10, 20
  EXPECT_NE(std::find(few.begin(), few.end(), 10.0), few.end());
  EXPECT_GE(few.size(), 3u);
  AxisMap m{10, 1000, true};
  EXPECT_NEAR(m.Forward(100), 0.5, 1e-12);
  EXPECT_NEAR(m.Inverse(0.5), 100, 1e-9);
  EXPECT_TRUE(std::isnan(m.Forward(-1)));
  EXPECT_EQ(FormatValue(1.5e18), "1.5e+18");
  EXPECT_EQ(FormatValue(3.25), "3.25");
}

// ---- Colours --------------------------------------------------------------------------------

TEST(Colors, HeatmapScaleIsMonotoneInLightnessAndClamped) {
  double last = -1;
  for (int i = 0; i <= 20; ++i) {
    const Rgba c = HeatColor(i, 0, 20);
    const double lum = 0.299 * c.r + 0.587 * c.g + 0.114 * c.b;
    EXPECT_GT(lum, last) << i;
    last = lum;
  }
  const Rgba lo = HeatColor(-5, 0, 1), lo2 = Viridis(0);
  EXPECT_EQ(lo.Packed(), lo2.Packed());
  EXPECT_EQ(HeatColor(7, 3, 3).Packed(), Viridis(0.5).Packed());
  EXPECT_EQ(ContrastText(Viridis(0)).r, 1.0f);  // white on dark purple
  EXPECT_EQ(ContrastText(Viridis(1)).r, 0.0f);  // black on yellow
  EXPECT_NE(CategoryColor(0).Packed(), CategoryColor(1).Packed());
  EXPECT_EQ(CategoryColor(0).Packed(), CategoryColor(kPaletteSize).Packed());
  EXPECT_EQ(Rgba({1, 0, 0, 1}).Packed(), 0xFF0000FFu);  // IM_COL32(255, 0, 0, 255)
}

// ---- Runs: keys, grouping, filtering, diff --------------------------------------------------

std::vector<RunKeys> SomeRuns() {
  auto cfg = [](int experts, const char* opt, double lr) {
    return FlattenConfig(
        {{"moe", {{"experts_total", experts}}}, {"optimizer", {{"name", opt}, {"lr", lr}}}});
  };
  return {{1, "a", "done", {{"sparsity", "16"}}, cfg(16, "muon", 3e-3)},
          {2, "b", "running", {{"sparsity", "8"}}, cfg(8, "adamw", 3e-3)},
          {3, "c", "failed", {{"sparsity", "48"}}, cfg(48, "muon", 1e-3)},
          {4, "d", "done", {}, cfg(8, "muonclip", 3e-3)}};
}

TEST(Runs, FlattenAndLookup) {
  auto runs = SomeRuns();
  EXPECT_EQ(runs[0].config.at("moe.experts_total"), "16");
  EXPECT_EQ(runs[0].config.at("optimizer.name"), "muon");  // strings unquoted
  EXPECT_EQ(runs[2].config.at("optimizer.lr"), "0.001");
  EXPECT_EQ(LookupKey(runs[0], "var:sparsity"), "16");
  EXPECT_EQ(LookupKey(runs[3], "var:sparsity"), "");
  EXPECT_EQ(LookupKey(runs[1], "optimizer.name"), "adamw");
}

TEST(Runs, GroupsOrderNumbersNumerically) {
  auto groups = GroupRuns(SomeRuns(), "var:sparsity");
  ASSERT_EQ(groups.size(), 4u);
  EXPECT_EQ(groups[0].value, "8");  // numeric order: 8 < 16 < 48, then the missing value
  EXPECT_EQ(groups[1].value, "16");
  EXPECT_EQ(groups[2].value, "48");
  auto by_experts = GroupRuns(SomeRuns(), "moe.experts_total");
  ASSERT_EQ(by_experts.size(), 3u);
  EXPECT_EQ(by_experts[0].value, "8");
  EXPECT_EQ(by_experts[0].members, (std::vector<int>{1, 3}));
  EXPECT_TRUE(ValueLess("9", "10"));
  EXPECT_TRUE(ValueLess("10", "abc"));
}

TEST(Runs, FilterMatchesEveryWordCaseInsensitively) {
  auto runs = SomeRuns();
  EXPECT_TRUE(MatchesFilter(runs[0], ""));
  EXPECT_TRUE(MatchesFilter(runs[0], "MUON"));
  EXPECT_TRUE(MatchesFilter(runs[1], "running adamw"));
  EXPECT_FALSE(MatchesFilter(runs[1], "running muon"));
  EXPECT_TRUE(MatchesFilter(runs[2], "sparsity=48"));
}

TEST(Runs, ConfigDiffListsOnlyDifferingFields) {
  auto runs = SomeRuns();
  auto diff = ConfigDiff({runs[0].config, runs[2].config});
  ASSERT_EQ(diff.size(), 2u);
  EXPECT_EQ(diff[0].key, "moe.experts_total");
  EXPECT_EQ(diff[0].values, (std::vector<std::string>{"16", "48"}));
  EXPECT_EQ(diff[1].key, "optimizer.lr");
  auto extra = runs[1].config;
  extra["model.heads"] = "8";
  auto d2 = ConfigDiff({runs[1].config, extra});
  ASSERT_EQ(d2.size(), 1u);
  EXPECT_EQ(d2[0].values[0], "\xe2\x80\x94");  // missing field shown as a dash
  EXPECT_TRUE(ConfigDiff({runs[0].config}).empty());
}

// ---- Max logits and experts -----------------------------------------------------------------

TEST(Logits, MaxOverHeadsAndClipFraction) {
  // 2 steps x 2 layers x 3 heads.
  std::vector<float> v = {1, 5, 2, 7, 0, 3, 9, 1, 1, 2, 8, 4};
  EXPECT_EQ(MaxOverHeads(v, 2, 3), (std::vector<float>{5, 7, 9, 8}));
  std::vector<int64_t> steps = {1, 2, 3};
  std::vector<ClipPoint> events = {{2, 0, 1}, {2, 1, 2}, {2, 1, 2}, {5, 0, 0}};
  ClipSeries c = ClipFraction(steps, events, 2, 3);
  EXPECT_EQ(c.steps, (std::vector<double>{1, 2, 3, 5}));
  EXPECT_EQ(c.fraction, (std::vector<double>{0, 2.0 / 6, 0, 1.0 / 6}));
  EXPECT_EQ(ClipTau({{"optimizer.qk_clip_tau", "100"}}).value_or(0), 100);
  EXPECT_FALSE(ClipTau({{"optimizer.qk_clip_tau", "0"}}).has_value());
  EXPECT_FALSE(ClipTau({}).has_value());
}

TEST(Experts, Imbalance) {
  std::vector<int64_t> even = {10, 10, 10, 10};
  EXPECT_DOUBLE_EQ(ExpertImbalance(even).cv, 0);
  EXPECT_DOUBLE_EQ(ExpertImbalance(even).max_over_mean, 1);
  std::vector<int64_t> skew = {40, 0, 0, 0};
  EXPECT_NEAR(ExpertImbalance(skew).cv, std::sqrt(3.0), 1e-12);
  EXPECT_DOUBLE_EQ(ExpertImbalance(skew).max_over_mean, 4);
  std::vector<int64_t> zero = {0, 0};
  EXPECT_EQ(ExpertImbalance(zero).cv, 0);
}

// ---- Settings -------------------------------------------------------------------------------

TEST(Settings, RoundTripAndBrokenFileGivesDefaults) {
  const fs::path dir =
      fs::temp_directory_path() / ("moelab_gui_settings_" + std::to_string(getpid()));
  fs::create_directories(dir);
  Settings s;
  s.db_path = "/x/y.db";
  s.AddRecent("/a.db");
  s.AddRecent("/b.db");
  s.AddRecent("/a.db");
  s.smoothing = 0.8f;
  s.color_key = "var:sparsity";
  s.columns = {"model.heads"};
  ASSERT_TRUE(SaveSettings(s, (dir / "sub" / "gui.json").string()));
  Settings r = LoadSettings((dir / "sub" / "gui.json").string());
  EXPECT_EQ(r.db_path, "/x/y.db");
  EXPECT_EQ(r.recent, (std::vector<std::string>{"/a.db", "/b.db"}));
  EXPECT_FLOAT_EQ(r.smoothing, 0.8f);
  EXPECT_EQ(r.color_key, "var:sparsity");
  EXPECT_EQ(r.columns, (std::vector<std::string>{"model.heads"}));
  std::ofstream(dir / "bad.json") << "{ not json";
  EXPECT_EQ(LoadSettings((dir / "bad.json").string()).view, "runs");
  EXPECT_EQ(LoadSettings((dir / "missing.json").string()).smoothing, Settings{}.smoothing);
  fs::remove_all(dir);
}

// ---- Data store + screenshots on a fixture database -----------------------------------------

class GuiDb : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = fs::temp_directory_path() / ("moelab_gui_test_" + std::to_string(getpid()));
    fs::create_directories(dir_);
    db_ = (dir_ / "fixture.db").string();
    live_ = new std::unique_ptr<db::RunWriter>();
    testing::BuildFixture(db_, live_);
  }
  static void TearDownTestSuite() {
    (*live_)->OnEnd(RunStatus::kStopped, "test over");
    delete live_;
    if (!std::getenv("MOELAB_GUI_KEEP")) fs::remove_all(dir_);
  }
  template <typename F>
  static bool WaitFor(F f, std::chrono::milliseconds timeout = 10s) {
    const auto end = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < end) {
      if (f()) return true;
      std::this_thread::sleep_for(20ms);
    }
    return f();
  }

  static inline fs::path dir_;
  static inline std::string db_;
  static inline std::unique_ptr<db::RunWriter>* live_ = nullptr;
};

TEST_F(GuiDb, StoreListsRunsWithVarsSweepAndTau) {
  DataStore store(db_, 0.1);
  ASSERT_TRUE(WaitFor([&] { return store.Settled(); }));
  auto runs = store.Runs();
  ASSERT_EQ(runs->runs.size(), 5u);
  const RunEntry* r3 = runs->Find(3);
  ASSERT_NE(r3, nullptr);
  EXPECT_EQ(r3->row.name, "s32-muonclip");
  EXPECT_EQ(r3->sweep_name, "sparsity");
  EXPECT_EQ(r3->keys.vars.at("sparsity"), "32");
  EXPECT_EQ(r3->keys.config.at("moe.experts_total"), "32");
  ASSERT_TRUE(r3->tau.has_value());
  EXPECT_EQ(*r3->tau, testing::kTau);
  EXPECT_FALSE(runs->Find(1)->tau.has_value());
  EXPECT_EQ(runs->Find(5)->row.effective_status, RunStatus::kRunning);
  EXPECT_EQ(runs->var_keys, (std::vector<std::string>{"optimizer", "sparsity"}));
  EXPECT_TRUE(store.error().empty());
}

TEST_F(GuiDb, StoreLoadsLazilyAndFollowsALiveRunIncrementally) {
  DataStore store(db_, 0.1);
  EXPECT_EQ(store.Series(5, "loss"), nullptr);  // nothing is loaded before it is asked for
  ASSERT_TRUE(WaitFor([&] { return store.Series(5, "loss") != nullptr; }));
  auto first = store.Series(5, "loss");
  ASSERT_EQ(first->steps.size(), 200u);
  auto logits = store.Logits(5);
  ASSERT_TRUE(WaitFor([&] { return (logits = store.Logits(5)) != nullptr; }));
  EXPECT_EQ(logits->layers, testing::kLayers);
  EXPECT_EQ(logits->steps.size(), 200u);
  EXPECT_FALSE(logits->clips.empty());

  testing::WriteSteps(live_->get(), 200, 260, true, 1.02);
  (*live_)->Flush();
  ASSERT_TRUE(WaitFor([&] { return store.Series(5, "loss")->steps.size() == 260; }));
  auto next = store.Series(5, "loss");
  for (size_t i = 0; i < next->steps.size(); ++i) ASSERT_EQ(next->steps[i], i + 1.0);
  EXPECT_EQ(first->steps.size(), 200u);  // the old snapshot is immutable
  EXPECT_GT(next->version, first->version);
  ASSERT_TRUE(WaitFor([&] { return store.Logits(5)->steps.size() == 260; }));
  EXPECT_EQ(store.Logits(5)->layer_max.size(), 260u * testing::kLayers);
}

TEST_F(GuiDb, NewRunAppearsOnItsOwn) {
  DataStore store(db_, 0.1);
  ASSERT_TRUE(WaitFor([&] { return store.Settled(); }));
  const size_t before = store.Runs()->runs.size();
  db::RunInfo info;
  info.name = "late";
  info.config_json = "{}";
  info.config_hash = "late";
  auto w = db::RunWriter::Create(db_, info);
  ASSERT_TRUE(WaitFor([&] { return store.Runs()->runs.size() == before + 1; }));
  EXPECT_EQ(store.Runs()->runs.back()->row.name, "late");
  w->OnEnd(RunStatus::kDone, "");
  db::RunWriter::DeleteRun(db_, w->run_id());
}

TEST_F(GuiDb, MissingAndForeignFilesGiveAMessageNotACrash) {
  DataStore missing((dir_ / "nope.db").string(), 0.1);
  ASSERT_TRUE(WaitFor([&] { return !missing.error().empty(); }));
  EXPECT_NE(missing.error().find("no such file"), std::string::npos);
  EXPECT_EQ(missing.Series(1, "loss"), nullptr);
  const fs::path foreign = dir_ / "foreign.db";
  std::ofstream(foreign) << "this is not a database\n";
  DataStore bad(foreign.string(), 0.1);
  ASSERT_TRUE(WaitFor([&] { return !bad.error().empty(); }));
  EXPECT_TRUE(bad.Settled());  // a failed open does not leave screenshots waiting
}

// ---- Screenshots ----------------------------------------------------------------------------

using testing::CountNear;
using testing::HaveXvfb;
using testing::Image;

// Runs moelab-gui headless; returns the PNG or an empty image.
Image Shoot(const std::string& db, const std::string& args, const std::string& out) {
  const std::string gui = test::BinPath("moelab-gui");
  const std::string db_arg = db.empty() ? "" : " --db '" + db + "'";
  const std::string cmd = "xvfb-run -a -s \"-screen 0 1280x800x24\" timeout 120 " + gui + db_arg +
                          " " + args + " --screenshot '" + out + "' --frames 3 2>&1";
  // xvfb-run -a picks a free display, but two starting at once (ctest -j) can race for it:
  // a failed start is retried.
  int rc = -1;
  for (int attempt = 0; attempt < 3 && rc != 0; ++attempt) {
    fs::remove(out);
    rc = std::system(cmd.c_str());
  }
  EXPECT_EQ(rc, 0) << cmd;
  Image img = testing::LoadPng(out);
  if (img.w == 0) {
    ADD_FAILURE() << "cannot read " << out;
    return img;
  }
  testing::CopyToDocs(out, fs::path(out).filename().string());
  return img;
}

int DistinctColors(const Image& img) {
  std::set<uint32_t> c;
  for (size_t i = 0; i + 2 < img.px.size(); i += 3) {
    c.insert(img.px[i] << 16 | img.px[i + 1] << 8 | img.px[i + 2]);
  }
  return static_cast<int>(c.size());
}

// Pixels close to the viridis curve but not grey: heatmap cells.
int ViridisPixels(const Image& img, int y0 = 0) {
  std::vector<std::array<int, 3>> lut;
  for (int i = 0; i <= 64; ++i) {
    const Rgba c = Viridis(i / 64.0);
    lut.push_back({int(c.r * 255), int(c.g * 255), int(c.b * 255)});
  }
  int n = 0;
  for (int y = y0; y < img.h; ++y) {
    for (int x = 0; x < img.w; ++x) {
      const unsigned char* p = img.at(x, y);
      if (std::abs(p[0] - p[1]) < 20 && std::abs(p[1] - p[2]) < 20) continue;
      for (const auto& c : lut) {
        if (std::abs(p[0] - c[0]) <= 6 && std::abs(p[1] - c[1]) <= 6 &&
            std::abs(p[2] - c[2]) <= 6) {
          ++n;
          break;
        }
      }
    }
  }
  return n;
}

void ExpectNotBlank(const Image& img) {
  ASSERT_EQ(img.w, 1280);
  ASSERT_EQ(img.h, 800);
  EXPECT_GT(DistinctColors(img), 100);
}

class GuiScreenshot : public GuiDb {
 protected:
  void SetUp() override {
    if (!HaveXvfb()) GTEST_SKIP() << "xvfb-run not installed (apt-get install xvfb xauth)";
  }
  std::string Out(const std::string& name) { return (dir_ / (name + ".png")).string(); }
};

TEST_F(GuiScreenshot, RunsViewShowsStatusesAndLiveProgress) {
  Image img = Shoot(db_, "--view runs", Out("runs"));
  ExpectNotBlank(img);
  EXPECT_GT(CountNear(img, 110, 200, 110, 20), 30) << "no 'done' status text";
  EXPECT_GT(CountNear(img, 90, 180, 255, 6), 200) << "no progress bar for the live run";
}

TEST_F(GuiScreenshot, CurvesViewDrawsEverySelectedRunInThePlots) {
  Image img = Shoot(db_, "--view curves --run 1 2 3", Out("curves"));
  ExpectNotBlank(img);
  // The colours of runs 1..3, below the toolbar and legend (y > 120), and not the fourth's.
  auto near = [&](int i) {
    const Rgba c = CategoryColor(i);
    return CountNear(img, std::lround(c.r * 255), std::lround(c.g * 255), std::lround(c.b * 255),
                     10, 0, 120);
  };
  EXPECT_GT(near(0), 500);
  EXPECT_GT(near(1), 500);
  EXPECT_GT(near(2), 500);
  EXPECT_LT(near(3), 50) << "an unselected run is drawn";
}

TEST_F(GuiScreenshot, MaxLogitsViewShowsHeatmapsTauAndClips) {
  Image img = Shoot(db_, "--view logits --run 1 3", Out("logits"));
  ExpectNotBlank(img);
  EXPECT_GT(ViridisPixels(img, 60), 20000) << "no heatmap cells";
  EXPECT_GT(CountNear(img, 235, 80, 70, 10), 300) << "no τ line / clip markers";
}

TEST_F(GuiScreenshot, ExpertsViewShowsLoadHeatmapAndImbalance) {
  Image img = Shoot(db_, "--view experts --run 2", Out("experts"));
  ExpectNotBlank(img);
  EXPECT_GT(ViridisPixels(img, 60), 50000);
}

TEST_F(GuiScreenshot, CompareViewShowsDiffAndOverlaidCurves) {
  Image img = Shoot(db_, "--view compare --run 1 3", Out("compare"));
  ExpectNotBlank(img);
  for (int i = 0; i < 2; ++i) {
    const Rgba c = CategoryColor(i);
    EXPECT_GT(CountNear(img, std::lround(c.r * 255), std::lround(c.g * 255), std::lround(c.b * 255),
                        10, 0, 300),
              300);
  }
}

TEST_F(GuiScreenshot, NoDatabaseOpensTheWelcomeScreenAtOnce) {
  // Before, --screenshot without --db waited 60 s for data that could never come.
  const auto start = std::chrono::steady_clock::now();
  Image img = Shoot("", "", Out("welcome"));
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_EQ(img.w, 1280);
  EXPECT_GT(DistinctColors(img), 10);
  EXPECT_LT(s, 30) << "the welcome screen waited for data";
}

TEST_F(GuiScreenshot, MissingDatabaseSaysSoInTheWindow) {
  Image img = Shoot((dir_ / "missing.db").string(), "--view curves", Out("missing"));
  ExpectNotBlank(img);
  EXPECT_GT(CountNear(img, 240, 110, 100, 12), 50) << "no error message";
}

TEST_F(GuiDb, FitsRunThroughAnalysisWithBandsAndHeadsAblation) {
  const std::string path = (dir_ / "scaling.db").string();
  testing::BuildScalingFixture(path);
  FitRequest req;
  req.db_path = path;
  req.family_key = "heads";
  req.heads_base = "4";
  req.heads_treatment = "8";
  req.resamples = 50;
  FitResult r = ComputeFits(req);
  ASSERT_TRUE(r.error.empty()) << r.error;
  ASSERT_TRUE(r.fits.has_value());
  EXPECT_EQ(r.fits->families.size(), 2u);
  ASSERT_EQ(r.bands.size(), 2u);
  for (const auto& b : r.bands) {
    ASSERT_EQ(b.flops.size(), b.lo.size());
    for (size_t i = 0; i < b.flops.size(); ++i) {
      EXPECT_LE(b.lo[i], b.hi[i] + 1e-12);
      EXPECT_GT(b.loss[i], 0);
    }
  }
  ASSERT_TRUE(r.heads.has_value()) << r.heads_error;
  EXPECT_LT(r.heads->mean_delta_equal_tokens.estimate, 0);  // 8 heads is better by 1 %
  EXPECT_NEAR(r.heads->mean_delta_equal_tokens.estimate, -0.01, 0.002);

  // The job runs the same in the background and keeps only the latest request.
  FitJob job;
  job.Submit(req);
  ASSERT_TRUE(WaitFor([&] { return job.Result() != nullptr && !job.Busy(); }, 60s));
  EXPECT_EQ(job.Result()->request, req);

  FitRequest missing = req;
  missing.family_key = "no_such_key";
  EXPECT_FALSE(ComputeFits(missing).error.empty());
}

TEST_F(GuiScreenshot, ScalingViewShowsFamiliesFitsAndTable) {
  const std::string path = (dir_ / "scaling_view.db").string();
  testing::BuildScalingFixture(path);
  Image img = Shoot(path, "--view scaling", Out("scaling"));
  ExpectNotBlank(img);
  const Rgba top = GroupColor(1, 2, true);  // the 8-head family
  EXPECT_GT(CountNear(img, int(top.r * 255), int(top.g * 255), int(top.b * 255), 14, 0, 80, 780),
            300);
  const Rgba low = GroupColor(0, 2, true);
  EXPECT_GT(CountNear(img, int(low.r * 255), int(low.g * 255), int(low.b * 255), 14, 0, 80, 780),
            300);
}

// Pixels of `color` at `alpha` over the plot background (the most common colour of
// [x0, x1) x [y0, y1)): a translucent fill such as a fit band.
int CountBlended(const Image& img, const Rgba& color, int alpha, int x0, int y0, int x1, int y1) {
  std::map<uint32_t, int> hist;
  for (int y = y0; y < y1; ++y) {
    for (int x = x0; x < x1; ++x) {
      const unsigned char* p = img.at(x, y);
      ++hist[p[0] << 16 | p[1] << 8 | p[2]];
    }
  }
  uint32_t bg = 0;
  int most = 0;
  for (const auto& [c, n] : hist) {
    if (n > most) most = n, bg = c;
  }
  auto mix = [&](double c, int shift) {
    const double b = (bg >> shift) & 0xFF;
    return static_cast<int>(std::lround(b + (c * 255 - b) * alpha / 255.0));
  };
  return CountNear(img, mix(color.r, 16), mix(color.g, 8), mix(color.b, 0), 3, x0, y0, x1, y1);
}

TEST_F(GuiScreenshot, ScalingViewShowsAStoredFitWithoutRefitting) {
  // A `moelab fit` stored after the last run finished is current: the view draws it as stored
  // (its families' curves, frontiers and points) and fits nothing until asked, so no bootstrap
  // bands appear (the stored row holds no draws; a refit would draw them).
  const std::string path = (dir_ / "scaling_stored.db").string();
  testing::BuildScalingFixture(path);
  const std::string fit = test::BinPath("moelab") + " fit --db '" + path +
                          "' --sweep heads --by heads --resamples 100 > /dev/null 2>&1";
  ASSERT_EQ(std::system(fit.c_str()), 0) << fit;
  Image stored = Shoot(path, "--view scaling", Out("scaling_stored"));
  ASSERT_EQ(stored.w, 1280);
  const Rgba top = GroupColor(1, 2, true), low = GroupColor(0, 2, true);
  EXPECT_GT(CountNear(stored, int(top.r * 255), int(top.g * 255), int(top.b * 255), 14, 0, 80, 780),
            300)
      << "the stored fit's curve of heads = 8 is not drawn";
  EXPECT_GT(CountNear(stored, int(low.r * 255), int(low.g * 255), int(low.b * 255), 14, 0, 80, 780),
            100)
      << "the stored fit's curve of heads = 4 is not drawn";
  auto bands = [&](const Image& img) {
    return CountBlended(img, top, 0x38, 80, 250, 757, 690) +
           CountBlended(img, low, 0x38, 80, 250, 757, 690);
  };
  // (Anti-aliased edges of the points and curves match the blend here and there: a few hundred.)
  EXPECT_LT(bands(stored), 600) << "a band is drawn: refitted although the stored fit is current";
  // The same view refitted (the stored row deleted) draws the bands the check looks for.
  {
    db::Connection c = db::OpenForWrite(path);
    c.Exec("DELETE FROM fits");
  }
  Image fitted = Shoot(path, "--view scaling", Out("scaling_refitted"));
  ASSERT_EQ(fitted.w, 1280);
  EXPECT_GT(bands(fitted), 2000);
}

}  // namespace
}  // namespace moelab::gui
