// A per-series min/max pyramid for zooming long curves: built once per series version (O(n)),
// it answers "index of the min and of the max of ys[a, b)" in O(log n), so the per-pixel-column
// M4 downsample of a zoom costs O(columns · log n) instead of a scan of every visible point.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "gui/view_model.h"

namespace moelab::gui {

class MinMaxPyramid {
 public:
  // Level k covers buckets of kBase << k points; NaN values are never a min or max.
  void Build(std::span<const double> ys);
  size_t size() const { return n_; }
  // Indices of the first minimum and first maximum of the finite values of ys[a, b); false when
  // there is none. `ys` must be the series Build saw.
  bool Query(std::span<const double> ys, size_t a, size_t b, size_t* imin, size_t* imax) const;
  size_t bytes() const;

 private:
  static constexpr size_t kBase = 4;
  static constexpr uint32_t kNone = UINT32_MAX;
  struct Node {
    uint32_t imin = kNone, imax = kNone;
  };
  std::vector<std::vector<Node>> levels_;
  size_t n_ = 0;
};

// DownsampleM4's output (the same points, in the same order) from the pyramid: binary searches
// for the column boundaries, then one pyramid query per column. Falls back to DownsampleM4 when
// fewer than a few points per column are visible.
void DownsampleM4Pyramid(std::span<const double> xs, std::span<const double> ys,
                         const MinMaxPyramid& pyramid, const AxisMap& x_axis, int columns,
                         std::vector<double>* out_x, std::vector<double>* out_y);

}  // namespace moelab::gui
