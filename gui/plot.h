// A small plotting widget on ImGui draw lists (ImPlot is not packaged in Debian): axes with
// nice/log ticks, grid, zoom (mouse wheel; Shift = y only), pan (drag), double-click to refit,
// and helpers that draw pre-downsampled lines, horizontal/vertical markers and heatmaps.
#pragma once

#include <imgui.h>
#include <imgui_internal.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "gui/plot_export.h"
#include "gui/view_model.h"

namespace moelab::gui {

// One axis' persistent range. auto_fit follows the data (follow-live); user zoom/pan clears it.
struct AxisState {
  bool auto_fit = true;
  double lo = 0, hi = 1;
};

struct PlotBounds {
  double x_lo = INFINITY, x_hi = -INFINITY, y_lo = INFINITY, y_hi = -INFINITY;
  void Add(double x, double y);
  void AddX(double x);
  void AddY(double y);
};

// A value in an axis' drawing coordinate: log10 on log axes (NaN for values <= 0).
inline double ToAxis(const AxisMap& m, double v) {
  return m.log ? (v > 0 ? std::log10(v) : NAN) : v;
}

class Plot {
 public:
  // Lays out a plot of `size` (negative: fill). `fit` is the data extent used while auto_fit.
  // x and y may be shared between plots (linked axes).
  Plot(const char* id, ImVec2 size, AxisState* x, AxisState* y, const PlotBounds& fit, bool log_x,
       bool log_y, const std::string& title, const std::string& x_label, bool interactive = true);
  ~Plot();  // draws the frame on top and pops the clip rect

  ImVec2 ToPixel(double x, double y) const;
  // From axis coordinates (log10 of the value on log axes).
  ImVec2 ToPixelT(double tx, double ty) const {
    return ImVec2(static_cast<float>(x_off_ + x_scale_ * tx),
                  static_cast<float>(y_off_ + y_scale_ * ty));
  }
  const AxisMap& x_axis() const { return xa_; }
  const AxisMap& y_axis() const { return ya_; }
  int width_px() const { return static_cast<int>(inner_.Max.x - inner_.Min.x); }
  const ImRect& inner() const { return inner_; }
  bool hovered() const { return hovered_; }
  double mouse_x() const { return mouse_x_; }
  double mouse_y() const { return mouse_y_; }
  ImDrawList* draw_list() const { return dl_; }
  // While File > Save plot as SVG records this plot: where its primitives go (else null).
  PlotRecording* recording() const { return rec_; }

  // Polyline through (xs, ys) in data coordinates, breaking at non-finite or non-positive (on
  // log axes) values.
  void Line(const std::vector<double>& xs, const std::vector<double>& ys, ImU32 color,
            float thickness = 1.5f) const;
  void HLine(double y, ImU32 color, bool dashed, const char* label = nullptr) const;
  void VLine(double x, ImU32 color, float thickness = 1.0f) const;
  void Marker(double x, double y, ImU32 color, float radius = 3.0f) const;
  // Vertical tick at the bottom edge of the plot (event markers).
  void BottomTick(double x, ImU32 color, float height = 6.0f) const;

 private:
  void UpdateTransform();
  ImDrawList* dl_ = nullptr;
  ImRect frame_, inner_;
  double x_off_ = 0, x_scale_ = 1, y_off_ = 0, y_scale_ = 1;
  AxisMap xa_, ya_;
  bool hovered_ = false;
  double mouse_x_ = 0, mouse_y_ = 0;
  bool visible_ = true;
  PlotRecording* rec_ = nullptr;
};

// An RGBA OpenGL texture for ImGui::Image / AddImage (GL_NEAREST: heatmap cells stay sharp).
class Texture {
 public:
  Texture() = default;
  ~Texture();
  Texture(const Texture&) = delete;
  Texture& operator=(const Texture&) = delete;
  // rgba: w * h pixels in IM_COL32 layout, rows top-down.
  void Upload(int w, int h, const uint32_t* rgba);
  ImTextureID id() const;
  int width() const { return w_; }
  int height() const { return h_; }

 private:
  unsigned int tex_ = 0;
  int w_ = 0, h_ = 0;
};

// Plot lines rasterised on the CPU into a texture that is redrawn only when its inputs change.
// With dozens of runs the GPU path costs millions of vertices a frame, which Xvfb's software
// renderer (llvmpipe) cannot draw at 30 fps; one textured quad per plot it can. The caller
// passes a signature of everything the picture depends on (data versions, ranges, colours).
class LineCanvas {
 public:
  // `identity`: what the picture shows (runs, colours, axis kinds); `content`: the data drawn
  // (versions, downsample generations). The axis ranges and the size are added here. Returns
  // true when the picture must be redrawn now: call Line()/Dot()/... then End(). Returns false
  // when the cached picture is current, or when only content or ranges changed and may_defer
  // is set (the frame's drawing budget is spent): End() then draws the old picture moved and
  // scaled to the new ranges, and deferred() tells the caller to redraw next frame.
  // A picture is deferred at most kMaxDeferredFrames frames in a row; then it is overdue and
  // redrawn whatever the budget, so plots drawn later in the frame are not starved.
  bool Begin(const Plot& plot, uint64_t identity, uint64_t content, bool may_defer = false);
  bool deferred() const { return deferred_; }
  // After Begin() returned true: the caller draws front to back (topmost first). Pixels an
  // opaque line already covers are then never written again, which bounds the work of many
  // overlapping dense series by the canvas area. The picture equals the back-to-front one.
  void FrontToBack();
  bool overdue() const { return deferred_frames_ >= kMaxDeferredFrames; }
  // Wall time of the last redraw (rasterising and upload), for the caller's frame budget.
  double cost_ms() const { return cost_ms_; }
  static constexpr int kMaxDeferredFrames = 2;
  // A polyline through (xs, ys), ascending x. It breaks at non-finite points and between two
  // points that lie on either side of an x in `breaks` (ascending): gaps in the data.
  void Line(const Plot& plot, const std::vector<double>& xs, const std::vector<double>& ys,
            ImU32 color, float thickness = 1.5f, std::span<const double> breaks = {});
  // The same from axis coordinates (ToAxis: log10 of the value on log axes), for callers that
  // keep them with their decimation instead of taking a log10 of every point every redraw.
  void LineT(const Plot& plot, std::span<const double> xs, std::span<const double> ys, ImU32 color,
             float thickness = 1.5f, std::span<const double> breaks = {});
  // (A plot being saved as SVG gets each call's vector primitives too: see plot_export.h.)
  // Vertical bars from lo to hi per point (a min/max band drawn per pixel column).
  void Band(const Plot& plot, const std::vector<double>& xs, const std::vector<double>& lo,
            const std::vector<double>& hi, ImU32 color);
  // A filled disc (scatter points).
  void Dot(const Plot& plot, double x, double y, ImU32 color, float radius);
  // The region between lo(x) and hi(x), linearly interpolated in pixel space (fit bands).
  void FillBetween(const Plot& plot, const std::vector<double>& xs, const std::vector<double>& lo,
                   const std::vector<double>& hi, ImU32 color);
  void End(const Plot& plot);

 private:
  void Segment(float x0, float y0, float x1, float y1, ImU32 color, float thickness);
  // A solid vertical run of pixels [y0, y1] in column x (clipped): the per-pixel-column min/max
  // of dense series. Opaque colours are written without blending.
  void Span(int x, int y0, int y1, ImU32 color);
  void Blend(int x, int y, ImU32 color, float coverage);
  // Column-major (pixel (x, y) at x * h_ + y): the per-column spans of dense series, most of
  // the pixels written, are then contiguous. A noisy series' column span is tens of pixels,
  // and 100 of them per column cost 16 ms a canvas row-major (a cache line per pixel).
  std::vector<uint32_t> px_;
  bool under_ = false;  // FrontToBack(): composite "under" what is drawn
  // Per column, a run of rows [cov_lo_, cov_hi_] known to be opaque (FrontToBack mode).
  std::vector<int> cov_lo_, cov_hi_;
  // Dot's coverage stamps for stamp_radius_, one per quarter-pixel centre offset (4 x 4):
  // (2 stamp_r_ + 1)^2 values each, the disc's pixel at the middle.
  std::vector<float> stamp_;
  float stamp_radius_ = -1;
  int stamp_r_ = 0;
  int w_ = 0, h_ = 0;
  uint64_t identity_ = 0, signature_ = 0;
  double tx0_ = 0, tx1_ = 1, ty0_ = 0, ty1_ = 1;  // axis ranges (log10 on log axes) drawn
  bool dirty_ = false, deferred_ = false;
  int deferred_frames_ = 0;
  double cost_ms_ = 0;
  std::chrono::steady_clock::time_point raster_start_;
  // SVG primitives of a redraw for a plot being saved, one entry per call, in drawing order
  // (reversed at End() when drawn front to back: SVG paints back to front).
  struct Recorded {
    enum Kind { kPolyline, kPolygon, kCircle } kind;
    std::vector<ImVec2> points;
    ImU32 color;
    float size;
  };
  std::vector<Recorded> recorded_;
  Texture tex_;
};

// FNV-1a over plain values, for LineCanvas signatures.
struct Signature {
  uint64_t h = 1469598103934665603ULL;
  template <typename T>
  Signature& Add(const T& v) {
    const unsigned char* p = reinterpret_cast<const unsigned char*>(&v);
    for (size_t i = 0; i < sizeof(T); ++i) h = (h ^ p[i]) * 1099511628211ULL;
    return *this;
  }
};

// Colour scale bar with min/max labels, drawn at the cursor position.
void ColorBar(float width, float height, double vmin, double vmax);

ImU32 ToImU32(const Rgba& c, float alpha = 1.0f);

}  // namespace moelab::gui
