#include "gui/view_adaptive.h"

#include <fmt/format.h>
#include <imgui.h>

#include <chrono>
#include <cmath>
#include <optional>
#include <vector>

#include "sweeps/adaptive_chooser.h"
#include "sweeps/adaptive_store.h"
#include "sweeps/spec.h"
#include "sweeps/store.h"

namespace moelab::gui {

namespace {

using Clock = std::chrono::steady_clock;

struct AdaptiveState {
  std::string db, name;
  Clock::time_point read_at;
  std::optional<sweeps::AdaptiveSpec> spec;
  std::string grid_comparison;  // after the rule stopped: the cost against the fixed grids
  std::vector<sweeps::AdaptiveBatchRow> batches;
  std::vector<sweeps::AdaptiveLookRow> looks;
  std::string error;
};

// Re-reads the sweep's adaptive rows at most every two seconds (the panel is drawn every frame).
const AdaptiveState& Load(const std::string& db, const std::string& name) {
  static AdaptiveState state;
  const bool stale = Clock::now() - state.read_at > std::chrono::seconds(2);
  if (state.db == db && state.name == name && !stale) return state;
  state = AdaptiveState();
  state.db = db;
  state.name = name;
  state.read_at = Clock::now();
  try {
    sweeps::Store store(db, sweeps::Store::Mode::kReadOnly);
    const auto row = store.FindSweep(name);
    if (!row) return state;
    const auto spec = sweeps::ojson::parse(row->spec_json);
    if (!spec.contains("adaptive")) return state;
    const sweeps::Sweep sweep = sweeps::ExpandSpec(spec);
    state.spec = sweep.adaptive;
    sweeps::AdaptiveStore astore(store.connection());
    state.batches = astore.Batches(row->id);
    state.looks = astore.Looks(row->id);
    if (state.spec && !state.looks.empty()) {
      state.grid_comparison = sweeps::CostAgainstGrids(sweeps::BuildSpace(sweep, *state.spec),
                                                       *state.spec, state.looks.back());
    }
  } catch (const std::exception& e) {
    state.error = e.what();
  }
  return state;
}

}  // namespace

void AdaptivePanel(const std::string& db_path, const std::string& sweep_name) {
  if (db_path.empty()) return;
  const AdaptiveState& s = Load(db_path, sweep_name);
  if (!s.error.empty()) {
    ImGui::Separator();
    ImGui::TextWrapped("adaptive: %s", s.error.c_str());
    return;
  }
  if (!s.spec) return;
  ImGui::Separator();
  ImGui::TextWrapped("Question: %s", sweeps::DescribeQuestion(*s.spec).c_str());
  double spent = 0;
  for (const auto& b : s.batches) spent += b.cost_flops;
  const float share =
      s.spec->budget_flops > 0 ? static_cast<float>(spent / s.spec->budget_flops) : 0;
  const std::string budget =
      fmt::format("{:.3g} of {:.3g} FLOPs spent, {:.3g} left", spent, s.spec->budget_flops,
                  std::max(0.0, s.spec->budget_flops - spent));
  ImGui::ProgressBar(std::min(1.0f, share), ImVec2(-1, 0), budget.c_str());
  if (s.batches.empty()) {
    ImGui::TextDisabled("No batch chosen yet (`moelab sweep run SPEC --adaptive`).");
    return;
  }
  if (ImGui::BeginTable(
          "adaptive_looks", 5,
          ImGuiTableFlags_RowBg | ImGuiTableFlags_BordersInnerV | ImGuiTableFlags_SizingFixedFit)) {
    ImGui::TableSetupColumn("batch");
    ImGui::TableSetupColumn("runs");
    ImGui::TableSetupColumn("FLOPs");
    ImGui::TableSetupColumn("estimate [repeated interval]");
    ImGui::TableSetupColumn("decision", ImGuiTableColumnFlags_WidthStretch);
    ImGui::TableHeadersRow();
    for (const auto& b : s.batches) {
      const sweeps::AdaptiveLookRow* look = nullptr;
      for (const auto& l : s.looks)
        if (l.batch == b.batch) look = &l;
      ImGui::TableNextRow();
      ImGui::TableSetColumnIndex(0);
      ImGui::PushID(b.batch);
      const bool open = ImGui::TreeNodeEx("##why", ImGuiTreeNodeFlags_SpanFullWidth, "%d", b.batch);
      ImGui::TableSetColumnIndex(1);
      ImGui::Text("%zu", b.runs.size());
      ImGui::TableSetColumnIndex(2);
      ImGui::TextUnformatted(fmt::format("{:.3g}", b.cost_flops).c_str());
      ImGui::TableSetColumnIndex(3);
      if (!look) {
        ImGui::TextDisabled("training");
      } else if (std::isnan(look->lo)) {
        ImGui::Text("%d seeds, no interval yet", look->seeds);
      } else {
        ImGui::TextUnformatted(fmt::format("{:.4f} [{:.4f}, {:.4f}], {} seeds", look->estimate,
                                           look->lo, look->hi, look->seeds)
                                   .c_str());
      }
      ImGui::TableSetColumnIndex(4);
      ImGui::TextUnformatted(look ? look->decision.c_str() : "");
      if (open) {
        for (const std::string& why : b.why) {
          ImGui::TableNextRow();
          ImGui::TableSetColumnIndex(4);
          ImGui::TextWrapped("why: %s", why.c_str());
        }
        ImGui::TreePop();
      }
      ImGui::PopID();
    }
    ImGui::EndTable();
  }
  if (!s.grid_comparison.empty()) ImGui::TextWrapped("Cost: %s", s.grid_comparison.c_str());
}

}  // namespace moelab::gui
