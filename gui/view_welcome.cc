// The welcome screen: what moelab-gui shows before a database is open (also what
// `moelab-gui --screenshot out.png` without --db captures, instead of waiting for data).
#include <imgui.h>

#include "gui/app.h"
#include "gui/widgets.h"

namespace moelab::gui {

void App::WelcomeView() {
  ImGui::Spacing();
  ImGui::TextUnformatted("Welcome to moelab");
  ImGui::Separator();
  ImGui::TextWrapped(
      "No database open. Open the SQLite file a training run or a sweep writes to (moelab train "
      "--db FILE, moelab sweep run SPEC --db FILE), or start with moelab-gui --db FILE.");
  ImGui::Spacing();
  if (ImGui::Button("Open database...  (Ctrl+O)")) open_dialog_ = true;
  if (!settings_.recent.empty()) {
    ImGui::Spacing();
    ImGui::TextDisabled("Recent databases");
    for (const auto& r : settings_.recent) {
      if (ImGui::Selectable(r.c_str())) {
        OpenDatabase(r);
        break;
      }
    }
  }
  ImGui::Spacing();
}

}  // namespace moelab::gui
