#include "gui/pyramid.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace moelab::gui {

namespace {

// Merges b into a (a covers lower indices): the first minimum / maximum wins ties.
template <typename Node>
void Merge(std::span<const double> ys, Node* a, const Node& b) {
  if (b.imin != UINT32_MAX && (a->imin == UINT32_MAX || ys[b.imin] < ys[a->imin])) a->imin = b.imin;
  if (b.imax != UINT32_MAX && (a->imax == UINT32_MAX || ys[b.imax] > ys[a->imax])) a->imax = b.imax;
}

}  // namespace

void MinMaxPyramid::Build(std::span<const double> ys) {
  n_ = ys.size();
  levels_.clear();
  if (n_ < kBase) return;
  std::vector<Node> base((n_ + kBase - 1) / kBase);
  for (size_t b = 0; b < base.size(); ++b) {
    Node& node = base[b];
    const size_t end = std::min(n_, (b + 1) * kBase);
    for (size_t i = b * kBase; i < end; ++i) {
      if (!std::isfinite(ys[i])) continue;
      if (node.imin == kNone || ys[i] < ys[node.imin]) node.imin = static_cast<uint32_t>(i);
      if (node.imax == kNone || ys[i] > ys[node.imax]) node.imax = static_cast<uint32_t>(i);
    }
  }
  levels_.push_back(std::move(base));
  while (levels_.back().size() > 1) {
    const std::vector<Node>& below = levels_.back();
    std::vector<Node> up((below.size() + 1) / 2);
    for (size_t b = 0; b < up.size(); ++b) {
      up[b] = below[2 * b];
      if (2 * b + 1 < below.size()) Merge(ys, &up[b], below[2 * b + 1]);
    }
    levels_.push_back(std::move(up));
  }
}

size_t MinMaxPyramid::bytes() const {
  size_t b = 0;
  for (const auto& l : levels_) b += l.size() * sizeof(Node);
  return b;
}

bool MinMaxPyramid::Query(std::span<const double> ys, size_t a, size_t b, size_t* imin,
                          size_t* imax) const {
  Node acc;
  b = std::min(b, n_);
  size_t i = a, k = 0;
  while (i < b) {
    // The largest bucket that starts at i and ends by b; single points elsewhere. k climbs and
    // then descends once over the range: O(log n) buckets.
    if (levels_.empty() || i % kBase != 0 || i + kBase > b) {
      if (std::isfinite(ys[i])) {
        Merge(ys, &acc, Node{static_cast<uint32_t>(i), static_cast<uint32_t>(i)});
      }
      ++i;
      continue;
    }
    while (k + 1 < levels_.size() && i % (kBase << (k + 1)) == 0 && i + (kBase << (k + 1)) <= b) {
      ++k;
    }
    while (k > 0 && (i % (kBase << k) != 0 || i + (kBase << k) > b)) --k;
    Merge(ys, &acc, levels_[k][i / (kBase << k)]);
    i += kBase << k;
  }
  if (acc.imin == kNone) return false;
  *imin = acc.imin;
  *imax = acc.imax;
  return true;
}

void DownsampleM4Pyramid(std::span<const double> xs, std::span<const double> ys,
                         const MinMaxPyramid& pyramid, const AxisMap& x_axis, int columns,
                         std::vector<double>* out_x, std::vector<double>* out_y) {
  const size_t n = std::min(xs.size(), ys.size());
  if (n == 0 || columns < 1 || pyramid.size() != ys.size()) {
    DownsampleM4(xs, ys, x_axis, columns, out_x, out_y);
    return;
  }
  const double vis_lo = std::min(x_axis.lo, x_axis.hi), vis_hi = std::max(x_axis.lo, x_axis.hi);
  const size_t begin = std::lower_bound(xs.begin(), xs.begin() + n, vis_lo) - xs.begin();
  const size_t end = std::upper_bound(xs.begin(), xs.begin() + n, vis_hi) - xs.begin();
  // Few points per column: the plain scan is as fast and needs no searches.
  if (end - begin <= static_cast<size_t>(columns) * 8) {
    DownsampleM4(xs, ys, x_axis, columns, out_x, out_y);
    return;
  }
  out_x->clear();
  out_y->clear();
  const M4Output out{xs, ys, out_x, out_y};
  out.EmitFiniteBefore(begin);
  // The column of x exactly as DownsampleM4 computes it, so both give the same partition.
  const bool log = x_axis.log;
  const double scale = columns / (x_axis.hi - x_axis.lo);
  auto column = [&](double x) -> int64_t {
    const double t = log ? x_axis.Forward(x) * columns : (x - x_axis.lo) * scale;
    if (std::isnan(t)) return -1;
    return std::clamp<int64_t>(static_cast<int64_t>(t), 0, columns - 1);
  };
  // Galloping search for each column's end from its expected width: O(log points-per-column)
  // instead of O(log n) per column.
  const size_t width = std::max<size_t>(1, (end - begin) / columns);
  size_t a = begin;
  while (a < end) {
    const int64_t c = column(xs[a]);
    size_t lo = a + 1, step = width, hi = std::min(end, a + step);
    while (hi < end && column(xs[hi]) <= c) {
      lo = hi + 1;
      step *= 2;
      hi = std::min(end, hi + step);
    }
    // The first index past column c, in [lo, hi].
    const size_t b = std::partition_point(xs.begin() + lo, xs.begin() + hi,
                                          [&](double x) { return column(x) <= c; }) -
                     xs.begin();
    size_t imin, imax;
    if (c >= 0 && pyramid.Query(ys, a, b, &imin, &imax)) {
      size_t first = a, last = b - 1;
      while (!std::isfinite(ys[first])) ++first;
      while (!std::isfinite(ys[last])) --last;
      out.EmitColumn(first, imin, imax, last);
    }
    a = std::max(b, a + 1);
  }
  out.EmitFiniteFrom(end, n);
}

}  // namespace moelab::gui
