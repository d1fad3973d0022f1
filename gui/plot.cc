#include "gui/plot.h"

#include <GL/gl.h>
#include <imgui_internal.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>

namespace moelab::gui {

ImU32 ToImU32(const Rgba& c, float alpha) {
  Rgba d = c;
  d.a *= alpha;
  return d.Packed();
}

void PlotBounds::Add(double x, double y) {
  AddX(x);
  AddY(y);
}
void PlotBounds::AddX(double x) {
  if (!std::isfinite(x)) return;
  x_lo = std::min(x_lo, x);
  x_hi = std::max(x_hi, x);
}
void PlotBounds::AddY(double y) {
  if (!std::isfinite(y)) return;
  y_lo = std::min(y_lo, y);
  y_hi = std::max(y_hi, y);
}

namespace {

// Zooms [lo, hi] by `factor` about the axis fraction t (0 = lo end), in the axis' own space.
void ZoomAxis(AxisState* s, const AxisMap& m, double t, double factor) {
  const double a = 0.0, b = 1.0;
  const double lo = t - (t - a) * factor, hi = t + (b - t) * factor;
  s->lo = m.Inverse(lo);
  s->hi = m.Inverse(hi);
  s->auto_fit = false;
}

void PanAxis(AxisState* s, const AxisMap& m, double dt) {
  s->lo = m.Inverse(0.0 - dt);
  s->hi = m.Inverse(1.0 - dt);
  s->auto_fit = false;
}

void Resolve(AxisState* s, double fit_lo, double fit_hi, bool log, double pad, AxisMap* out) {
  double lo = s->lo, hi = s->hi;
  if (s->auto_fit || !std::isfinite(lo) || !std::isfinite(hi) || !(hi > lo) || (log && !(lo > 0))) {
    lo = fit_lo;
    hi = fit_hi;
    if (log && std::isfinite(lo) && lo <= 0) lo = hi > 0 ? hi * 1e-3 : 1e-3;
    PadRange(&lo, &hi, log, pad);
    if (!s->auto_fit) {
      s->lo = lo;
      s->hi = hi;
    }
  }
  out->lo = lo;
  out->hi = hi;
  out->log = log;
}

}  // namespace

Plot::Plot(const char* id, ImVec2 size, AxisState* x, AxisState* y, const PlotBounds& fit,
           bool log_x, bool log_y, const std::string& title, const std::string& x_label,
           bool interactive) {
  ImGui::PushID(id);
  const ImVec2 avail = ImGui::GetContentRegionAvail();
  if (size.x <= 0) size.x = std::max(50.0f, avail.x + size.x);
  if (size.y <= 0) size.y = std::max(50.0f, avail.y + size.y);
  ImGui::InvisibleButton("##plot", size);
  dl_ = ImGui::GetWindowDrawList();
  frame_ = ImRect(ImGui::GetItemRectMin(), ImGui::GetItemRectMax());
  visible_ = ImGui::IsItemVisible();
  const float fh = ImGui::GetFontSize();
  // Whole pixels: the line canvas is a texture drawn 1:1 at inner_.Min with nearest
  // sampling. At a half-pixel offset (1.5 lines of a 13 px font) every pixel centre fell on a
  // texel edge and rounding picked the row above or below depending on x: a smooth line
  // stepped by a pixel here and there (the validation line's "staircase").
  inner_ =
      ImRect(ImVec2(std::round(frame_.Min.x + fh * 4.8f), std::round(frame_.Min.y + fh * 1.5f)),
             ImVec2(std::round(frame_.Max.x - fh * 0.6f), std::round(frame_.Max.y - fh * 2.6f)));

  rec_ = PlotExport::Get().Register(title.empty() ? id : title, frame_, inner_);

  Resolve(x, fit.x_lo, fit.x_hi, log_x, 0.0, &xa_);
  Resolve(y, fit.y_lo, fit.y_hi, log_y, 0.06, &ya_);

  // Interaction: wheel zooms x about the cursor (Shift: y), drag pans, double-click refits.
  hovered_ = ImGui::IsItemHovered() && inner_.Contains(ImGui::GetIO().MousePos);
  const ImGuiIO& io = ImGui::GetIO();
  const double tx = (io.MousePos.x - inner_.Min.x) / std::max(1.0f, inner_.GetWidth());
  const double ty = (inner_.Max.y - io.MousePos.y) / std::max(1.0f, inner_.GetHeight());
  if (interactive && hovered_ && io.MouseWheel != 0) {
    const double factor = std::pow(0.85, io.MouseWheel);
    if (io.KeyShift) {
      ZoomAxis(y, ya_, ty, factor);
    } else {
      ZoomAxis(x, xa_, tx, factor);
    }
  }
  if (interactive && ImGui::IsItemActive() && ImGui::IsMouseDragging(ImGuiMouseButton_Left, 1.0f)) {
    PanAxis(x, xa_, io.MouseDelta.x / std::max(1.0f, inner_.GetWidth()));
    PanAxis(y, ya_, -io.MouseDelta.y / std::max(1.0f, inner_.GetHeight()));
  }
  if (ImGui::IsItemHovered() && ImGui::IsMouseDoubleClicked(ImGuiMouseButton_Left)) {
    x->auto_fit = true;
    y->auto_fit = true;
  }
  if (!x->auto_fit) xa_ = {x->lo, x->hi, log_x};
  if (!y->auto_fit) ya_ = {y->lo, y->hi, log_y};
  mouse_x_ = xa_.Inverse(tx);
  mouse_y_ = ya_.Inverse(ty);
  UpdateTransform();

  // Background, grid and tick labels.
  const ImU32 bg = ImGui::GetColorU32(ImGuiCol_FrameBg);
  const ImU32 grid = IM_COL32(128, 128, 128, 48);
  const ImU32 text = ImGui::GetColorU32(ImGuiCol_Text);
  const ImU32 dim = ImGui::GetColorU32(ImGuiCol_TextDisabled);
  dl_->AddRectFilled(inner_.Min, inner_.Max, bg);
  if (rec_) rec_->Rect(PlotRecording::kBack, inner_.Min, inner_.Max, bg);
  const int max_x_ticks = std::max(2, static_cast<int>(inner_.GetWidth() / (fh * 6)));
  const int max_y_ticks = std::max(2, static_cast<int>(inner_.GetHeight() / (fh * 2.5f)));
  auto ticks_of = [](const AxisMap& m, int n) {
    return m.log ? LogTicks(m.lo, m.hi, n) : NiceTicks(m.lo, m.hi, n);
  };
  for (double t : ticks_of(xa_, max_x_ticks)) {
    const float px = inner_.Min.x + static_cast<float>(xa_.Forward(t)) * inner_.GetWidth();
    if (px < inner_.Min.x - 0.5f || px > inner_.Max.x + 0.5f) continue;
    dl_->AddLine(ImVec2(px, inner_.Min.y), ImVec2(px, inner_.Max.y), grid);
    const std::string s = FormatValue(t);
    const float w = ImGui::CalcTextSize(s.c_str()).x;
    // Keep edge labels inside the frame: the window clips anything beyond it.
    const float lx = std::clamp(px - w / 2, frame_.Min.x, frame_.Max.x - w);
    dl_->AddText(ImVec2(lx, inner_.Max.y + 2), dim, s.c_str());
    if (rec_) {
      rec_->Line(PlotRecording::kBack, ImVec2(px, inner_.Min.y), ImVec2(px, inner_.Max.y), grid, 1);
      rec_->Text(PlotRecording::kBack, ImVec2(lx, inner_.Max.y + 2), dim, s);
    }
  }
  for (double t : ticks_of(ya_, max_y_ticks)) {
    const float py = inner_.Max.y - static_cast<float>(ya_.Forward(t)) * inner_.GetHeight();
    if (py < inner_.Min.y - 0.5f || py > inner_.Max.y + 0.5f) continue;
    dl_->AddLine(ImVec2(inner_.Min.x, py), ImVec2(inner_.Max.x, py), grid);
    const std::string s = FormatValue(t);
    const float w = ImGui::CalcTextSize(s.c_str()).x;
    dl_->AddText(ImVec2(inner_.Min.x - w - 4, py - fh / 2), dim, s.c_str());
    if (rec_) {
      rec_->Line(PlotRecording::kBack, ImVec2(inner_.Min.x, py), ImVec2(inner_.Max.x, py), grid, 1);
      rec_->Text(PlotRecording::kBack, ImVec2(inner_.Min.x - w - 4, py - fh / 2), dim, s);
    }
  }
  dl_->AddText(ImVec2(inner_.Min.x, frame_.Min.y + 1), text, title.c_str());
  if (rec_) rec_->Text(PlotRecording::kBack, ImVec2(inner_.Min.x, frame_.Min.y + 1), text, title);
  if (!x_label.empty()) {
    const float w = ImGui::CalcTextSize(x_label.c_str()).x;
    dl_->AddText(ImVec2(inner_.GetCenter().x - w / 2, inner_.Max.y + fh + 3), dim, x_label.c_str());
    if (rec_) {
      rec_->Text(PlotRecording::kBack, ImVec2(inner_.GetCenter().x - w / 2, inner_.Max.y + fh + 3),
                 dim, x_label);
    }
  }
  // Right-click: save this plot (File > Save plot as lists every plot too).
  if (interactive && ImGui::BeginPopupContextItem("##plot_menu")) {
    const std::string name = PlotExport::Get().NameOf(frame_);
    ImGui::TextDisabled("%s", name.c_str());
    if (ImGui::MenuItem("Save plot as PNG or SVG...")) PlotExport::Get().AskPath(name);
    ImGui::EndPopup();
  }
  dl_->PushClipRect(inner_.Min, inner_.Max, true);
}

Plot::~Plot() {
  dl_->PopClipRect();
  dl_->AddRect(inner_.Min, inner_.Max, ImGui::GetColorU32(ImGuiCol_Border));
  if (rec_)
    rec_->Rect(PlotRecording::kFront, inner_.Min, inner_.Max, 0,
               ImGui::GetColorU32(ImGuiCol_Border));
  if (hovered_) {
    const ImU32 c = IM_COL32(200, 200, 200, 90);
    const float px = ImGui::GetIO().MousePos.x;
    dl_->AddLine(ImVec2(px, inner_.Min.y), ImVec2(px, inner_.Max.y), c);
  }
  ImGui::PopID();
}

ImVec2 Plot::ToPixel(double x, double y) const {
  // Called for every drawn point: precomputed affine maps, one log10 per log axis.
  double tx = x, ty = y;
  if (xa_.log) tx = x > 0 ? std::log10(x) : NAN;
  if (ya_.log) ty = y > 0 ? std::log10(y) : NAN;
  return ImVec2(static_cast<float>(x_off_ + x_scale_ * tx),
                static_cast<float>(y_off_ + y_scale_ * ty));
}

void Plot::UpdateTransform() {
  auto t = [](const AxisMap& m, double v) { return m.log ? std::log10(v) : v; };
  const double x0 = t(xa_, xa_.lo), x1 = t(xa_, xa_.hi), y0 = t(ya_, ya_.lo), y1 = t(ya_, ya_.hi);
  x_scale_ = inner_.GetWidth() / (x1 - x0);
  x_off_ = inner_.Min.x - x0 * x_scale_;
  y_scale_ = -inner_.GetHeight() / (y1 - y0);
  y_off_ = inner_.Max.y - y0 * y_scale_;
}

void Plot::Line(const std::vector<double>& xs, const std::vector<double>& ys, ImU32 color,
                float thickness) const {
  if (!visible_) return;
  const size_t n = std::min(xs.size(), ys.size());
  // Pixel coordinates far outside the clip rect overflow float precision in the rasteriser;
  // clamp them to a generous band around the plot.
  const float lim_lo_y = inner_.Min.y - 4 * inner_.GetHeight();
  const float lim_hi_y = inner_.Max.y + 4 * inner_.GetHeight();
  std::vector<ImVec2> run;
  run.reserve(n);
  auto flush = [&]() {
    if (run.size() >= 2) {
      dl_->AddPolyline(run.data(), static_cast<int>(run.size()), color, 0, thickness);
    } else if (run.size() == 1) {
      dl_->AddCircleFilled(run[0], thickness + 1, color, 8);
    }
    if (rec_) rec_->Polyline(PlotRecording::kData, run, color, thickness);
    run.clear();
  };
  for (size_t i = 0; i < n; ++i) {
    ImVec2 p = ToPixel(xs[i], ys[i]);
    if (!std::isfinite(p.x) || !std::isfinite(p.y)) {
      flush();
      continue;
    }
    p.y = std::clamp(p.y, lim_lo_y, lim_hi_y);
    // Consecutive vertices on the same pixel add nothing but cost (they come from M4 columns).
    if (!run.empty() && std::abs(run.back().x - p.x) < 0.25f &&
        std::abs(run.back().y - p.y) < 0.25f) {
      continue;
    }
    run.push_back(p);
  }
  flush();
}

void Plot::HLine(double y, ImU32 color, bool dashed, const char* label) const {
  const float py = ToPixel(xa_.lo, y).y;
  if (!std::isfinite(py)) return;
  if (dashed) {
    for (float x = inner_.Min.x; x < inner_.Max.x; x += 10) {
      dl_->AddLine(ImVec2(x, py), ImVec2(std::min(x + 6, inner_.Max.x), py), color, 1.5f);
    }
  } else {
    dl_->AddLine(ImVec2(inner_.Min.x, py), ImVec2(inner_.Max.x, py), color, 1.5f);
  }
  const ImVec2 label_at(inner_.Max.x - (label ? ImGui::CalcTextSize(label).x : 0) - 4,
                        py - ImGui::GetFontSize() - 1);
  if (label) dl_->AddText(label_at, color, label);
  if (rec_) {
    rec_->Line(PlotRecording::kData, ImVec2(inner_.Min.x, py), ImVec2(inner_.Max.x, py), color,
               1.5f, dashed);
    if (label) rec_->Text(PlotRecording::kData, label_at, color, label);
  }
}

void Plot::VLine(double x, ImU32 color, float thickness) const {
  const float px = ToPixel(x, ya_.lo).x;
  if (!std::isfinite(px)) return;
  dl_->AddLine(ImVec2(px, inner_.Min.y), ImVec2(px, inner_.Max.y), color, thickness);
  if (rec_) {
    rec_->Line(PlotRecording::kData, ImVec2(px, inner_.Min.y), ImVec2(px, inner_.Max.y), color,
               thickness);
  }
}

void Plot::Marker(double x, double y, ImU32 color, float radius) const {
  const ImVec2 p = ToPixel(x, y);
  if (!std::isfinite(p.x) || !std::isfinite(p.y)) return;
  dl_->AddCircleFilled(p, radius, color, 10);
  if (rec_) rec_->Circle(PlotRecording::kData, p, radius, color);
}

void Plot::BottomTick(double x, ImU32 color, float height) const {
  const float px = ToPixel(x, ya_.lo).x;
  if (!std::isfinite(px)) return;
  dl_->AddLine(ImVec2(px, inner_.Max.y), ImVec2(px, inner_.Max.y - height), color, 2.0f);
  if (rec_) {
    rec_->Line(PlotRecording::kData, ImVec2(px, inner_.Max.y), ImVec2(px, inner_.Max.y - height),
               color, 2.0f);
  }
}

// ---- Texture ----------------------------------------------------------------------------------

Texture::~Texture() {
  if (tex_) glDeleteTextures(1, &tex_);
}

void Texture::Upload(int w, int h, const uint32_t* rgba) {
  GLint last = 0;
  glGetIntegerv(GL_TEXTURE_BINDING_2D, &last);
  if (!tex_) glGenTextures(1, &tex_);
  glBindTexture(GL_TEXTURE_2D, tex_);
  glPixelStorei(GL_UNPACK_ALIGNMENT, 4);
  if (w != w_ || h != h_) {
    glTexParameteri(GL_TEXTURE_2D, GL_TEXTURE_MIN_FILTER, GL_NEAREST);
    glTexParameteri(GL_TEXTURE_2D, GL_TEXTURE_MAG_FILTER, GL_NEAREST);
    glTexParameteri(GL_TEXTURE_2D, GL_TEXTURE_WRAP_S, GL_CLAMP_TO_EDGE);
    glTexParameteri(GL_TEXTURE_2D, GL_TEXTURE_WRAP_T, GL_CLAMP_TO_EDGE);
    glTexImage2D(GL_TEXTURE_2D, 0, GL_RGBA, w, h, 0, GL_RGBA, GL_UNSIGNED_BYTE, rgba);
    w_ = w;
    h_ = h;
  } else {
    glTexSubImage2D(GL_TEXTURE_2D, 0, 0, 0, w, h, GL_RGBA, GL_UNSIGNED_BYTE, rgba);
  }
  glBindTexture(GL_TEXTURE_2D, static_cast<GLuint>(last));
}

ImTextureID Texture::id() const {
  return reinterpret_cast<ImTextureID>(static_cast<intptr_t>(tex_));
}

// ---- LineCanvas -------------------------------------------------------------------------------

bool LineCanvas::Begin(const Plot& plot, uint64_t identity, uint64_t content, bool may_defer) {
  const int w = std::max(1, static_cast<int>(plot.inner().GetWidth()));
  const int h = std::max(1, static_cast<int>(plot.inner().GetHeight()));
  auto t = [](const AxisMap& m, double v) { return m.log ? std::log10(v) : v; };
  const AxisMap &xa = plot.x_axis(), &ya = plot.y_axis();
  const double tx0 = t(xa, xa.lo), tx1 = t(xa, xa.hi), ty0 = t(ya, ya.lo), ty1 = t(ya, ya.hi);
  Signature sig;
  sig.Add(identity).Add(content).Add(w).Add(h).Add(tx0).Add(tx1).Add(ty0).Add(ty1);
  deferred_ = false;
  recorded_.clear();
  // A plot being saved as SVG is drawn again, now, so its primitives are recorded.
  const bool record = plot.recording() != nullptr;
  if (!record && sig.h == signature_ && w == w_ && h == h_ && tex_.width() == h &&
      tex_.height() == w)
    return false;
  // A picture deferred a few frames in a row is redrawn whatever the budget, so plots drawn
  // later in the frame are not starved by the earlier ones.
  if (!record && may_defer && !overdue() && identity == identity_ && w == w_ && h == h_ &&
      tex_.width() == h && tex_.height() == w) {
    deferred_ = true;
    ++deferred_frames_;
    return false;
  }
  deferred_frames_ = 0;
  identity_ = identity;
  signature_ = sig.h;
  tx0_ = tx0;
  tx1_ = tx1;
  ty0_ = ty0;
  ty1_ = ty1;
  w_ = w;
  h_ = h;
  px_.assign(static_cast<size_t>(w) * h, 0u);
  dirty_ = true;
  under_ = false;
  raster_start_ = std::chrono::steady_clock::now();
  return true;
}

namespace {

uint32_t Mul255(uint32_t v, uint32_t f) {  // v * f / 255, rounded (exact for v or f = 255)
  const uint32_t t = v * f + 128;
  return (t + (t >> 8)) >> 8;
}

// d + s * f / 255 per channel of premultiplied RGBA.
uint32_t AddScaled(uint32_t d, uint32_t s, uint32_t f) {
  return ((d & 0xFF) + Mul255(s & 0xFF, f)) | (((d >> 8 & 0xFF) + Mul255(s >> 8 & 0xFF, f)) << 8) |
         (((d >> 16 & 0xFF) + Mul255(s >> 16 & 0xFF, f)) << 16) |
         (((d >> 24) + Mul255(s >> 24, f)) << 24);
}

}  // namespace

void LineCanvas::FrontToBack() {
  under_ = true;
  cov_lo_.assign(w_, 0);
  cov_hi_.assign(w_, -1);
}

inline void LineCanvas::Blend(int x, int y, ImU32 color, float coverage) {
  if (x < 0 || y < 0 || x >= w_ || y >= h_ || coverage <= 0) return;
  // The buffer is premultiplied ("over" and "under" are then one multiply-add per channel, no
  // division); End() converts to the straight alpha ImGui's backend blends with.
  const uint32_t a =
      static_cast<uint32_t>(((color >> 24) & 0xFF) * std::min(coverage, 1.0f) + 0.5f);
  if (a == 0) return;
  uint32_t& d = px_[static_cast<size_t>(x) * h_ + y];
  if (under_ && (d >> 24) == 255) return;  // already covered by something in front
  const uint32_t src = Mul255(color & 0xFF, a) | (Mul255((color >> 8) & 0xFF, a) << 8) |
                       (Mul255((color >> 16) & 0xFF, a) << 16) | (a << 24);
  if (d == 0 || (!under_ && a == 255)) {
    d = src;
  } else if (under_) {
    d = AddScaled(d, src, 255 - (d >> 24));  // src under d
  } else {
    d = AddScaled(src, d, 255 - a);  // src over d
  }
}

void LineCanvas::Span(int x, int y0, int y1, ImU32 color) {
  if (x < 0 || x >= w_) return;
  y0 = std::max(y0, 0);
  y1 = std::min(y1, h_ - 1);
  if (y1 < y0) return;
  if (!under_) {
    if ((color >> 24) == 0xFF) {
      // Opaque (every smoothed curve): premultiplied equals straight, no read of the pixel.
      std::fill_n(px_.data() + static_cast<size_t>(x) * h_ + y0, y1 - y0 + 1, color);
      return;
    }
    for (int y = y0; y <= y1; ++y) Blend(x, y, color, 1.0f);
    return;
  }
  // Front to back: [cov_lo_, cov_hi_] of the column is opaque already; only the rest of the
  // span is touched. 100 noisy series drawn over the same band then write each pixel about once.
  int& lo = cov_lo_[x];
  int& hi = cov_hi_[x];
  const bool opaque = (color >> 24) == 0xFF;
  uint32_t* column = px_.data() + static_cast<size_t>(x) * h_;
  auto fill = [&](int a, int b) {
    if (!opaque) {
      for (int y = a; y <= b; ++y) Blend(x, y, color, 1.0f);
      return;
    }
    // Opaque under: an empty pixel takes the colour, a partly covered one the rest of it.
    for (int y = a; y <= b; ++y) {
      uint32_t& d = column[y];
      if (d == 0) {
        d = color;
      } else if ((d >> 24) != 255) {
        d = AddScaled(d, color, 255 - (d >> 24));
      }
    }
  };
  if (hi < lo || y1 < lo - 1 || y0 > hi + 1) {
    fill(y0, y1);
    // Disjoint from the known covered run: keep the longer one if this span is opaque.
    if (opaque && (hi < lo || y1 - y0 > hi - lo)) {
      lo = y0;
      hi = y1;
    }
    return;
  }
  fill(y0, lo - 1);
  fill(hi + 1, y1);
  if (opaque) {
    lo = std::min(lo, y0);
    hi = std::max(hi, y1);
  }
}

void LineCanvas::Segment(float x0, float y0, float x1, float y1, ImU32 color, float thickness) {
  const float dx = x1 - x0, dy = y1 - y0;
  const float half = thickness / 2;
  if (std::abs(dx) >= std::abs(dy)) {
    if (x1 < x0) {
      std::swap(x0, x1);
      std::swap(y0, y1);
    }
    const float slope = dx != 0 ? dy / dx : 0;
    const float hw = half * std::sqrt(1 + slope * slope);
    // A segment owns the columns whose centre lies in [x0, x1): joined segments then never
    // draw a column twice. (Owning [floor(x0), ceil(x1) - 1] blended the joint's column twice,
    // at two slightly different heights: a line of evaluations a few pixels apart stepped at
    // every point.) A segment shorter than a column's spacing still draws its nearest one.
    int xa = static_cast<int>(std::ceil(x0 - 0.5f)),
        xb = static_cast<int>(std::ceil(x1 - 0.5f)) - 1;
    if (xb < xa) xa = xb = static_cast<int>(std::floor((x0 + x1) / 2));
    xa = std::max(xa, 0);
    xb = std::min(xb, w_ - 1);
    for (int x = xa; x <= xb; ++x) {
      const float y = y0 + (x + 0.5f - x0) * slope;
      for (int py = static_cast<int>(std::floor(y - hw - 0.5f));
           py <= static_cast<int>(std::ceil(y + hw + 0.5f)); ++py) {
        Blend(x, py, color, hw + 0.5f - std::abs(py + 0.5f - y));
      }
    }
  } else {
    if (y1 < y0) {
      std::swap(x0, x1);
      std::swap(y0, y1);
    }
    const float slope = dx / dy;
    const float hw = half * std::sqrt(1 + slope * slope);
    // Rows owned as columns are above.
    int ya = static_cast<int>(std::ceil(y0 - 0.5f)),
        yb = static_cast<int>(std::ceil(y1 - 0.5f)) - 1;
    if (yb < ya) ya = yb = static_cast<int>(std::floor((y0 + y1) / 2));
    ya = std::max(ya, 0);
    yb = std::min(yb, h_ - 1);
    for (int y = ya; y <= yb; ++y) {
      const float x = x0 + (y + 0.5f - y0) * slope;
      for (int px = static_cast<int>(std::floor(x - hw - 0.5f));
           px <= static_cast<int>(std::ceil(x + hw + 0.5f)); ++px) {
        Blend(px, y, color, hw + 0.5f - std::abs(px + 0.5f - x));
      }
    }
  }
}

void LineCanvas::Line(const Plot& plot, const std::vector<double>& xs,
                      const std::vector<double>& ys, ImU32 color, float thickness,
                      std::span<const double> breaks) {
  std::vector<double> txs(xs.size()), tys(ys.size()), tbreaks(breaks.size());
  for (size_t i = 0; i < xs.size(); ++i) txs[i] = ToAxis(plot.x_axis(), xs[i]);
  for (size_t i = 0; i < ys.size(); ++i) tys[i] = ToAxis(plot.y_axis(), ys[i]);
  for (size_t i = 0; i < breaks.size(); ++i) tbreaks[i] = ToAxis(plot.x_axis(), breaks[i]);
  LineT(plot, txs, tys, color, thickness, tbreaks);
}

void LineCanvas::LineT(const Plot& plot, std::span<const double> xs, std::span<const double> ys,
                       ImU32 color, float thickness, std::span<const double> breaks) {
  const ImVec2 o = plot.inner().Min;
  const size_t n = std::min(xs.size(), ys.size());
  // Dense stretches (consecutive points at most one pixel column apart: M4 output) are drawn
  // Tracy-style as one solid vertical span per pixel column covering the column's points and
  // the join from the previous column. That is the pixel set of the polyline, each pixel
  // written once per series (no double blending of translucent lines), and it costs a few
  // pixel writes per column where anti-aliased segments cost three times as many blends.
  const float pad = std::max(0.0f, (thickness - 1.0f) / 2);
  int col = std::numeric_limits<int>::min();
  float col_lo = 0, col_hi = 0;
  auto flush = [&]() {
    if (col == std::numeric_limits<int>::min()) return;
    Span(col, static_cast<int>(std::floor(col_lo - pad)),
         static_cast<int>(std::floor(col_hi + pad)), color);
    col = std::numeric_limits<int>::min();
  };
  // For a plot being saved as SVG: the same polyline in screen pixels, split at the breaks.
  const bool record = plot.recording() != nullptr;
  auto record_break = [&]() {
    if (record && !recorded_.empty() && recorded_.back().kind == Recorded::kPolyline &&
        !recorded_.back().points.empty())
      recorded_.push_back({Recorded::kPolyline, {}, color, thickness});
  };
  if (record) recorded_.push_back({Recorded::kPolyline, {}, color, thickness});
  bool have = false;
  ImVec2 prev;
  size_t next_break = 0;
  for (size_t i = 0; i < n; ++i) {
    // A gap between the previous point and this one: start a new polyline.
    bool gap = false;
    // (A NaN break, a non-positive x on a log axis, is passed over; a NaN point waits.)
    while (std::isfinite(xs[i]) && next_break < breaks.size() && !(breaks[next_break] > xs[i])) {
      gap = gap || (i > 0 && xs[i - 1] < breaks[next_break]);
      ++next_break;
    }
    ImVec2 p = plot.ToPixelT(xs[i], ys[i]);
    if (record) {
      if (gap || !std::isfinite(p.x) || !std::isfinite(p.y)) record_break();
      if (std::isfinite(p.x) && std::isfinite(p.y)) recorded_.back().points.push_back(p);
    }
    if (gap || !std::isfinite(p.x) || !std::isfinite(p.y)) {
      flush();
      have = false;
      if (gap && std::isfinite(p.x) && std::isfinite(p.y)) {
        // This point starts the next stretch (an isolated point stays a one-pixel mark).
        p = ImVec2(std::clamp(p.x - o.x, -4.0f * w_, 5.0f * w_),
                   std::clamp(p.y - o.y, -4.0f * h_, 5.0f * h_));
        col = static_cast<int>(std::floor(p.x));
        col_lo = col_hi = p.y;
        prev = p;
        have = true;
      }
      continue;
    }
    p = ImVec2(std::clamp(p.x - o.x, -4.0f * w_, 5.0f * w_),
               std::clamp(p.y - o.y, -4.0f * h_, 5.0f * h_));
    if (have && std::abs(p.x - prev.x) <= 1.0f) {
      const int x = static_cast<int>(std::floor(p.x));
      if (x != col) {
        flush();
        col = x;
        col_lo = col_hi = prev.y;
      }
      col_lo = std::min(col_lo, p.y);
      col_hi = std::max(col_hi, p.y);
    } else {
      flush();
      // Skip segments wholly outside the canvas (they come from the off-screen neighbours).
      if (have && !((p.x < 0 && prev.x < 0) || (p.x >= w_ && prev.x >= w_) ||
                    (p.y < 0 && prev.y < 0) || (p.y >= h_ && prev.y >= h_))) {
        Segment(prev.x, prev.y, p.x, p.y, color, thickness);
      }
    }
    prev = p;
    have = true;
  }
  flush();
}

void LineCanvas::Band(const Plot& plot, const std::vector<double>& xs,
                      const std::vector<double>& lo, const std::vector<double>& hi, ImU32 color) {
  const ImVec2 o = plot.inner().Min;
  for (size_t i = 0; i < xs.size(); ++i) {
    const ImVec2 a = plot.ToPixel(xs[i], lo[i]), b = plot.ToPixel(xs[i], hi[i]);
    if (!std::isfinite(a.x) || !std::isfinite(a.y) || !std::isfinite(b.y)) continue;
    const int x = static_cast<int>(a.x - o.x);
    const int y0 = std::clamp(static_cast<int>(std::min(a.y, b.y) - o.y), 0, h_ - 1);
    const int y1 = std::clamp(static_cast<int>(std::max(a.y, b.y) - o.y), 0, h_ - 1);
    Span(x, y0, y1, color);
    if (plot.recording()) recorded_.push_back({Recorded::kPolyline, {a, b}, color, 1.0f});
  }
}

void LineCanvas::Dot(const Plot& plot, double x, double y, ImU32 color, float radius) {
  const ImVec2 p = plot.ToPixel(x, y);
  if (!std::isfinite(p.x) || !std::isfinite(p.y)) return;
  // Coverage comes from stamps built once per radius (a hypot per pixel made the 10k evaluation
  // dots of 100 runs the most expensive part of a validation-loss panel), one per quarter-pixel
  // centre offset: discs snapped to whole pixels step along a sloped line.
  constexpr int kSub = 4;
  const int side = 2 * stamp_r_ + 1;
  if (radius != stamp_radius_) {
    stamp_radius_ = radius;
    stamp_r_ = static_cast<int>(std::ceil(radius + 1.5f));
    const int sd = 2 * stamp_r_ + 1;
    stamp_.assign(static_cast<size_t>(kSub * kSub) * sd * sd, 0.0f);
    for (int sy = 0; sy < kSub; ++sy) {
      for (int sx = 0; sx < kSub; ++sx) {
        float* st = stamp_.data() + static_cast<size_t>(sy * kSub + sx) * sd * sd;
        const float ox = (sx + 0.5f) / kSub, oy = (sy + 0.5f) / kSub;
        for (int dy = -stamp_r_; dy <= stamp_r_; ++dy) {
          for (int dx = -stamp_r_; dx <= stamp_r_; ++dx) {
            const float d = std::hypot(dx + 0.5f - ox, dy + 0.5f - oy);
            st[(dy + stamp_r_) * sd + dx + stamp_r_] = std::clamp(radius + 0.5f - d, 0.0f, 1.0f);
          }
        }
      }
    }
    return Dot(plot, x, y, color, radius);
  }
  if (plot.recording()) recorded_.push_back({Recorded::kCircle, {p}, color, radius});
  const float fx = p.x - plot.inner().Min.x, fy = p.y - plot.inner().Min.y;
  const int cx = static_cast<int>(std::floor(fx)), cy = static_cast<int>(std::floor(fy));
  if (cx < -stamp_r_ || cy < -stamp_r_ || cx >= w_ + stamp_r_ || cy >= h_ + stamp_r_) return;
  const int sx = std::clamp(static_cast<int>((fx - cx) * kSub), 0, kSub - 1),
            sy = std::clamp(static_cast<int>((fy - cy) * kSub), 0, kSub - 1);
  const float* st = stamp_.data() + static_cast<size_t>(sy * kSub + sx) * side * side;
  for (int dy = -stamp_r_; dy <= stamp_r_; ++dy) {
    for (int dx = -stamp_r_; dx <= stamp_r_; ++dx) {
      Blend(cx + dx, cy + dy, color, st[(dy + stamp_r_) * side + dx + stamp_r_]);
    }
  }
}

void LineCanvas::FillBetween(const Plot& plot, const std::vector<double>& xs,
                             const std::vector<double>& lo, const std::vector<double>& hi,
                             ImU32 color) {
  const ImVec2 o = plot.inner().Min;
  if (plot.recording()) {
    Recorded poly{Recorded::kPolygon, {}, color, 0};
    for (size_t i = 0; i < xs.size(); ++i) {
      const ImVec2 p = plot.ToPixel(xs[i], hi[i]);
      if (std::isfinite(p.x) && std::isfinite(p.y)) poly.points.push_back(p);
    }
    for (size_t i = xs.size(); i-- > 0;) {
      const ImVec2 p = plot.ToPixel(xs[i], lo[i]);
      if (std::isfinite(p.x) && std::isfinite(p.y)) poly.points.push_back(p);
    }
    recorded_.push_back(std::move(poly));
  }
  for (size_t i = 1; i < xs.size(); ++i) {
    const ImVec2 a0 = plot.ToPixel(xs[i - 1], lo[i - 1]), a1 = plot.ToPixel(xs[i], lo[i]);
    const ImVec2 b0 = plot.ToPixel(xs[i - 1], hi[i - 1]), b1 = plot.ToPixel(xs[i], hi[i]);
    if (!std::isfinite(a0.x + a1.x + a0.y + a1.y + b0.y + b1.y)) continue;
    const int x0 = std::max(0, static_cast<int>(a0.x - o.x)),
              x1 = std::min(w_ - 1, static_cast<int>(a1.x - o.x));
    for (int x = x0; x <= x1; ++x) {
      const float t = a1.x > a0.x ? std::clamp((x + o.x - a0.x) / (a1.x - a0.x), 0.0f, 1.0f) : 0.0f;
      float ya = a0.y + (a1.y - a0.y) * t - o.y, yb = b0.y + (b1.y - b0.y) * t - o.y;
      if (ya > yb) std::swap(ya, yb);
      const int y0 = std::max(0, static_cast<int>(ya)), y1 = std::min(h_ - 1, static_cast<int>(yb));
      // Each column once: skip the shared end column of the previous segment.
      if (i > 1 && x == x0 && x0 > 0) continue;
      for (int y = y0; y <= y1; ++y) Blend(x, y, color, 1.0f);
    }
  }
}

void LineCanvas::End(const Plot& plot) {
  if (PlotRecording* rec = plot.recording()) {
    // SVG paints in order: back to front.
    if (under_) std::reverse(recorded_.begin(), recorded_.end());
    for (const Recorded& r : recorded_) {
      switch (r.kind) {
        case Recorded::kPolyline:
          rec->Polyline(PlotRecording::kData, r.points, r.color, r.size);
          break;
        case Recorded::kPolygon:
          rec->Polygon(PlotRecording::kData, r.points, r.color);
          break;
        case Recorded::kCircle:
          rec->Circle(PlotRecording::kData, r.points[0], r.size, r.color);
          break;
      }
    }
    recorded_.clear();
  }
  if (dirty_) {
    for (uint32_t& p : px_) {
      const uint32_t a = p >> 24;
      if (a == 0 || a == 255) continue;
      auto un = [a](uint32_t v) { return std::min<uint32_t>(255, (v * 255 + a / 2) / a); };
      p = un(p & 0xFF) | (un((p >> 8) & 0xFF) << 8) | (un((p >> 16) & 0xFF) << 16) | (a << 24);
    }
    tex_.Upload(h_, w_, px_.data());  // transposed: a texture row per canvas column
    dirty_ = false;
    cost_ms_ =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - raster_start_)
            .count();
  }
  // The texture is the canvas transposed: u runs down the canvas, v across it.
  auto draw = [&](ImVec2 a, ImVec2 b) {
    plot.draw_list()->AddImageQuad(tex_.id(), a, ImVec2(b.x, a.y), b, ImVec2(a.x, b.y),
                                   ImVec2(0, 0), ImVec2(0, 1), ImVec2(1, 1), ImVec2(1, 0));
  };
  if (deferred_) {
    // The old picture where its axis ranges lie now (the plot's clip rect trims it).
    draw(plot.ToPixelT(tx0_, ty1_), plot.ToPixelT(tx1_, ty0_));
    return;
  }
  const ImVec2 o = plot.inner().Min;
  draw(o, ImVec2(o.x + w_, o.y + h_));
}

void ColorBar(float width, float height, double vmin, double vmax) {
  ImDrawList* dl = ImGui::GetWindowDrawList();
  const ImVec2 p = ImGui::GetCursorScreenPos();
  const int steps = 32;
  const std::string lo = FormatValue(vmin), hi = FormatValue(vmax);
  const float lw = ImGui::CalcTextSize(lo.c_str()).x + 6;
  for (int i = 0; i < steps; ++i) {
    const float x0 = p.x + lw + width * i / steps, x1 = p.x + lw + width * (i + 1) / steps;
    dl->AddRectFilled(ImVec2(x0, p.y), ImVec2(x1 + 0.5f, p.y + height),
                      ToImU32(Viridis((i + 0.5) / steps)));
  }
  const ImU32 text = ImGui::GetColorU32(ImGuiCol_Text);
  dl->AddText(ImVec2(p.x, p.y + (height - ImGui::GetFontSize()) / 2), text, lo.c_str());
  dl->AddText(ImVec2(p.x + lw + width + 6, p.y + (height - ImGui::GetFontSize()) / 2), text,
              hi.c_str());
  ImGui::Dummy(ImVec2(lw + width + 12 + ImGui::CalcTextSize(hi.c_str()).x, height));
}

}  // namespace moelab::gui
