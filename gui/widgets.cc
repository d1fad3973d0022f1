#include "gui/widgets.h"

#include <imgui.h>
#include <imgui_internal.h>
#include <imgui_stdlib.h>

#include <algorithm>
#include <cstdio>
#include <string>

#include "gui/plot.h"
#include "gui/view_model.h"

namespace moelab::gui {

ImU32 StatusColor(RunStatus s) {
  switch (s) {
    case RunStatus::kRunning:
      return IM_COL32(90, 180, 255, 255);
    case RunStatus::kDone:
      return IM_COL32(110, 200, 110, 255);
    case RunStatus::kFailed:
    case RunStatus::kDiverged:
      return IM_COL32(235, 90, 80, 255);
    case RunStatus::kQueued:
      return IM_COL32(170, 170, 170, 255);
    case RunStatus::kStopped:
      break;
  }
  return IM_COL32(220, 190, 90, 255);
}

void HelpMarker(const char* text) {
  ImGui::SameLine();
  ImGui::TextDisabled("(?)");
  if (ImGui::IsItemHovered()) ImGui::SetTooltip("%s", text);
}

// A key chooser over sweep variables and config keys ("" = none).
bool KeyCombo(const char* label, std::string* key, const RunsSnapshot& runs, const char* none) {
  bool changed = false;
  std::string preview = key->empty() ? none : *key;
  if (ImGui::BeginCombo(label, preview.c_str(), ImGuiComboFlags_HeightLarge)) {
    if (ImGui::Selectable(none, key->empty())) {
      key->clear();
      changed = true;
    }
    for (const auto& v : runs.var_keys) {
      const std::string k = "var:" + v;
      if (ImGui::Selectable(k.c_str(), *key == k)) {
        *key = k;
        changed = true;
      }
    }
    for (const auto& k : runs.config_keys) {
      if (ImGui::Selectable(k.c_str(), *key == k)) {
        *key = k;
        changed = true;
      }
    }
    ImGui::EndCombo();
  }
  return changed;
}

bool CodeEditor(const char* id, std::string* text, ImVec2 size, int mark_line, bool reveal_mark) {
  const float fh = ImGui::GetFontSize();
  int lines = 1;
  for (char ch : *text) lines += ch == '\n';
  const std::string widest = std::to_string(std::max(lines, 99));
  const float gutter_w = ImGui::CalcTextSize(widest.c_str()).x + fh * 0.8f;
  const ImVec2 gutter_min = ImGui::GetCursorScreenPos();
  ImGui::Dummy(ImVec2(gutter_w, size.y));
  ImGui::SameLine(0, 0);
  ImGuiWindow* parent = ImGui::GetCurrentWindow();
  const ImGuiID input_id = ImGui::GetID(id);
  const bool edited = ImGui::InputTextMultiline(id, text, ImVec2(size.x, size.y),
                                                ImGuiInputTextFlags_AllowTabInput);
  const ImRect frame(ImGui::GetItemRectMin(), ImGui::GetItemRectMax());
  // The text scrolls inside the input's own child window (imgui's BeginChildEx names it
  // "<parent>/<label>_<id>"): its scroll places the line numbers and the highlight.
  char child_name[512];
  std::snprintf(child_name, sizeof(child_name), "%s/%s_%08X", parent->Name, id, input_id);
  ImGuiWindow* child = ImGui::FindWindowByName(child_name);
  const float scroll_y = child ? child->Scroll.y : 0;
  const ImVec2 pad = ImGui::GetStyle().FramePadding;
  ImDrawList* dl = ImGui::GetWindowDrawList();
  const ImRect gutter(ImVec2(gutter_min.x, frame.Min.y), ImVec2(frame.Min.x, frame.Max.y));
  dl->AddRectFilled(gutter.Min, gutter.Max, ImGui::GetColorU32(ImGuiCol_FrameBg));
  dl->PushClipRect(gutter.Min, gutter.Max, true);
  const int first = std::max(0, static_cast<int>((scroll_y - pad.y) / fh));
  const int last = std::min(lines, first + static_cast<int>(frame.GetHeight() / fh) + 2);
  const ImU32 mark = IM_COL32(240, 110, 100, 255);
  for (int i = first; i < last; ++i) {
    const float y = frame.Min.y + pad.y + i * fh - scroll_y;
    const std::string n = std::to_string(i + 1);
    const float w = ImGui::CalcTextSize(n.c_str()).x;
    dl->AddText(ImVec2(gutter.Max.x - w - fh * 0.4f, y),
                i + 1 == mark_line ? mark : ImGui::GetColorU32(ImGuiCol_TextDisabled), n.c_str());
  }
  dl->PopClipRect();
  if (child && reveal_mark && mark_line >= 1) {
    // The marked line a third of the way down (applied next frame, as a scroll is).
    const float target = pad.y + (mark_line - 1) * fh - frame.GetHeight() / 3;
    ImGui::SetScrollY(child, std::max(0.0f, target));
  }
  if (mark_line >= 1 && mark_line <= lines) {
    // Over the text (the input draws its own background): a translucent band and a marker.
    ImDrawList* target = child ? child->DrawList : dl;
    const float y = frame.Min.y + pad.y + (mark_line - 1) * fh - scroll_y;
    target->PushClipRect(frame.Min, frame.Max, true);
    target->AddRectFilled(ImVec2(frame.Min.x, y), ImVec2(frame.Max.x, y + fh),
                          IM_COL32(240, 110, 100, 60));
    target->AddRectFilled(ImVec2(frame.Min.x, y), ImVec2(frame.Min.x + 3, y + fh), mark);
    target->PopClipRect();
  }
  return edited;
}

void DrawListText(ImDrawList* dl, ImVec2 pos, ImU32 color, const char* text) {
  dl->AddText(pos, color, text);
  if (GImGui->LogEnabled) ImGui::LogRenderedText(&pos, text);
}

std::vector<std::string> ClippedTables() {
  ImGuiContext& g = *GImGui;
  std::vector<std::string> out;
  for (int n = 0; n < g.Tables.GetMapSize(); ++n) {
    const ImGuiTable* t = g.Tables.TryGetMapData(n);
    if (!t || t->LastFrameActive != g.FrameCount || !t->OuterWindow) continue;
    const ImGuiWindow* w = t->OuterWindow;
    if (t->Flags & ImGuiTableFlags_ScrollX) continue;  // scrolls sideways: nothing is lost
    const float need = t->OuterRect.Min.x + t->ColumnsAutoFitWidth;
    const float shown = w->ScrollMax.x > 0 ? t->OuterRect.Max.x
                                           : std::min(t->OuterRect.Max.x, w->InnerClipRect.Max.x);
    // A header wider than its column is cut with an ellipsis, scrolling or not.
    for (int c = 0; c < t->ColumnsCount; ++c) {
      const ImGuiTableColumn& col = t->Columns[c];
      if (!col.IsEnabled || col.ContentMaxXHeadersIdeal <= col.WorkMaxX + 1) continue;
      char line[512];
      std::snprintf(line, sizeof line, "header of column %d '%s' in window '%s': %.0f px cut", c,
                    ImGui::TableGetColumnName(t, c), w->Name,
                    col.ContentMaxXHeadersIdeal - col.WorkMaxX);
      out.push_back(line);
    }
    if (need > shown + 1) {
      char line[512];
      std::snprintf(line, sizeof line, "table 0x%08x in window '%s': needs %.0f px, shows %.0f px",
                    t->ID, w->Name, need - t->OuterRect.Min.x, shown - t->OuterRect.Min.x);
      out.push_back(line);
    }
  }
  return out;
}

void LayerTooltip(std::span<const double> steps, double mouse_x,
                  const std::vector<std::vector<double>>& series, const char* layer_name) {
  const int64_t i = NearestIndexAtOrBefore(steps, mouse_x);
  const int L = static_cast<int>(series.size());
  ImGui::BeginTooltip();
  ImGui::Text("step %lld", static_cast<long long>(steps[i]));
  for (int l = 0; l < L; ++l) {
    ImGui::TextColored(ImGui::ColorConvertU32ToFloat4(ToImU32(GroupColor(l, L, true))), "%s %d: %s",
                       layer_name, l, FormatValue(series[l][i]).c_str());
  }
  ImGui::EndTooltip();
}

}  // namespace moelab::gui
