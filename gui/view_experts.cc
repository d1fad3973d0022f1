// The experts view of moelab-gui (App::*View and its helpers).
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

namespace {

// Mean share of the layer's tokens per (time bin, expert) of each MoE layer over the steps in
// xa's range, and the first bin of each layer with a record (-1: none). Bins between sparser
// records repeat the previous bin so the strip stays solid. Returns the largest share.
double MeanSharePerBin(const ExpertData& d, const AxisMap& xa, int bins,
                       std::vector<std::vector<double>>* shares, std::vector<int>* first_bins) {
  const ExpertData* data = &d;
  const int L = d.moe_layers, E = d.experts;
  shares->assign(L, std::vector<double>(static_cast<size_t>(bins) * E, 0.0));
  std::vector<int>& first_bin = *first_bins;
  first_bin.assign(L, -1);
  std::vector<int> cnt(bins);
  double vmax = 0;
  const size_t i0 =
      std::lower_bound(data->steps.begin(), data->steps.end(), xa.lo) - data->steps.begin();
  const size_t i1 =
      std::upper_bound(data->steps.begin(), data->steps.end(), xa.hi) - data->steps.begin();
  for (int l = 0; l < L; ++l) {
    std::vector<double>& share = (*shares)[l];
    std::fill(cnt.begin(), cnt.end(), 0);
    for (size_t i = i0; i < i1; ++i) {
      const int b = std::clamp(static_cast<int>(xa.Forward(data->steps[i]) * bins), 0, bins - 1);
      const int64_t* row = data->counts.data() + (i * L + l) * static_cast<size_t>(E);
      double total = 0;
      for (int e = 0; e < E; ++e) total += static_cast<double>(row[e]);
      if (total <= 0) continue;
      for (int e = 0; e < E; ++e) share[static_cast<size_t>(b) * E + e] += row[e] / total;
      ++cnt[b];
    }
    int last = -1;
    for (int b = 0; b < bins; ++b) {
      if (cnt[b] > 0 && first_bin[l] < 0) first_bin[l] = b;
      if (cnt[b] == 0) {
        // Records sparser than the bins: repeat the previous bin so the strip stays solid.
        if (last >= 0)
          std::copy_n(&share[static_cast<size_t>(last) * E], E, &share[static_cast<size_t>(b) * E]);
        continue;
      }
      last = b;
      for (int e = 0; e < E; ++e) {
        share[static_cast<size_t>(b) * E + e] /= cnt[b];
        vmax = std::max(vmax, share[static_cast<size_t>(b) * E + e]);
      }
    }
  }
  return vmax;
}

// The time axis under the heatmap strips (they share it with the imbalance plots' zoom), from
// x0 over hm_w pixels.
void DrawStepAxis(ImDrawList* dl, const AxisMap& xa, float x0, float hm_w, float fh) {
  const ImVec2 o = ImGui::GetCursorScreenPos();
  const ImU32 dim = ImGui::GetColorU32(ImGuiCol_TextDisabled);
  dl->AddLine(ImVec2(x0, o.y), ImVec2(x0 + hm_w, o.y), dim);
  for (double t : NiceTicks(xa.lo, xa.hi, std::max(2, static_cast<int>(hm_w / (fh * 6))))) {
    const float px = x0 + static_cast<float>(xa.Forward(t)) * hm_w;
    dl->AddLine(ImVec2(px, o.y), ImVec2(px, o.y + fh * 0.35f), dim);
    const std::string s = FormatValue(t);
    const float w = ImGui::CalcTextSize(s.c_str()).x;
    dl->AddText(ImVec2(std::clamp(px - w / 2, x0, x0 + hm_w - w), o.y + fh * 0.4f), dim, s.c_str());
  }
  const float w = ImGui::CalcTextSize("step").x;
  dl->AddText(ImVec2(x0 + hm_w / 2 - w / 2, o.y + fh * 1.45f), dim, "step");
}

}  // namespace

// ---- Experts --------------------------------------------------------------------------------

std::vector<int64_t> App::RunsWithShape(bool (*has)(const db::RunShape&)) {
  std::vector<int64_t> ids;
  for (int64_t id : selection_) {
    const RunEntry* e = runs_->Find(id);
    if (e && has(e->row.shape)) ids.push_back(id);
  }
  for (const auto& r : runs_->runs) {
    if (has(r->row.shape) && std::find(ids.begin(), ids.end(), r->row.id) == ids.end()) {
      ids.push_back(r->row.id);
    }
  }
  return ids;
}

void App::AbsentRuns(const std::vector<int64_t>& absent, const char* what) {
  if (absent.empty()) return;
  std::string text;
  for (int64_t id : absent) {
    const RunEntry* e = runs_->Find(id);
    text += (text.empty() ? "" : "; ") + std::string("run #") + std::to_string(id) +
            (e && !e->row.name.empty() ? " (" + e->row.name + ")" : "") + " has " + what;
  }
  ImGui::PushStyleColor(ImGuiCol_Text, ImGui::GetStyleColorVec4(ImGuiCol_TextDisabled));
  ImGui::TextWrapped("Not shown: %s.", text.c_str());
  ImGui::PopStyleColor();
}

void App::SplitSelection(bool (*has)(const db::RunShape&), std::vector<int64_t>* with,
                         std::vector<int64_t>* without) const {
  for (int64_t id : selection_) {
    const RunEntry* e = runs_->Find(id);
    if (!e) continue;
    (has(e->row.shape) ? with : without)->push_back(id);
  }
}

void App::ExpertsView() {
  // A panel per selected MoE run (selected runs without expert loads are named with the
  // reason); with nothing selected, one run chosen in the combo.
  const auto has_moe = [](const db::RunShape& s) { return s.moe_layers > 0; };
  const std::vector<int64_t> candidates = RunsWithShape(has_moe);
  std::vector<int64_t> shown, absent;
  SplitSelection(has_moe, &shown, &absent);
  AbsentRuns(absent, "no expert loads recorded (no MoE layers)");
  if (candidates.empty()) {
    ImGui::TextDisabled("No MoE run records expert loads yet.");
    return;
  }
  if (selection_.empty()) {
    const int64_t run =
        experts_.run >= 0 && runs_->Find(experts_.run) ? experts_.run : candidates[0];
    ImGui::SetNextItemWidth(300);
    if (ImGui::BeginCombo("run", RunLabel(run).c_str())) {
      for (int64_t id : candidates) {
        if (ImGui::Selectable(RunLabel(id).c_str(), id == run)) experts_.run = id;
      }
      ImGui::EndCombo();
    }
    ImGui::SameLine();
    ImGui::TextDisabled("(select runs in the Runs view to see several)");
    shown = {run};
  }
  if (shown.empty()) return;
  // Each run gets the view's height down to a readable minimum; more runs scroll.
  const float avail_h = ImGui::GetContentRegionAvail().y;
  const float h = std::max(ImGui::GetFontSize() * 24,
                           (avail_h - ImGui::GetStyle().ItemSpacing.y * (shown.size() - 1)) /
                               static_cast<float>(shown.size()));
  ImGui::BeginChild("expert panels", ImVec2(0, 0), false);
  for (size_t i = 0; i < shown.size(); ++i) {
    ImGui::PushID(static_cast<int>(i));
    ExpertsPanel(static_cast<int>(i), shown[i], h);
    ImGui::PopID();
  }
  ImGui::EndChild();
}

void App::ExpertsPanel(int index, int64_t run, float height) {
  ImGui::BeginChild("panel", ImVec2(0, height), false, ImGuiWindowFlags_NoScrollbar);
  ImGui::Text("#%lld %s", static_cast<long long>(run), RunLabel(run).c_str());
  auto data = store_->Experts(run);
  if (!data) {
    frame_settled_ = false;
    ImGui::TextDisabled("loading...");
    ImGui::EndChild();
    return;
  }
  if (data->steps.empty()) {
    ImGui::TextDisabled("no expert-load records for this run");
    ImGui::EndChild();
    return;
  }
  const int L = data->moe_layers, E = data->experts;
  const size_t n = data->steps.size();
  if (L <= 0 || E <= 0 || data->counts.size() != n * L * E) {
    ImGui::TextDisabled("expert-load records of this run have no usable shape");
    ImGui::EndChild();
    return;
  }
  auto& slot = experts_.caches[run];
  if (!slot) slot = std::make_unique<ExpertCache>();
  ExpertCache& c = *slot;
  if (c.version != data->version) {
    c.version = data->version;
    c.cv.assign(L, std::vector<double>(n));
    c.max_mean.assign(L, std::vector<double>(n));
    for (size_t i = 0; i < n; ++i) {
      for (int l = 0; l < L; ++l) {
        const Imbalance im = ExpertImbalance(std::span<const int64_t>(
            data->counts.data() + (i * L + l) * static_cast<size_t>(E), E));
        c.cv[l][i] = im.cv;
        c.max_mean[l][i] = im.max_over_mean;
      }
    }
  }
  ImGui::SameLine();
  ImGui::TextDisabled(
      "%d MoE layers x %d routed experts, %zu records. Heatmap: share of the "
      "layer's tokens per expert (1/E = %.3g is balanced).",
      L, E, n, 1.0 / E);

  const float fh = ImGui::GetFontSize();
  const ImVec2 avail = ImGui::GetContentRegionAvail();
  const float left_w = avail.x * 0.58f;
  const float right_w = avail.x - left_w - ImGui::GetStyle().ItemSpacing.x;

  // Left: one heatmap per MoE layer, time in pixel bins (mean share per bin) x experts.
  ImGui::BeginChild("heatmaps", ImVec2(left_w, avail.y), false);
  const float label_w = fh * 2.5f;
  const float hm_w = left_w - label_w - fh;
  // Below the strips: the step axis and the colour scale (about 4.5 lines).
  const float strip_h = std::clamp((avail.y - fh * 5.5f) / L - fh * 1.6f, 24.0f, 240.0f);
  AxisMap xa{data->steps.front(), data->steps.back(), false};
  if (!experts_.x.auto_fit && experts_.x.hi > experts_.x.lo)
    xa = {experts_.x.lo, experts_.x.hi, false};
  if (!(xa.hi > xa.lo)) xa.hi = xa.lo + 1;
  const int bins = std::max(1, static_cast<int>(hm_w / 2));
  Signature hsig;
  hsig.Add(c.version).Add(xa.lo).Add(xa.hi).Add(bins);
  if (hsig.h != c.hm_sig) {
    // Mean share per (time bin, expert) per layer, as one texture per layer (bins x experts
    // pixels): a few thousand rects per layer would cost llvmpipe more than the whole frame.
    c.hm_sig = hsig.h;
    c.bins = bins;
    c.tex.resize(L);
    std::vector<uint32_t> pixels(static_cast<size_t>(bins) * E);
    std::vector<int> first_bin;
    c.vmax = MeanSharePerBin(*data, xa, bins, &c.share, &first_bin);
    // One colour scale for every layer (the colour bar below), so equal colours are equal
    // shares across layers.
    for (int l = 0; l < L; ++l) {
      for (int e = 0; e < E; ++e) {
        for (int b = 0; b < bins; ++b) {
          const bool empty = first_bin[l] < 0 || b < first_bin[l];
          pixels[static_cast<size_t>(e) * bins + b] =
              empty ? 0u
                    : ToImU32(HeatColor(c.share[l][static_cast<size_t>(b) * E + e], 0, c.vmax));
        }
      }
      if (!c.tex[l]) c.tex[l] = std::make_unique<Texture>();
      c.tex[l]->Upload(bins, E, pixels.data());
    }
  }
  ImDrawList* dl = ImGui::GetWindowDrawList();
  const int stride = ExpertLabelStride(E, strip_h / E, fh);
  for (int l = 0; l < L; ++l) {
    ImGui::Text("MoE layer %d", l);
    const ImVec2 o = ImGui::GetCursorScreenPos();
    const float cell_h = strip_h / E;
    dl->AddImage(c.tex[l]->id(), ImVec2(o.x + label_w, o.y),
                 ImVec2(o.x + label_w + hm_w, o.y + strip_h));
    // Every expert's row labelled where the rows are a line high, else every k-th (the legend
    // under the strips says so); each label centred on its row.
    for (int e = 0; e < E; e += stride) {
      char lbl[16];
      std::snprintf(lbl, sizeof(lbl), "e%d", e);
      const float y = std::clamp(o.y + (e + 0.5f) * cell_h - fh / 2, o.y, o.y + strip_h - fh);
      DrawListText(dl, ImVec2(o.x, y), ImGui::GetColorU32(ImGuiCol_TextDisabled), lbl);
    }
    ImGui::Dummy(ImVec2(left_w - fh, strip_h));
    const ImVec2 hm_min(o.x + label_w, o.y), hm_max(o.x + label_w + hm_w, o.y + strip_h);
    if (ImGui::IsMouseHoveringRect(hm_min, hm_max) && ImGui::IsWindowHovered()) {
      const double t = (ImGui::GetIO().MousePos.x - hm_min.x) / hm_w;
      const int b = std::clamp(static_cast<int>(t * bins), 0, bins - 1);
      const int e =
          std::clamp(static_cast<int>((ImGui::GetIO().MousePos.y - o.y) / cell_h), 0, E - 1);
      ImGui::SetTooltip("layer %d, expert %d, steps ~%s: %.2f%% of tokens (balanced %.2f%%)", l, e,
                        FormatValue(xa.Inverse(t)).c_str(),
                        100 * c.share[l][static_cast<size_t>(b) * E + e], 100.0 / E);
    }
  }
  DrawStepAxis(dl, xa, ImGui::GetCursorScreenPos().x + label_w, hm_w, fh);
  ImGui::Dummy(ImVec2(left_w - fh, fh * 2.6f));
  if (stride > 1) {
    ImGui::SetCursorPosX(ImGui::GetCursorPosX() + label_w);
    ImGui::TextDisabled("rows: experts e0 (top) to e%d (bottom), every %d-th labelled", E - 1,
                        stride);
  }
  ImGui::SetCursorPosX(ImGui::GetCursorPosX() + label_w);
  ImGui::TextDisabled("share of the layer's tokens (%%)");
  ImGui::SameLine();
  ImGui::SetCursorPosX(ImGui::GetCursorPosX() + fh);
  ColorBar(std::min(240.0f, hm_w * 0.4f), fh, 0, 100 * c.vmax);
  ImGui::EndChild();
  ImGui::SameLine();

  // Right: imbalance curves, one line per layer.
  ImGui::BeginChild("imbalance", ImVec2(right_w, avail.y), false);
  const int cols = std::max(16, static_cast<int>(right_w - fh * 5.4f));
  for (int which = 0; which < 2; ++which) {
    const auto& series = which == 0 ? c.cv : c.max_mean;
    PlotBounds fit;
    fit.AddX(data->steps.front());
    fit.AddX(data->steps.back());
    for (const auto& s : series) {
      for (double v : s) fit.AddY(v);
    }
    if (which == 1) fit.AddY(1.0);
    if (which == 0) fit.AddY(0.0);
    Plot plot(
        which == 0 ? "cv" : "maxmean",
        ImVec2(right_w, which == 0 ? avail.y * 0.5f - 4 : -ImGui::GetFrameHeightWithSpacing()),
        &experts_.x, which == 0 ? &experts_.cv_y[index] : &experts_.mm_y[index], fit, false, false,
        which == 0 ? "load imbalance: coefficient of variation" : "load imbalance: max / mean",
        "step");
    Signature sig;
    sig.Add(c.version).Add(cols);
    LineCanvas& canvas = Canvas((which == 0 ? "cv" : "maxmean") + std::to_string(index));
    if (canvas.Begin(plot, Signature().Add(run).h, sig.h)) {
      std::vector<double> dx, dy;
      for (int l = 0; l < L; ++l) {
        DownsampleM4(data->steps, series[l], plot.x_axis(), cols, &dx, &dy);
        canvas.Line(plot, dx, dy, ToImU32(GroupColor(l, L, true)), 1.6f);
      }
    }
    canvas.End(plot);
    if (which == 1) plot.HLine(1.0, IM_COL32(200, 200, 200, 120), true, "balanced");
    if (plot.hovered()) LayerTooltip(data->steps, plot.mouse_x(), series, "MoE layer");
  }
  // Which line is which layer.
  for (int l = 0; l < L; ++l) {
    if (l > 0) ImGui::SameLine(0, 10);
    const ImVec2 p = ImGui::GetCursorScreenPos();
    ImGui::GetWindowDrawList()->AddRectFilled(ImVec2(p.x, p.y + fh * 0.45f),
                                              ImVec2(p.x + fh * 1.2f, p.y + fh * 0.65f),
                                              ToImU32(GroupColor(l, L, true)));
    ImGui::Dummy(ImVec2(fh * 1.3f, fh));
    ImGui::SameLine(0, 3);
    ImGui::Text("MoE layer %d", l);
  }
  ImGui::EndChild();
  ImGui::EndChild();  // panel
}

}  // namespace moelab::gui
