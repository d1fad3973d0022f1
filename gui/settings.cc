#include "gui/settings.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

namespace moelab::gui {

void Settings::AddRecent(const std::string& path) {
  std::erase(recent, path);
  recent.insert(recent.begin(), path);
  if (recent.size() > kMaxRecent) recent.resize(kMaxRecent);
}

std::string ConfigDir() {
  if (const char* xdg = std::getenv("XDG_CONFIG_HOME"); xdg && *xdg) {
    return std::string(xdg) + "/moelab";
  }
  if (const char* home = std::getenv("HOME"); home && *home) {
    return std::string(home) + "/.config/moelab";
  }
  return ".moelab";
}

Settings LoadSettings(const std::string& file) {
  Settings s;
  std::ifstream in(file);
  if (!in) return s;
  try {
    nlohmann::json j = nlohmann::json::parse(in);
    auto get = [&](const char* key, auto* value) {
      if (j.contains(key)) *value = j[key].get<std::decay_t<decltype(*value)>>();
    };
    get("db_path", &s.db_path);
    get("recent", &s.recent);
    get("view", &s.view);
    get("filter", &s.filter);
    get("group_key", &s.group_key);
    get("columns", &s.columns);
    get("x_axis", &s.x_axis);
    get("log_x", &s.log_x);
    get("log_y", &s.log_y);
    get("smoothing", &s.smoothing);
    get("show_raw", &s.show_raw);
    get("follow_live", &s.follow_live);
    get("color_key", &s.color_key);
    get("panels", &s.panels);
    get("family_key", &s.family_key);
  } catch (const nlohmann::json::exception&) {
    return Settings{};
  }
  if (s.panels.size() != Settings{}.panels.size()) s.panels = Settings{}.panels;
  return s;
}

bool SaveSettings(const Settings& s, const std::string& file) {
  nlohmann::json j = {
      {"db_path", s.db_path},     {"recent", s.recent},       {"view", s.view},
      {"filter", s.filter},       {"group_key", s.group_key}, {"columns", s.columns},
      {"x_axis", s.x_axis},       {"log_x", s.log_x},         {"log_y", s.log_y},
      {"smoothing", s.smoothing}, {"show_raw", s.show_raw},   {"follow_live", s.follow_live},
      {"color_key", s.color_key}, {"panels", s.panels},       {"family_key", s.family_key}};
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(file).parent_path(), ec);
  // Write then rename, so a crash mid-write never leaves a truncated file behind.
  const std::string tmp = file + ".tmp";
  {
    std::ofstream out(tmp);
    if (!out) return false;
    out << j.dump(2) << "\n";
    if (!out) return false;
  }
  std::filesystem::rename(tmp, file, ec);
  return !ec;
}

}  // namespace moelab::gui
