// The logits view of moelab-gui (App::*View and its helpers).
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

// ---- Max logits -----------------------------------------------------------------------------

namespace {

// A heatmap cell's value with as many significant digits (3 at most) as fit `width` pixels.
std::string CellLabel(float v, float width) {
  for (int digits = 3; digits > 1; --digits) {
    const std::string s = SignificantDigits(v, digits);
    if (ImGui::CalcTextSize(s.c_str()).x <= width) return s;
  }
  return SignificantDigits(v, 1);
}

// The heatmap of one recorded step: layers (rows) x heads (columns) with values when the cells
// are large enough, heads above τ outlined, a tooltip per cell and the colour scale.
void DrawLogitHeatmap(const LogitData& d, int shown_idx, double step, std::optional<double> tau,
                      double vmin, double vmax, float width) {
  const LogitData* data = &d;
  const int L = d.layers, H = d.heads;
  const double tau_value = tau.value_or(0.0);
  const float fh = ImGui::GetFontSize();
  const float label_w = fh * 2.5f;
  const float cell_w = std::max(4.0f, (width - label_w) / H);
  const float cell_h = std::clamp(cell_w * 0.6f, 6.0f, fh * 1.5f);
  ImDrawList* dl = ImGui::GetWindowDrawList();
  const ImVec2 origin = ImGui::GetCursorScreenPos();
  const float* mat = data->values.data() + static_cast<size_t>(shown_idx) * L * H;
  ImGui::TextDisabled("S_max per layer (rows) and head (columns)");
  const ImVec2 o(origin.x, origin.y + fh * 1.3f);
  int hovered_l = -1, hovered_h = -1;
  const ImVec2 mouse = ImGui::GetIO().MousePos;
  for (int l = 0; l < L; ++l) {
    char lbl[16];
    std::snprintf(lbl, sizeof(lbl), "L%d", l);
    DrawListText(dl, ImVec2(o.x, o.y + l * cell_h + (cell_h - fh) / 2),
                 ImGui::GetColorU32(ImGuiCol_TextDisabled), lbl);
    for (int h = 0; h < H; ++h) {
      const float v = mat[l * H + h];
      const Rgba bg = HeatColor(v, vmin, vmax);
      const ImVec2 a(o.x + label_w + h * cell_w, o.y + l * cell_h);
      const ImVec2 b(a.x + cell_w - 1, a.y + cell_h - 1);
      dl->AddRectFilled(a, b, ToImU32(bg));
      if (tau && v > tau_value) dl->AddRect(a, b, kTauColor, 0, 0, 2.0f);
      if (cell_w >= fh * 2.4f && cell_h >= fh) {
        // Three significant digits (29.7 and 30 differ where τ = 30), as far as the cell fits.
        const std::string txt = CellLabel(v, cell_w - 4);
        const float tw = ImGui::CalcTextSize(txt.c_str()).x;
        dl->AddText(ImVec2(a.x + (cell_w - tw) / 2, a.y + (cell_h - fh) / 2),
                    ToImU32(ContrastText(bg)), txt.c_str());
      }
      if (mouse.x >= a.x && mouse.x < b.x + 1 && mouse.y >= a.y && mouse.y < b.y + 1) {
        hovered_l = l;
        hovered_h = h;
      }
    }
  }
  for (int h = 0; h < H; h += std::max(1, static_cast<int>(fh * 2 / cell_w))) {
    char lbl[16];
    std::snprintf(lbl, sizeof(lbl), "h%d", h);
    DrawListText(dl, ImVec2(o.x + label_w + h * cell_w + 1, o.y + L * cell_h + 1),
                 ImGui::GetColorU32(ImGuiCol_TextDisabled), lbl);
  }
  ImGui::Dummy(ImVec2(width, fh * 1.3f + L * cell_h + fh * 1.2f));
  if (hovered_l >= 0 && ImGui::IsWindowHovered()) {
    ImGui::SetTooltip("layer %d, head %d at step %lld: S_max = %s", hovered_l, hovered_h,
                      static_cast<long long>(step),
                      FormatValue(mat[hovered_l * H + hovered_h]).c_str());
  }
  ColorBar(std::min(200.0f, width * 0.4f), fh, vmin, vmax);
}

}  // namespace

void App::LogitColumn(int column, int64_t run, double vmin, double vmax, float width) {
  ImGui::BeginGroup();
  ImGui::PushID(column);
  const RunEntry* entry = runs_->Find(run);
  auto data = store_->Logits(run);
  if (!data) frame_settled_ = false;
  // Run chooser.
  ImGui::SetNextItemWidth(width * 0.6f);
  if (ImGui::BeginCombo("run", RunLabel(run).c_str())) {
    for (const auto& r : runs_->runs) {
      if (r->row.shape.layers <= 0) continue;
      if (ImGui::Selectable(RunLabel(r->row.id).c_str(), r->row.id == run)) {
        logits_.runs[column] = r->row.id;
        logits_.step.erase(column);
      }
    }
    ImGui::EndCombo();
  }
  const std::optional<double> tau = entry ? entry->tau : std::nullopt;
  // A plain copy: GCC 12 reports the optional as maybe-uninitialized when dereferenced here.
  const double tau_value = tau.value_or(0.0);
  ImGui::SameLine();
  if (tau) {
    ImGui::TextColored(ImGui::ColorConvertU32ToFloat4(kTauColor), "QK-Clip \xcf\x84 = %s",
                       FormatValue(tau_value).c_str());
  } else {
    ImGui::TextDisabled("QK-Clip off");
  }
  if (!data || data->steps.empty()) {
    ImGui::TextDisabled(data ? "no max-logit records for this run" : "loading...");
    ImGui::PopID();
    ImGui::EndGroup();
    return;
  }
  if (data->layers <= 0 || data->heads <= 0 ||
      data->values.size() != data->steps.size() * data->layers * data->heads) {
    ImGui::TextDisabled("max-logit records of this run have no usable shape");
    ImGui::PopID();
    ImGui::EndGroup();
    return;
  }
  auto& slot = logits_.caches[run];
  if (!slot) slot = std::make_unique<LogitCache>();
  LogitCache& c = *slot;
  const int L = data->layers, H = data->heads;
  const size_t n = data->steps.size();
  if (c.version != data->version) {
    c.version = data->version;
    c.layer_series.assign(L, std::vector<double>(n));
    for (size_t i = 0; i < n; ++i) {
      for (int l = 0; l < L; ++l) c.layer_series[l][i] = data->layer_max[i * L + l];
    }
    std::vector<int64_t> steps(n);
    for (size_t i = 0; i < n; ++i) steps[i] = static_cast<int64_t>(data->steps[i]);
    c.clip = ClipFraction(steps, data->clips, L, H);
    c.clip_steps.clear();
    for (const auto& e : data->clips) {
      if (c.clip_steps.empty() || c.clip_steps.back() != static_cast<double>(e.step)) {
        c.clip_steps.push_back(static_cast<double>(e.step));
      }
    }
    c.v_cols = 0;
  }

  // Step slider over the recorded steps.
  int& idx = logits_.step.try_emplace(column, -1).first->second;
  int shown_idx = idx < 0 ? static_cast<int>(n) - 1 : std::min(idx, static_cast<int>(n) - 1);
  ImGui::SetNextItemWidth(width * 0.6f);
  char fmt[64];
  std::snprintf(fmt, sizeof(fmt), "step %lld", static_cast<long long>(data->steps[shown_idx]));
  if (ImGui::SliderInt("##step", &shown_idx, 0, static_cast<int>(n) - 1, fmt)) idx = shown_idx;
  ImGui::SameLine();
  bool latest = idx < 0;
  if (ImGui::Checkbox("latest", &latest)) idx = latest ? -1 : shown_idx;
  const double step = data->steps[shown_idx];

  DrawLogitHeatmap(*data, shown_idx, step, tau, vmin, vmax, width);
  const float fh = ImGui::GetFontSize();

  // Timeline: per layer max over heads, τ, clip events, the slider's step.
  // The clip-fraction panel only where QK-Clip is on (or clips were recorded anyway): with it
  // off the panel could only ever be empty, so the timeline takes its space.
  const bool clip_panel = tau || !c.clip_steps.empty();
  const float plot_h =
      clip_panel ? std::max(140.0f, (ImGui::GetContentRegionAvail().y - fh * 1.5f) * 0.62f)
                 : std::max(140.0f, ImGui::GetContentRegionAvail().y - fh * 1.7f);
  const int cols = std::max(16, static_cast<int>(width - fh * 5.4f));
  PlotBounds fit;
  fit.AddX(data->steps.front());
  fit.AddX(data->steps.back());
  for (const auto& s : c.layer_series) {
    for (double v : s) fit.AddY(v);
  }
  if (tau) fit.AddY(tau_value);
  {
    Plot plot("timeline", ImVec2(width, plot_h), &logits_.x, &logits_.y[column], fit, false, false,
              "max over heads per layer" + std::string(tau ? ", \xcf\x84 and clip events" : ""),
              "step");
    const AxisMap& xa = plot.x_axis();
    if (c.v_cols != cols || c.v_lo != xa.lo || c.v_hi != xa.hi) {
      c.ds_x.resize(L);
      c.ds_y.resize(L);
      for (int l = 0; l < L; ++l)
        DownsampleM4(data->steps, c.layer_series[l], xa, cols, &c.ds_x[l], &c.ds_y[l]);
      DownsampleM4(c.clip.steps, c.clip.fraction, xa, cols, &c.clip_ds_x, &c.clip_ds_y);
      c.v_cols = cols;
      c.v_lo = xa.lo;
      c.v_hi = xa.hi;
    }
    Signature sig;
    sig.Add(c.version).Add(c.v_cols);
    LineCanvas& canvas = Canvas("timeline" + std::to_string(column));
    if (canvas.Begin(plot, Signature().Add(run).h, sig.h)) {
      for (int l = 0; l < L; ++l)
        canvas.Line(plot, c.ds_x[l], c.ds_y[l], ToImU32(GroupColor(l, L, true)), 1.6f);
    }
    canvas.End(plot);
    if (tau) plot.HLine(tau_value, kTauColor, true, "\xcf\x84");
    float last_px = -1e9f;
    for (double s : c.clip_steps) {
      const float px = plot.ToPixel(s, 0).x;
      if (px - last_px < 1.0f) continue;  // one tick per pixel column
      last_px = px;
      plot.BottomTick(s, kTauColor, 8.0f);
    }
    plot.VLine(step, IM_COL32(255, 255, 255, 110));
    if (plot.hovered()) LayerTooltip(data->steps, plot.mouse_x(), c.layer_series, "layer");
  }
  // Layer legend.
  for (int l = 0; l < L; ++l) {
    if (l > 0) ImGui::SameLine(0, 6);
    ImGui::TextColored(ImGui::ColorConvertU32ToFloat4(ToImU32(GroupColor(l, L, true))), "L%d", l);
  }
  if (!clip_panel) {
    ImGui::PopID();
    ImGui::EndGroup();
    return;
  }
  PlotBounds cf;
  cf.AddX(data->steps.front());
  cf.AddX(data->steps.back());
  cf.AddY(0);
  for (double v : c.clip.fraction) cf.AddY(v);
  cf.AddY(std::max(cf.y_hi, 0.05));
  {
    Plot plot("clipfrac", ImVec2(width, -1), &logits_.x, &logits_.clip_y[column], cf, false, false,
              "fraction of heads clipped", "step");
    Signature sig;
    sig.Add(c.version).Add(c.v_cols);
    LineCanvas& canvas = Canvas("clipfrac" + std::to_string(column));
    if (canvas.Begin(plot, Signature().Add(run).h, sig.h))
      canvas.Line(plot, c.clip_ds_x, c.clip_ds_y, kTauColor, 1.6f);
    canvas.End(plot);
    if (c.clip.steps.empty()) {
      plot.draw_list()->AddText(plot.inner().GetCenter(), ImGui::GetColorU32(ImGuiCol_TextDisabled),
                                "no clip events");
    }
  }
  ImGui::PopID();
  ImGui::EndGroup();
}

void App::LogitsView() {
  // A column per selected run with max-logit records (selected runs without them are named
  // with the reason); with nothing selected, two: the first two such runs. A column's combo
  // overrides its run.
  const auto has_layers = [](const db::RunShape& s) { return s.layers > 0; };
  const std::vector<int64_t> candidates = RunsWithShape(has_layers);
  std::vector<int64_t> selected, absent;
  SplitSelection(has_layers, &selected, &absent);
  if (logits_.selection != selection_) {
    logits_.selection = selection_;
    logits_.runs.clear();
    logits_.step.clear();
  }
  AbsentRuns(absent, "no max logits recorded");
  if (candidates.empty()) {
    ImGui::TextDisabled("No run records per-head max logits yet.");
    return;
  }
  std::vector<int64_t> shown = selected;
  if (shown.empty()) {
    shown.push_back(candidates[0]);
    if (candidates.size() > 1 || logits_.runs.count(1)) {
      shown.push_back(candidates[std::min<size_t>(1, candidates.size() - 1)]);
    }
  }
  const int columns = static_cast<int>(shown.size());
  for (int c = 0; c < columns; ++c) {
    auto it = logits_.runs.find(c);
    if (it != logits_.runs.end() && runs_->Find(it->second)) shown[c] = it->second;
  }
  // One colour scale for every run, so equal colours mean equal logits.
  double vmin = INFINITY, vmax = -INFINITY;
  for (int c = 0; c < columns; ++c) {
    auto d = store_->Logits(shown[c]);
    if (!d) continue;
    auto& slot = logits_.caches[shown[c]];
    if (!slot) slot = std::make_unique<LogitCache>();
    if (slot->range_version != d->version) {
      // Scanning every matrix is O(steps × layers × heads): once per new snapshot only.
      slot->range_version = d->version;
      slot->vmin = INFINITY;
      slot->vmax = -INFINITY;
      for (float v : d->values) {
        if (std::isfinite(v)) {
          slot->vmin = std::min(slot->vmin, v);
          slot->vmax = std::max(slot->vmax, v);
        }
      }
    }
    vmin = std::min<double>(vmin, slot->vmin);
    vmax = std::max<double>(vmax, slot->vmax);
  }
  if (!std::isfinite(vmin)) vmin = vmax = 0;
  // Columns share the width down to a readable minimum; more runs scroll sideways.
  const float sp = ImGui::GetStyle().ItemSpacing.x * 2;
  const float avail = ImGui::GetContentRegionAvail().x;
  const float min_w = ImGui::GetFontSize() * 22;
  const float width = std::max(min_w, (avail - sp * (columns - 1)) / columns);
  ImGui::BeginChild("logit columns", ImVec2(0, 0), false, ImGuiWindowFlags_HorizontalScrollbar);
  for (int c = 0; c < columns; ++c) {
    if (c > 0) ImGui::SameLine(0, sp);
    LogitColumn(c, shown[c], vmin, vmax, width);
  }
  ImGui::EndChild();
}

}  // namespace moelab::gui
