// The compare view of moelab-gui (App::*View and its helpers).
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

// ---- Compare --------------------------------------------------------------------------------

void App::CompareView() {
  std::vector<int64_t> runs;
  for (int64_t id : selection_) {
    if (runs_->Find(id)) runs.push_back(id);
  }
  if (runs.size() < 2) {
    ImGui::TextWrapped(
        "Select two or more runs in the Runs view (Ctrl+click or Shift+click) to "
        "compare their configs, summaries and curves.");
    return;
  }
  AssignColors(runs);
  if (runs.size() > 62) {
    ImGui::TextDisabled(
        "The tables show the first 62 of the %zu selected runs (a table holds 64 columns); the "
        "curves below show every one.",
        runs.size());
  }
  const ImVec2 avail = ImGui::GetContentRegionAvail();
  const float top_h = avail.y * 0.45f;
  const ImGuiTableFlags tflags = ImGuiTableFlags_RowBg | ImGuiTableFlags_BordersInnerV |
                                 ImGuiTableFlags_ScrollY | ImGuiTableFlags_ScrollX |
                                 ImGuiTableFlags_Resizable | ImGuiTableFlags_SizingFixedFit;
  const int ncols = std::min<int>(static_cast<int>(runs.size()) + 1, 63);
  std::vector<std::map<std::string, std::string>> configs;
  for (int64_t id : runs) configs.push_back(runs_->Find(id)->keys.config);
  std::vector<DiffRow> diff = ConfigDiff(configs);

  // Run columns are headed by what tells the runs apart (differing sweep variables, the part
  // of their names that differs, differing config fields), never by a long shared name cut
  // off at the column's edge; the full name is on hover. A column is as wide as its label and
  // at least a value ("1.64e+06"); the table scrolls sideways when they do not all fit.
  std::vector<const RunKeys*> keys;
  for (int64_t id : runs) keys.push_back(&runs_->Find(id)->keys);
  const std::vector<std::string> labels = DistinguishingLabels(keys);
  auto header = [&](const char* first, const std::vector<std::string>& cells) {
    const float avail_w = ImGui::GetContentRegionAvail().x;
    float first_w = ImGui::CalcTextSize(first).x;
    for (const auto& c : cells) first_w = std::max(first_w, ImGui::CalcTextSize(c.c_str()).x);
    first_w = std::min(first_w + 8, avail_w * 0.45f);
    const float value_w = ImGui::CalcTextSize("1.64e+06__").x;
    ImGui::TableSetupScrollFreeze(1, 1);
    ImGui::TableSetupColumn(first, ImGuiTableColumnFlags_WidthFixed, first_w);
    for (int i = 0; i + 1 < ncols; ++i) {
      const float want = ImGui::CalcTextSize(labels[i].c_str()).x + ImGui::GetFontSize() * 1.5f;
      ImGui::TableSetupColumn(labels[i].c_str(), ImGuiTableColumnFlags_WidthFixed,
                              std::max(want, value_w));
    }
    ImGui::TableNextRow(ImGuiTableRowFlags_Headers);
    for (int i = 0; i < ncols; ++i) {
      ImGui::TableSetColumnIndex(i);
      if (i > 0) {
        ImGui::ColorButton("##c", ImGui::ColorConvertU32ToFloat4(colors_[runs[i - 1]]),
                           ImGuiColorEditFlags_NoTooltip, ImVec2(10, 10));
        ImGui::SameLine();
      }
      ImGui::TableHeader(ImGui::TableGetColumnName(i));
      if (i > 0 && ImGui::IsItemHovered())
        ImGui::SetTooltip("%s\n%s", RunLabel(runs[i - 1]).c_str(), labels[i - 1].c_str());
    }
  };

  ImGui::BeginChild("top", ImVec2(0, top_h), false);
  const float half = ImGui::GetContentRegionAvail().x * 0.5f - 4;
  ImGui::BeginChild("diff", ImVec2(half, 0), false);
  ImGui::Text("Config fields that differ (%zu)", diff.size());
  if (ImGui::BeginTable("diff", ncols, tflags)) {
    std::vector<std::string> keys;
    for (const auto& row : diff) keys.push_back(row.key);
    header("field", keys);
    for (const auto& row : diff) {
      ImGui::TableNextRow();
      ImGui::TableSetColumnIndex(0);
      ImGui::TextUnformatted(row.key.c_str());
      for (int i = 0; i + 1 < ncols; ++i) {
        ImGui::TableSetColumnIndex(i + 1);
        ImGui::TextUnformatted(row.values[i].c_str());
      }
    }
    ImGui::EndTable();
  }
  ImGui::EndChild();
  ImGui::SameLine();
  ImGui::BeginChild("summary", ImVec2(0, 0), false);
  ImGui::TextUnformatted("Summary");
  if (ImGui::BeginTable("summary", ncols, tflags)) {
    header("metric", {"training FLOPs", "best val loss"});
    auto row = [&](const char* name, auto fn) {
      ImGui::TableNextRow();
      ImGui::TableSetColumnIndex(0);
      ImGui::TextUnformatted(name);
      for (int i = 0; i + 1 < ncols; ++i) {
        ImGui::TableSetColumnIndex(i + 1);
        ImGui::TextUnformatted(fn(runs_->Find(runs[i])->row).c_str());
      }
    };
    row("status", [](const db::RunRow& r) { return std::string(ToString(r.effective_status)); });
    row("steps", [](const db::RunRow& r) { return std::to_string(r.last_step); });
    row("last loss", [](const db::RunRow& r) { return Opt(r.last_loss); });
    row("best val loss", [](const db::RunRow& r) { return Opt(r.best_val_loss); });
    row("last val loss", [](const db::RunRow& r) { return Opt(r.last_val_loss); });
    row("tokens", [](const db::RunRow& r) { return FormatValue(static_cast<double>(r.tokens)); });
    row("training FLOPs", [](const db::RunRow& r) { return FormatValue(r.flops); });
    row("tokens/s", [](const db::RunRow& r) { return Opt(r.tokens_per_s); });
    row("params total",
        [](const db::RunRow& r) { return FormatValue(static_cast<double>(r.shape.params_total)); });
    row("params active", [](const db::RunRow& r) {
      return FormatValue(static_cast<double>(r.shape.params_active));
    });
    row("FLOPs / token", [](const db::RunRow& r) { return FormatValue(r.shape.flops_per_token); });
    ImGui::EndTable();
  }
  ImGui::EndChild();
  ImGui::EndChild();

  Legend(runs);
  const ImVec2 rest = ImGui::GetContentRegionAvail();
  const ImVec2 size((rest.x - ImGui::GetStyle().ItemSpacing.x) / 2, rest.y);
  AxisState* ys[2] = {&compare_.y[0], &compare_.y[1]};
  CurvePanels({0, 1}, "cmp_", runs, size, 2, &compare_.x, ys);
}

}  // namespace moelab::gui
