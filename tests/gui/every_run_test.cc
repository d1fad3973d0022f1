// Every selected run appears in every view, or the view says why it is absent (issue 37):
// Compare heads its columns by what tells the runs apart, Max logits and Experts show a
// column / panel per selected run, and the Experts heatmap labels every expert. Read from the
// text the real app draws under xvfb-run (the script's dump-text).
#include <gtest/gtest.h>

#include <string>

#include "db/writer.h"
#include "gui/view_model.h"
#include "tests/common/test_util.h"
#include "tests/gui/fixture.h"
#include "tests/gui/harness.h"

namespace moelab::gui {
namespace {

class GuiEveryRun : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new test::TempDir("gui_every_run");
    db_ = *dir_ / "runs.db";
    testing::BuildFixture(db_);  // runs 1..4: MoE, max logits and expert loads
    // Run 5: a dense model that recorded neither (no attention shape, no MoE layers).
    db::RunInfo info;
    info.name = "dense-baseline";
    info.config_json = R"({"model": {"layers": 2}})";
    info.config_hash = "dense-baseline";
    info.sweep_id = 1;
    auto w = db::RunWriter::Create(db_, info);
    w->OnEnd(RunStatus::kDone, "");
  }
  static void TearDownTestSuite() { delete dir_; }
  void SetUp() override {
    if (!testing::HaveXvfb()) GTEST_SKIP() << "xvfb-run not installed (apt-get install xvfb xauth)";
  }
  static std::string Text(const std::string& name, const std::string& args,
                          const std::string& db = db_, const std::string& size = "1280x800") {
    const std::string text = testing::ViewText(db, args, *dir_ / (name + ".log"), size);
    EXPECT_FALSE(text.empty()) << test::Slurp(*dir_ / (name + ".log"));
    return text;
  }
  static inline test::TempDir* dir_ = nullptr;
  static inline std::string db_;
};

bool Has(const std::string& text, const std::string& what) {
  return text.find(what) != std::string::npos;
}

TEST_F(GuiEveryRun, MaxLogitsShowsEverySelectedRunAndSaysWhyOneIsAbsent) {
  const std::string text = Text("logits", "--view logits --run 1 2 3 5");
  for (const char* name : {"s8-adamw", "s16-muon", "s32-muonclip"})
    EXPECT_TRUE(Has(text, name)) << name << " has no column:\n" << text;
  EXPECT_TRUE(Has(text, "run #5 (dense-baseline) has no max logits recorded")) << text;
}

TEST_F(GuiEveryRun, ExpertsShowsEverySelectedRunAndSaysWhyOneIsAbsent) {
  // Tall enough for the three panels (text scrolled out of the window is not drawn).
  const std::string text = Text("experts", "--view experts --run 2 3 4 5", db_, "1280x1400");
  for (const char* name : {"#2 s16-muon", "#3 s32-muonclip", "#4 s48-muonclip"})
    EXPECT_TRUE(Has(text, name)) << name << " has no panel:\n" << text;
  EXPECT_TRUE(Has(text, "run #5 (dense-baseline) has no expert loads recorded")) << text;
}

TEST_F(GuiEveryRun, TheExpertsHeatmapLabelsEveryExpert) {
  const std::string text = Text("experts1", "--view experts --run 1");
  for (int e = 0; e < testing::kExperts; ++e) {
    EXPECT_TRUE(Has(text, "e" + std::to_string(e))) << "expert " << e << " unlabelled:\n" << text;
  }
}

TEST(ExpertLabels, EveryExpertWhenRowsAreALineHighElseEveryKthALineApart) {
  EXPECT_EQ(ExpertLabelStride(8, 30, 13), 1);
  EXPECT_EQ(ExpertLabelStride(8, 13, 13), 1);
  EXPECT_EQ(ExpertLabelStride(64, 7, 13), 2);
  EXPECT_EQ(ExpertLabelStride(64, 4, 13), 4);
  EXPECT_EQ(ExpertLabelStride(256, 1, 13), 20);
  EXPECT_EQ(ExpertLabelStride(4, 0.5f, 13), 4);  // never more than the experts
  for (float row : {0.5f, 1.0f, 2.5f, 6.0f, 12.9f}) {
    EXPECT_GE(ExpertLabelStride(128, row, 13) * row, 13) << row;
  }
}

TEST_F(GuiEveryRun, CompareHeadsColumnsByWhatTellsTheRunsApart) {
  // Two runs whose long names differ in their last letter, same config: the headers used to
  // be the names, cut off before the part that differs.
  const std::string gaps = *dir_ / "gaps.db";
  testing::BuildGapFixture(gaps);
  const std::string text = Text("compare", "--view compare --run 1 2", gaps);
  EXPECT_TRUE(Has(text,
                  "#1 \xe2\x80\xa6"
                  "a"))
      << text;
  EXPECT_TRUE(Has(text,
                  "#2 \xe2\x80\xa6"
                  "b"))
      << text;
  EXPECT_FALSE(Has(text, "CLIPPED")) << text;
  // Runs that differ in a sweep variable are headed by it.
  const std::string vars = Text("compare_vars", "--view compare --run 1 3");
  EXPECT_TRUE(Has(vars, "#1 optimizer=adamw sparsity=8")) << vars;
  EXPECT_TRUE(Has(vars, "#3 optimizer=muonclip sparsity=32")) << vars;
  EXPECT_FALSE(Has(vars, "CLIPPED")) << vars;
}

TEST(DistinguishingLabels, VariablesThenNamesThenConfig) {
  RunKeys a{1, "sweep/s8-seed1", "done", {{"sparsity", "8"}}, {{"lr", "1"}}};
  RunKeys b{2, "sweep/s16-seed1", "done", {{"sparsity", "16"}}, {{"lr", "1"}}};
  EXPECT_EQ(DistinguishingLabels({&a, &b}),
            (std::vector<std::string>{"#1 sparsity=8", "#2 sparsity=16"}));
  b.vars = a.vars;  // alike in the variables: the part of the names that differs
  EXPECT_EQ(DistinguishingLabels({&a, &b}),
            (std::vector<std::string>{"#1 \xe2\x80\xa6s8\xe2\x80\xa6",
                                      "#2 \xe2\x80\xa6s16\xe2\x80\xa6"}));
  b.name = a.name;  // alike in name too: the config
  b.config["lr"] = "2";
  EXPECT_EQ(DistinguishingLabels({&a, &b}), (std::vector<std::string>{"#1 lr=1", "#2 lr=2"}));
}

}  // namespace
}  // namespace moelab::gui
