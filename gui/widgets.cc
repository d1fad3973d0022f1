#include "gui/widgets.h"

#include <imgui.h>

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

}  // namespace moelab::gui
