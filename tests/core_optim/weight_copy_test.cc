// The weight-copy hand-over's bookkeeping (core/model/optimizer_ops.h UnwrittenSpans): what a
// backend still casts after the optimizer marked the spans it wrote. Needs no GPU.
#include <gtest/gtest.h>

#include <utility>
#include <vector>

#include "core/model/optimizer_ops.h"

namespace moelab {
namespace {

using Spans = std::vector<std::pair<size_t, size_t>>;

TEST(UnwrittenSpans, NothingWrittenIsEverything) {
  EXPECT_EQ(UnwrittenSpans({}, 10), (Spans{{0, 10}}));
  EXPECT_EQ(UnwrittenSpans({}, 0), Spans{});
}

TEST(UnwrittenSpans, TheWholeArenaWrittenLeavesNothing) {
  EXPECT_EQ(UnwrittenSpans({{0, 10}}, 10), Spans{});
  // Muon's span and its AdamW rest, or one optimizer stepped twice: overlaps and repeats.
  EXPECT_EQ(UnwrittenSpans({{4, 10}, {0, 6}, {0, 6}}, 10), Spans{});
}

TEST(UnwrittenSpans, ZeroShardLeavesTheOtherRanksShards) {
  // Rank 1 of 3 wrote [4, 7): ranks 0 and 2's shards came by all-gather.
  EXPECT_EQ(UnwrittenSpans({{4, 7}}, 10), (Spans{{0, 4}, {7, 10}}));
  // Unsorted, touching and disjoint spans.
  EXPECT_EQ(UnwrittenSpans({{8, 9}, {2, 4}, {4, 5}}, 10), (Spans{{0, 2}, {5, 8}, {9, 10}}));
}

}  // namespace
}  // namespace moelab
