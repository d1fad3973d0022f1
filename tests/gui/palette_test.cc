// View-model pieces of the newcomer fixes (issue 24): the run palette (colour-blind safe,
// distinct beyond 10 runs, readable on the dark plots), the ordered gradient's contrast, gaps
// of missing steps, and heatmap cell labels.
#include <gtest/gtest.h>

#include <cmath>
#include <set>
#include <vector>

#include "gui/view_model.h"

namespace moelab::gui {
namespace {

TEST(Palette, StartsWithOkabeItoAndStaysDistinctBeyondTenRuns) {
  // Okabe & Ito's sky blue and orange first (the Compare view's two runs).
  EXPECT_EQ(CategoryColor(0).Packed(), (Rgba{86 / 255.0f, 180 / 255.0f, 233 / 255.0f, 1}).Packed());
  EXPECT_EQ(CategoryColor(1).Packed(), (Rgba{230 / 255.0f, 159 / 255.0f, 0, 1}).Packed());
  std::set<uint32_t> packed;
  for (int i = 0; i < kPaletteSize; ++i) packed.insert(CategoryColor(i).Packed());
  EXPECT_EQ(packed.size(), static_cast<size_t>(kPaletteSize)) << "a colour repeats";
  EXPECT_EQ(CategoryColor(0).Packed(), CategoryColor(kPaletteSize).Packed());  // then it cycles
  // Tableau 10 (the old palette) repeated after 10 runs: run 11 had run 1's colour. Now the
  // first 24 runs differ pairwise for normal vision and the three dichromacies (OKLab distance;
  // ~0.02 is a just-noticeable difference).
  double worst = INFINITY;
  for (int i = 0; i < 24; ++i) {
    for (int j = 0; j < i; ++j)
      worst = std::min(worst, CvdSafeDistance(CategoryColor(i), CategoryColor(j)));
  }
  EXPECT_GT(worst, 0.045) << "two of the first 24 run colours look alike to someone";
  // Every colour reads on the plot background.
  const OkLab bg = ToOkLab(PlotBackground());
  for (int i = 0; i < kPaletteSize; ++i) {
    EXPECT_GT(CvdSafeDistance(CategoryColor(i), PlotBackground()), 0.12) << i;
    EXPECT_GT(ToOkLab(CategoryColor(i)).l - bg.l, 0.2) << "colour " << i << " is too dark";
  }
}

TEST(Palette, OrderedGradientReadsOnTheBackgroundAndGrowsInLightness) {
  // The scaling view's first family ("2") was viridis' dark indigo on the navy plot.
  const OkLab bg = ToOkLab(PlotBackground());
  for (int count = 2; count <= 8; ++count) {
    double last = -1;
    for (int rank = 0; rank < count; ++rank) {
      const OkLab c = ToOkLab(GroupColor(rank, count, true));
      EXPECT_GT(c.l - bg.l, 0.2) << rank << " of " << count;
      EXPECT_GT(c.l, last);
      last = c.l;
    }
  }
  EXPECT_LT(ToOkLab(Viridis(0.25)).l - bg.l, 0.2);  // what the first family used to get
}

TEST(Palette, CvdSimulationKeepsGreysAndMergesRedGreenForDeutans) {
  const Rgba grey{0.5f, 0.5f, 0.5f, 1};
  for (Cvd k : {Cvd::kProtan, Cvd::kDeutan, Cvd::kTritan}) {
    EXPECT_LT(OkDistance(ToOkLab(SimulateCvd(grey, k)), ToOkLab(grey)), 0.01);
  }
  const Rgba red{0.8f, 0.3f, 0.2f, 1}, green{0.45f, 0.5f, 0.15f, 1};
  EXPECT_LT(OkDistance(ToOkLab(SimulateCvd(red, Cvd::kDeutan)),
                       ToOkLab(SimulateCvd(green, Cvd::kDeutan))),
            OkDistance(ToOkLab(red), ToOkLab(green)) / 2);
}

TEST(Gaps, MissingStepsStartANewStretchRegularSpacingDoesNot) {
  std::vector<double> every10;
  for (int s = 10; s <= 1000; s += 10) every10.push_back(s);
  EXPECT_TRUE(GapStarts(every10).empty());
  std::vector<double> steps;
  for (int s = 1; s <= 150; ++s) steps.push_back(s);
  for (int s = 251; s <= 400; ++s) steps.push_back(s);
  EXPECT_EQ(GapStarts(steps), (std::vector<size_t>{150}));  // steps[150] = 251
  // Evaluations every 50 steps plus the final one off the grid: no gap.
  EXPECT_TRUE(GapStarts(std::vector<double>{50, 100, 150, 200, 230}).empty());
  EXPECT_TRUE(GapStarts(std::vector<double>{1, 500}).empty());
}

TEST(Cells, MaxLogitsKeepThreeSignificantDigits) {
  EXPECT_EQ(SignificantDigits(29.73, 3), "29.7");  // was "30": next to τ = 30 it matters
  EXPECT_EQ(SignificantDigits(5.123, 3), "5.12");
  EXPECT_EQ(SignificantDigits(123.4, 3), "123");
  EXPECT_EQ(SignificantDigits(1234.0, 3), "1234");
  EXPECT_EQ(SignificantDigits(0.5, 3), "0.500");
  EXPECT_EQ(SignificantDigits(29.73, 2), "30");
}

}  // namespace
}  // namespace moelab::gui
