// The curves view of moelab-gui (App::*View and its helpers).
#include <imgui.h>
#include <imgui_internal.h>
#include <imgui_stdlib.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <numeric>

#include "gui/app.h"
#include "gui/app_internal.h"
#include "gui/widgets.h"

namespace moelab::gui {

// ---- Curves ---------------------------------------------------------------------------------

std::vector<App::CurveShown> App::PrepareCurves(int metric, const std::vector<int64_t>& runs,
                                                PlotBounds* x_extent) {
  const MetricDef& m = kMetrics[metric];
  const int xk = settings_.x_axis;
  const float smoothing = m.smoothed ? settings_.smoothing : 0.0f;
  std::vector<CurveShown> shown;
  for (int64_t run : runs) {
    auto y = store_->Series(run, m.key);
    std::shared_ptr<const SeriesData> x;
    if (xk != 0) x = store_->Series(run, m.eval ? kXEvalKeys[xk] : kXKeys[xk]);
    if (!y || (xk != 0 && !x)) {
      frame_settled_ = false;
      continue;
    }
    auto& slot = curves_view_.caches[{run, metric}];
    if (!slot) slot = std::make_unique<CurveCache>();
    CurveCache& c = *slot;
    if (c.y_version != y->version || c.y_src != y || c.x_kind != xk ||
        (x && (c.x_version != x->version || c.x_src != x)) || c.smoothing != smoothing) {
      c.y_src = y;
      c.x_src = x;
      c.y_version = y->version;
      c.x_version = x ? x->version : 0;
      c.x_kind = xk;
      c.smoothing = smoothing;
      const size_t n = x ? std::min(x->values.size(), y->values.size()) : y->values.size();
      if (x) {
        c.xs.assign(x->values.begin(), x->values.begin() + n);
        if (xk == 3 && n > 0) {
          // Wall time as seconds since the run's first record, so runs started at different
          // times line up.
          const double t0 = c.xs.front();
          for (double& v : c.xs) v -= t0;
        }
      } else {
        c.xs.assign(y->steps.begin(), y->steps.begin() + n);
      }
      c.smooth = DebiasedEma(std::span<const double>(y->values.data(), n), smoothing);
      // Missing steps are gaps in the line, whatever the x axis: the breaks are found on the
      // steps and placed at the x of the first point after each gap.
      c.breaks.clear();
      for (size_t i : GapStarts(std::span<const double>(y->steps.data(), n)))
        c.breaks.push_back(c.xs[i]);
      c.extent = PlotBounds{};
      for (size_t i = 0; i < n; ++i) c.extent.Add(c.xs[i], c.smooth[i]);
      c.pyramid.Build(c.smooth);
      c.raw_pyramid = MinMaxPyramid{};
      c.v_cols = 0;  // force a new downsample
      c.t_gen = ~uint64_t{0};
    }
    x_extent->AddX(c.extent.x_lo);
    x_extent->AddX(c.extent.x_hi);
    shown.push_back({run, &c});
  }
  return shown;
}

void App::CurvePanels(const std::vector<int>& metrics, const char* id_prefix,
                      const std::vector<int64_t>& runs, ImVec2 size, int ncol, AxisState* x,
                      AxisState* const* y) {
  std::vector<std::vector<CurveShown>> shown(metrics.size());
  PlotBounds x_extent;
  for (size_t i = 0; i < metrics.size(); ++i) shown[i] = PrepareCurves(metrics[i], runs, &x_extent);
  for (size_t i = 0; i < metrics.size(); ++i) {
    if (i % ncol != 0) ImGui::SameLine();
    const std::string id = std::string(id_prefix) + kMetrics[metrics[i]].key;
    CurvePanel(id.c_str(), metrics[i], shown[i], runs.empty(), size, x_extent, x, y[i]);
  }
}

void App::CurvePanel(const char* id, int metric, const std::vector<CurveShown>& shown, bool no_runs,
                     ImVec2 size, const PlotBounds& x_extent, AxisState* x_state,
                     AxisState* y_state) {
  const MetricDef& m = kMetrics[metric];
  const int xk = settings_.x_axis;
  const float smoothing = m.smoothed ? settings_.smoothing : 0.0f;
  const bool log_x = settings_.log_x;
  const bool log_y = settings_.log_y && metric != 4;

  // Resolve x here (before the Plot) so y can auto-fit to what is visible.
  const float fh = ImGui::GetFontSize();
  const int cols = std::max(16, static_cast<int>(size.x - fh * 5.4f));
  AxisMap xa;
  if (x_state->auto_fit || !(x_state->hi > x_state->lo)) {
    xa = {x_extent.x_lo, x_extent.x_hi, log_x};
    if (log_x && !(xa.lo > 0)) xa.lo = std::max(1.0, xa.hi * 1e-4);
    PadRange(&xa.lo, &xa.hi, log_x, 0.0);
  } else {
    xa = {x_state->lo, x_state->hi, log_x};
  }
  PlotBounds fit;
  fit.AddX(xa.lo);
  fit.AddX(xa.hi);
  // Beyond a few runs the faint raw lines are a grey blur that doubles the drawing cost.
  const bool raw = settings_.show_raw && smoothing > 0 && shown.size() <= kMaxRawRuns;
  // Refinement over frames: this panel's share of the frame's decimation budget (what earlier
  // panels left, split over the panels still to draw), spent round robin from where the last
  // frame stopped, so during a long zoom every series is refined in turn. Past the budget a
  // series keeps its previous decimation (right place, coarser detail). At least one series
  // is refined per panel and frame, so refinement always ends.
  const Clock::time_point panel_start = Clock::now();
  const Clock::time_point ds_deadline =
      panel_start + std::max(Clock::duration::zero(), downsample_deadline_ - panel_start) /
                        std::max(1, curves_view_.panels_left);
  curves_view_.panels_left = std::max(0, curves_view_.panels_left - 1);
  size_t& turn = curves_view_.refine_turn[metric];
  int refined = 0;
  bool stopped = false;
  for (size_t k = 0; k < shown.size(); ++k) {
    const size_t idx = (turn + k) % shown.size();
    CurveCache& c = *shown[idx].cache;
    const bool stale = c.v_cols != cols || c.v_lo != xa.lo || c.v_hi != xa.hi || c.v_log != log_x ||
                       c.v_raw != raw;
    if (!stale) continue;
    if (refined > 0 && !c.ds_x.empty() && (stopped || Clock::now() > ds_deadline)) {
      if (!stopped) turn = idx;
      stopped = true;
      frame_settled_ = false;
      continue;
    }
    const double t0 = ThreadCpuMs();
    ++profile_.downsamples;
    ++refined;
    DownsampleM4Pyramid(c.xs, c.smooth, c.pyramid, xa, cols, &c.ds_x, &c.ds_y);
    if (raw) {
      const std::span<const double> values(c.y_src->values.data(), c.xs.size());
      if (c.raw_pyramid.size() != values.size()) c.raw_pyramid.Build(values);
      DownsampleM4Pyramid(c.xs, values, c.raw_pyramid, xa, cols, &c.raw_x, &c.raw_y);
    } else {
      c.raw_x.clear();
      c.raw_y.clear();
    }
    c.v_cols = cols;
    c.v_lo = xa.lo;
    c.v_hi = xa.hi;
    c.v_log = log_x;
    c.v_raw = raw;
    ++c.ds_gen;
    profile_.downsample_ms += ThreadCpuMs() - t0;
  }
  if (stopped) ++profile_.stale_panels;
  for (auto& s : shown) {
    CurveCache& c = *s.cache;
    if (c.fit_gen != c.ds_gen || c.fit_x_lo != xa.lo || c.fit_x_hi != xa.hi || c.fit_log != log_y) {
      c.fit_y = PlotBounds{};
      // Every series, every zoom frame: a tight loop (NaN fails both comparisons).
      double lo = INFINITY, hi = -INFINITY;
      const double floor_y = log_y ? 0.0 : -INFINITY;
      for (size_t i = 0; i < c.ds_x.size(); ++i) {
        const double x = c.ds_x[i], y = c.ds_y[i];
        if (x >= xa.lo && x <= xa.hi && y > floor_y && y < INFINITY) {
          lo = std::min(lo, y);
          hi = std::max(hi, y);
        }
      }
      c.fit_y.AddY(lo);
      c.fit_y.AddY(hi);
      c.fit_gen = c.ds_gen;
      c.fit_x_lo = xa.lo;
      c.fit_x_hi = xa.hi;
      c.fit_log = log_y;
    }
    if (c.fit_y.y_lo <= c.fit_y.y_hi) {
      fit.AddY(c.fit_y.y_lo);
      fit.AddY(c.fit_y.y_hi);
    }
  }

  Plot plot(id, size, x_state, y_state, fit, log_x, log_y, m.title, kXNames[xk]);
  if (shown.empty()) {
    const char* msg = no_runs ? "no runs" : "loading...";
    plot.draw_list()->AddText(plot.inner().GetCenter(), ImGui::GetColorU32(ImGuiCol_TextDisabled),
                              msg);
    return;
  }
  Signature ident, content;
  ident.Add(log_x).Add(log_y).Add(raw).Add(xk).Add(smoothing);
  for (auto& s : shown) {
    ident.Add(s.run).Add(colors_[s.run]);
    content.Add(s.cache).Add(s.cache->ds_gen);
  }
  LineCanvas& canvas = Canvas(id);
  const double raster0 = ThreadCpuMs();
  // An overdue picture is redrawn whatever the budget; the others only while the budget
  // minus what the overdue ones still to come will cost (reserve_ms) lasts.
  const bool overdue = canvas.overdue();
  const double overdue_cost = canvas.cost_ms();
  const bool may_defer = Clock::now() + std::chrono::microseconds(
                                            static_cast<int64_t>(1000 * curves_view_.reserve_ms)) >
                         canvas_deadline_;
  if (canvas.Begin(plot, ident.h, content.h, may_defer)) {
    ++profile_.rasters;
    // Front to back (topmost first): the last run's dots and line, ..., the first run's, then
    // the faint raw lines behind them all.
    canvas.FrontToBack();
    for (auto it = shown.rbegin(); it != shown.rend(); ++it) {
      CurveCache& c = *it->cache;
      const ImU32 color = colors_[it->run];
      // Evaluations are sparse: mark each point so a single evaluation is visible, but only
      // while the marks stay apart. Dots a few pixels apart merge into a beaded band whose
      // edge steps with the dots (the "staircase" of a dense validation line).
      if (m.eval &&
          static_cast<float>(c.ds_x.size()) * kMinDotSpacingPx < plot.inner().GetWidth()) {
        for (size_t i = 0; i < c.ds_x.size(); ++i)
          canvas.Dot(plot, c.ds_x[i], c.ds_y[i], color, 2.6f);
      }
      if (c.t_gen != c.ds_gen || c.t_log_x != log_x || c.t_log_y != log_y) {
        // Axis coordinates once per decimation, not a log10 per point per redraw.
        const AxisMap &xm = plot.x_axis(), &ym = plot.y_axis();
        c.ds_tx.resize(c.ds_x.size());
        c.ds_ty.resize(c.ds_y.size());
        for (size_t i = 0; i < c.ds_x.size(); ++i) c.ds_tx[i] = ToAxis(xm, c.ds_x[i]);
        for (size_t i = 0; i < c.ds_y.size(); ++i) c.ds_ty[i] = ToAxis(ym, c.ds_y[i]);
        c.breaks_t.resize(c.breaks.size());
        for (size_t i = 0; i < c.breaks.size(); ++i) c.breaks_t[i] = ToAxis(xm, c.breaks[i]);
        c.t_gen = c.ds_gen;
        c.t_log_x = log_x;
        c.t_log_y = log_y;
      }
      canvas.LineT(plot, c.ds_tx, c.ds_ty, color, m.eval ? 2.0f : 1.6f, c.breaks_t);
    }
    for (auto it = shown.rbegin(); it != shown.rend(); ++it) {
      if (!it->cache->raw_x.empty()) {
        canvas.Line(plot, it->cache->raw_x, it->cache->raw_y,
                    (colors_[it->run] & 0x00FFFFFF) | 0x50000000, 1.0f, it->cache->breaks);
      }
    }
  }
  canvas.End(plot);
  profile_.raster_ms += ThreadCpuMs() - raster0;
  if (overdue) curves_view_.reserve_ms = std::max(0.0, curves_view_.reserve_ms - overdue_cost);
  if (canvas.deferred()) {
    frame_settled_ = false;
    ++profile_.deferred_canvases;
  }
  if (plot.hovered()) {
    // Readout of every visible run at the cursor, highest value first.
    struct Row {
      double value, x;
      int64_t run;
    };
    std::vector<Row> rows;
    for (auto& s : shown) {
      const int64_t i = NearestIndexAtOrBefore(s.cache->xs, plot.mouse_x());
      if (i < 0) continue;
      const double v = s.cache->smooth[i];
      rows.push_back({v, s.cache->xs[i], s.run});
      plot.Marker(s.cache->xs[i], v, colors_[s.run], 3.5f);
    }
    std::sort(rows.begin(), rows.end(),
              [](const Row& a, const Row& b) { return a.value > b.value; });
    ImGui::BeginTooltip();
    ImGui::Text("%s at %s = %s", m.title, kXNames[xk], FormatValue(plot.mouse_x()).c_str());
    ImGui::Separator();
    const size_t limit = 30;
    for (size_t i = 0; i < rows.size() && i < limit; ++i) {
      ImGui::ColorButton("##c", ImGui::ColorConvertU32ToFloat4(colors_[rows[i].run]),
                         ImGuiColorEditFlags_NoTooltip, ImVec2(10, 10));
      ImGui::SameLine();
      ImGui::Text("%-10s  %s", FormatValue(rows[i].value).c_str(), RunLabel(rows[i].run).c_str());
    }
    if (rows.size() > limit) ImGui::TextDisabled("... %zu more", rows.size() - limit);
    ImGui::EndTooltip();
  }
}

void App::CurvesView() {
  const RunsSnapshot& rs = *runs_;
  ImGui::SetNextItemWidth(130);
  ImGui::Combo("x", &settings_.x_axis, kXNames, 4);
  ImGui::SameLine();
  ImGui::Checkbox("log x", &settings_.log_x);
  ImGui::SameLine();
  ImGui::Checkbox("log y", &settings_.log_y);
  ImGui::SameLine();
  ImGui::SetNextItemWidth(120);
  ImGui::SliderFloat("smoothing", &settings_.smoothing, 0.0f, 0.99f, "%.2f");
  HelpMarker(
      "Exponential moving average with debiasing (TensorBoard's): early points are not "
      "pulled towards zero. Applied to the full series before downsampling, so the "
      "smoothed line does not change with zoom. Train loss, grad norm and tokens/s only: the "
      "learning rate is a schedule and validation losses are averages already.");
  ImGui::SameLine();
  ImGui::Checkbox("raw", &settings_.show_raw);
  if (ImGui::IsItemHovered()) {
    ImGui::SetTooltip("Unsmoothed values drawn faintly behind the smoothed line (up to %zu runs).",
                      kMaxRawRuns);
  }
  ImGui::SameLine();
  ImGui::SetNextItemWidth(170);
  KeyCombo("colour by", &settings_.color_key, rs, "(one colour per run)");
  ImGui::SameLine();
  if (ImGui::Checkbox("follow live", &settings_.follow_live) && settings_.follow_live) {
    curves_view_.x.auto_fit = true;
    for (auto& y : curves_view_.y) y.auto_fit = true;
  }
  HelpMarker(
      "Follow live keeps every axis fitted to the data as it arrives. Mouse wheel zooms x "
      "(Shift+wheel: y), drag pans, double-click refits.");
  if (!curves_view_.x.auto_fit) settings_.follow_live = false;
  for (int i = 0; i < 5; ++i) {
    if (i > 0) ImGui::SameLine();
    bool on = settings_.panels[i] != 0;
    if (ImGui::Checkbox(kMetrics[i].title, &on)) settings_.panels[i] = on ? 1 : 0;
  }
  const std::vector<int64_t> runs = ShownRuns();
  AssignColors(runs);
  if (selection_.empty()) {
    ImGui::TextDisabled("Showing all %zu runs (select runs in the Runs view to narrow).",
                        runs.size());
  }
  Legend(runs);

  std::vector<int> panels;
  for (int i = 0; i < 5; ++i) {
    if (settings_.panels[i]) panels.push_back(i);
  }
  if (panels.empty()) return;
  const ImVec2 avail = ImGui::GetContentRegionAvail();
  const int ncol = panels.size() == 1 ? 1 : 2;
  const int nrow = (static_cast<int>(panels.size()) + ncol - 1) / ncol;
  const float sp = ImGui::GetStyle().ItemSpacing.x;
  const ImVec2 size(
      (avail.x - sp * (ncol - 1)) / ncol,
      std::max(120.0f, (avail.y - ImGui::GetStyle().ItemSpacing.y * (nrow - 1)) / nrow));
  // Once the axes rest (the zoom stopped), the plots show older pictures until refined and
  // every new decimation means a redraw anyway: decimation may use the whole budget.
  const bool resting =
      curves_view_.x.lo == curves_view_.last_x_lo && curves_view_.x.hi == curves_view_.last_x_hi;
  curves_view_.last_x_lo = curves_view_.x.lo;
  curves_view_.last_x_hi = curves_view_.x.hi;
  if (resting) downsample_deadline_ = std::max(downsample_deadline_, canvas_deadline_);
  curves_view_.panels_left = static_cast<int>(panels.size());
  curves_view_.reserve_ms = 0;
  for (int p : panels) {
    const LineCanvas& c = Canvas(kMetrics[p].key);
    if (c.overdue()) curves_view_.reserve_ms += c.cost_ms();
  }
  std::vector<AxisState*> ys;
  for (int p : panels) ys.push_back(&curves_view_.y[p]);
  CurvePanels(panels, "", runs, size, ncol, &curves_view_.x, ys.data());
}

}  // namespace moelab::gui
