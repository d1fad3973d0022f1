// Options that persist between sessions of moelab-gui, in a small JSON file next to imgui.ini
// ($XDG_CONFIG_HOME/moelab/ or ~/.config/moelab/). imgui.ini keeps window layout; this keeps
// what ImGui does not know about: the database, recent files and each view's choices.
#pragma once

#include <string>
#include <vector>

namespace moelab::gui {

struct Settings {
  std::string db_path;
  std::vector<std::string> recent;  // most recent first, at most kMaxRecent
  std::string view = "runs";
  // Runs
  std::string filter;
  std::string group_key;  // "" = no grouping; "var:X" = sweep variable; else a config key
  std::vector<std::string> columns = {"moe.experts_total", "model.heads", "optimizer.name"};
  // Curves
  int x_axis = 0;  // 0 step, 1 tokens, 2 FLOPs, 3 wall time
  bool log_x = false;
  bool log_y = true;
  float smoothing = 0.6f;
  bool show_raw = true;
  bool follow_live = true;
  std::string color_key;                      // "" = one colour per run
  std::vector<int> panels = {1, 1, 1, 1, 1};  // loss, val loss, lr, grad norm, tokens/s
  // Scaling laws
  std::string family_key = "var:sparsity";

  static constexpr size_t kMaxRecent = 10;
  void AddRecent(const std::string& path);
};

// The folder holding gui.json and imgui.ini; created on demand by Save.
std::string ConfigDir();
// Missing or unreadable file: defaults (a broken settings file must never stop the app).
Settings LoadSettings(const std::string& file);
// Returns false (and leaves the old file) when it cannot write.
bool SaveSettings(const Settings& settings, const std::string& file);

}  // namespace moelab::gui
