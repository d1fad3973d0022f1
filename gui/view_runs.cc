// The runs view of moelab-gui (App::*View and its helpers).
#include <imgui.h>
#include <imgui_internal.h>
#include <imgui_stdlib.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <numeric>
#include <set>

#include "gui/app.h"
#include "gui/app_internal.h"
#include "gui/widgets.h"

namespace moelab::gui {

// ---- Runs -----------------------------------------------------------------------------------

namespace {

// Sorts the shown runs by the table's sort specs: each column has a string or numeric key;
// missing numbers sort last whatever the direction, ties by run id.
void SortRuns(const std::vector<std::string>& cols, int fixed_before,
              std::vector<const RunEntry*>* shown_runs) {
  std::vector<const RunEntry*>& shown = *shown_runs;
  auto cell_key = [&](const RunEntry* r, int col) -> std::pair<double, std::string> {
    if (col == 0) return {kNaN, r->sweep_name};
    if (col == 1) return {kNaN, r->row.name};
    if (col == 2) return {kNaN, ToString(r->row.effective_status)};
    if (col < fixed_before + static_cast<int>(cols.size())) {
      return {kNaN, LookupKey(r->keys, cols[col - fixed_before])};
    }
    switch (col - fixed_before - static_cast<int>(cols.size())) {
      case 0:
        return {r->row.last_loss.value_or(kNaN), ""};
      case 1:
        return {r->row.best_val_loss.value_or(kNaN), ""};
      case 2:
        return {r->row.tokens_per_s.value_or(kNaN), ""};
      default:
        return {static_cast<double>(r->row.last_step), ""};
    }
  };
  if (ImGuiTableSortSpecs* specs = ImGui::TableGetSortSpecs(); specs && specs->SpecsCount > 0) {
    std::stable_sort(shown.begin(), shown.end(), [&](const RunEntry* a, const RunEntry* b) {
      for (int i = 0; i < specs->SpecsCount; ++i) {
        const ImGuiTableColumnSortSpecs& s = specs->Specs[i];
        auto ka = cell_key(a, s.ColumnIndex), kb = cell_key(b, s.ColumnIndex);
        int cmp = 0;
        if (!ka.second.empty() || !kb.second.empty() ||
            (std::isnan(ka.first) && std::isnan(kb.first))) {
          cmp = ValueLess(ka.second, kb.second) ? -1 : ValueLess(kb.second, ka.second) ? 1 : 0;
        } else if (std::isnan(ka.first) != std::isnan(kb.first)) {
          // Missing values sort last whatever the direction.
          return std::isnan(kb.first);
        } else {
          cmp = ka.first < kb.first ? -1 : ka.first > kb.first ? 1 : 0;
        }
        if (cmp != 0) return s.SortDirection == ImGuiSortDirection_Ascending ? cmp < 0 : cmp > 0;
      }
      return a->row.id < b->row.id;
    });
  }
}

// The status cell: a bar for a run that is training or was stopped part-way (how far it got),
// its fraction of the planned steps, never more; finished runs show their status.
void StatusCell(const RunEntry* r) {
  const RunStatus st = r->row.effective_status;
  if ((st == RunStatus::kRunning || (st == RunStatus::kStopped && !r->row.stale)) &&
      r->row.shape.total_steps > 0 && r->row.last_step < r->row.shape.total_steps) {
    const float frac = std::clamp(
        static_cast<float>(r->row.last_step) / static_cast<float>(r->row.shape.total_steps), 0.0f,
        1.0f);
    char overlay[64];
    std::snprintf(overlay, sizeof(overlay), "%s %.0f%%", ToString(st), std::floor(frac * 100));
    ImGui::PushStyleColor(ImGuiCol_PlotHistogram, StatusColor(st));
    ImGui::ProgressBar(frac, ImVec2(-1, ImGui::GetTextLineHeight()), overlay);
    ImGui::PopStyleColor();
  } else {
    ImGui::PushStyleColor(ImGuiCol_Text, StatusColor(st));
    ImGui::TextUnformatted(r->row.stale ? "failed (stale)" : ToString(st));
    ImGui::PopStyleColor();
  }
}

}  // namespace

void App::RunsView() {
  const RunsSnapshot& rs = *runs_;
  ImGui::SetNextItemWidth(220);
  ImGui::InputTextWithHint("##filter", "filter (words: name, status, values)", &settings_.filter);
  ImGui::SameLine();
  ImGui::SetNextItemWidth(200);
  KeyCombo("group by", &settings_.group_key, rs, "(no grouping)");
  ImGui::SameLine();
  ImGui::SetNextItemWidth(200);
  std::string add;
  if (KeyCombo("add column", &add, rs, "(choose a config key)") && !add.empty() &&
      add.rfind("var:", 0) != 0 &&
      std::find(settings_.columns.begin(), settings_.columns.end(), add) ==
          settings_.columns.end()) {
    settings_.columns.push_back(add);
  }
  ImGui::SameLine();
  if (ImGui::Button("Select shown")) {
    for (int64_t id : runs_view_.row_order) {
      if (selected_.insert(id).second) selection_.push_back(id);
    }
  }
  ImGui::SameLine();
  if (ImGui::Button("Clear selection")) {
    selection_.clear();
    selected_.clear();
  }
  HelpMarker(
      "Click selects a run, Ctrl+click toggles, Shift+click selects a range. The selection "
      "drives Curves, Max logits, Experts and Compare (Curves shows every run when none is "
      "selected). Right-click a config column header to remove it.");

  // Columns: sweep, name, status, sweep vars, chosen config keys, summary metrics.
  // A sweep variable that is a config path (grid over moe.experts_total) already has its
  // column: a chosen config column of the same key is not repeated, nor a key chosen twice.
  std::vector<std::string> cols;
  std::set<std::string> shown_keys;
  for (const auto& v : rs.var_keys) {
    cols.push_back("var:" + v);
    shown_keys.insert(v);
  }
  for (const auto& c : settings_.columns) {
    if (std::find(rs.config_keys.begin(), rs.config_keys.end(), c) != rs.config_keys.end() &&
        shown_keys.insert(c).second) {
      cols.push_back(c);
    }
  }
  const int fixed_before = 3, fixed_after = 4;
  // ImGui tables take at most 64 columns.
  if (cols.size() > static_cast<size_t>(64 - fixed_before - fixed_after)) {
    cols.resize(64 - fixed_before - fixed_after);
  }
  const int ncols = fixed_before + static_cast<int>(cols.size()) + fixed_after;

  std::vector<const RunEntry*> shown;
  for (const auto& r : rs.runs) {
    if (MatchesFilter(r->keys, settings_.filter)) shown.push_back(r.get());
  }

  const ImGuiTableFlags flags =
      ImGuiTableFlags_Sortable | ImGuiTableFlags_SortMulti | ImGuiTableFlags_Resizable |
      ImGuiTableFlags_RowBg | ImGuiTableFlags_BordersInnerV | ImGuiTableFlags_ScrollY |
      ImGuiTableFlags_ScrollX | ImGuiTableFlags_Hideable | ImGuiTableFlags_SizingFixedFit;
  if (!ImGui::BeginTable("runs", ncols, flags)) return;
  ImGui::TableSetupScrollFreeze(2, 1);
  ImGui::TableSetupColumn("sweep");
  ImGui::TableSetupColumn("name", ImGuiTableColumnFlags_DefaultSort);
  ImGui::TableSetupColumn("status", ImGuiTableColumnFlags_WidthFixed, 150);
  for (const auto& c : cols) {
    ImGui::TableSetupColumn(c.rfind("var:", 0) == 0 ? c.c_str() + 4 : c.c_str());
  }
  ImGui::TableSetupColumn("last loss");
  ImGui::TableSetupColumn("best val loss");
  ImGui::TableSetupColumn("tokens/s");
  ImGui::TableSetupColumn("steps");
  ImGui::TableHeadersRow();
  for (int c = 0; c < static_cast<int>(cols.size()); ++c) {
    if (cols[c].rfind("var:", 0) == 0) continue;
    ImGui::PushID(c);
    if (ImGui::TableGetHoveredColumn() == fixed_before + c &&
        ImGui::IsMouseReleased(ImGuiMouseButton_Right)) {
      std::erase(settings_.columns, cols[c]);
    }
    ImGui::PopID();
  }

  SortRuns(cols, fixed_before, &shown);

  // Grouping keeps the sort order inside each group.
  std::vector<std::pair<std::string, std::vector<const RunEntry*>>> groups;
  if (settings_.group_key.empty()) {
    groups.emplace_back("", shown);
  } else {
    std::vector<RunKeys> keys;
    for (const auto* r : shown) keys.push_back(r->keys);
    for (const auto& g : GroupRuns(keys, settings_.group_key)) {
      std::vector<const RunEntry*> members;
      for (int m : g.members) members.push_back(shown[m]);
      std::stable_sort(members.begin(), members.end(), [&](const RunEntry* a, const RunEntry* b) {
        return std::find(shown.begin(), shown.end(), a) < std::find(shown.begin(), shown.end(), b);
      });
      groups.emplace_back(g.value.empty() ? "(none)" : g.value, std::move(members));
    }
  }

  runs_view_.row_order.clear();
  for (const auto& [label, members] : groups) {
    bool open = true;
    if (!settings_.group_key.empty()) {
      ImGui::TableNextRow();
      ImGui::TableSetColumnIndex(0);
      double best = kNaN;
      for (const auto* r : members) {
        if (r->row.best_val_loss && !(*r->row.best_val_loss >= best)) best = *r->row.best_val_loss;
      }
      const std::string head = settings_.group_key + " = " + label + "  (" +
                               std::to_string(members.size()) + " runs, best val " +
                               FormatValue(best) + ")";
      open = ImGui::TreeNodeEx(head.c_str(), ImGuiTreeNodeFlags_DefaultOpen |
                                                 ImGuiTreeNodeFlags_SpanFullWidth |
                                                 ImGuiTreeNodeFlags_NoTreePushOnOpen);
    }
    if (!open) continue;
    for (const RunEntry* r : members) {
      const int64_t id = r->row.id;
      runs_view_.row_order.push_back(id);
      ImGui::TableNextRow();
      ImGui::PushID(static_cast<int>(id));
      ImGui::TableSetColumnIndex(0);
      ImGui::TextUnformatted(r->sweep_name.c_str());
      ImGui::TableSetColumnIndex(1);
      const bool is_sel = selected_.count(id) > 0;
      const std::string name = r->row.name.empty() ? "#" + std::to_string(id) : r->row.name;
      if (ImGui::Selectable(
              name.c_str(), is_sel,
              ImGuiSelectableFlags_SpanAllColumns | ImGuiSelectableFlags_AllowItemOverlap)) {
        const ImGuiIO& io = ImGui::GetIO();
        if (io.KeyShift && runs_view_.last_clicked >= 0) {
          auto a = std::find(runs_view_.row_order.begin(), runs_view_.row_order.end(),
                             runs_view_.last_clicked);
          if (a != runs_view_.row_order.end()) {
            for (auto it = a; it != runs_view_.row_order.end(); ++it) {
              if (selected_.insert(*it).second) selection_.push_back(*it);
            }
          } else if (selected_.insert(id).second) {
            selection_.push_back(id);
          }
        } else if (io.KeyCtrl) {
          if (is_sel) {
            selected_.erase(id);
            std::erase(selection_, id);
          } else {
            selected_.insert(id);
            selection_.push_back(id);
          }
        } else {
          selected_ = {id};
          selection_ = {id};
        }
        runs_view_.last_clicked = id;
      }
      if (ImGui::IsItemHovered() && !r->row.error.empty()) {
        ImGui::SetTooltip("%s", r->row.error.c_str());
      }
      ImGui::TableSetColumnIndex(2);
      StatusCell(r);
      for (size_t c = 0; c < cols.size(); ++c) {
        ImGui::TableSetColumnIndex(fixed_before + static_cast<int>(c));
        ImGui::TextUnformatted(LookupKey(r->keys, cols[c]).c_str());
      }
      int c = fixed_before + static_cast<int>(cols.size());
      ImGui::TableSetColumnIndex(c++);
      ImGui::TextUnformatted(Opt(r->row.last_loss).c_str());
      ImGui::TableSetColumnIndex(c++);
      ImGui::TextUnformatted(Opt(r->row.best_val_loss).c_str());
      ImGui::TableSetColumnIndex(c++);
      ImGui::TextUnformatted(Opt(r->row.tokens_per_s).c_str());
      ImGui::TableSetColumnIndex(c++);
      if (r->row.shape.total_steps > 0) {
        ImGui::Text("%lld / %lld", static_cast<long long>(r->row.last_step),
                    static_cast<long long>(r->row.shape.total_steps));
      } else {
        ImGui::Text("%lld", static_cast<long long>(r->row.last_step));
      }
      ImGui::PopID();
    }
  }
  ImGui::EndTable();
}

}  // namespace moelab::gui
