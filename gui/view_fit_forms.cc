// The Scaling view's fit forms (see view_fit_forms.h).
#include "gui/view_fit_forms.h"

#include <imgui.h>
#include <imgui_stdlib.h>

#include <algorithm>
#include <set>

#include "analysis/compute_optimal.h"
#include "gui/view_model.h"
#include "gui/widgets.h"

namespace moelab::gui {

namespace {

// "name  value [lo, hi]  (at bound)" rows of a form's parameters.
void DrawParams(const char* id, const std::vector<analysis::ParamEstimate>& params) {
  if (!BeginFitTable(id, 2, params.size())) return;
  ImGui::TableSetupColumn("parameter");
  ImGui::TableSetupColumn("estimate");
  ImGui::TableHeadersRow();
  for (const auto& p : params) {
    ImGui::TableNextRow();
    ImGui::TableSetColumnIndex(0);
    ImGui::TextUnformatted(p.name.c_str());
    ImGui::TableSetColumnIndex(1);
    ImGui::Text("%s%s", EstimateText(p.value, "").c_str(), p.at_bound ? " (at bound)" : "");
  }
  ImGui::EndTable();
}

void DrawWarnings(const std::vector<std::string>& warnings) {
  for (const auto& w : warnings) ImGui::TextWrapped("warning: %s", w.c_str());
}

void DrawJoint(const analysis::JointSparsityFit& fit) {
  for (const auto& form : fit.forms) {
    ImGui::Spacing();
    ImGui::TextWrapped("%s: %s", form.form.c_str(), form.formula.c_str());
    ImGui::TextDisabled("held-out RMSE(log) %.4f on %d points (%s)", form.holdout_rmse_log,
                        form.holdout_points, fit.holdout_rule.c_str());
    DrawParams(("joint " + form.form).c_str(), form.params);
  }
  ImGui::Spacing();
  ImGui::Text("better on held-out points: %s", fit.better_form.c_str());
  DrawWarnings(fit.warnings);
}

void DrawChinchilla(const analysis::ChinchillaFit& fit, std::string* budgets) {
  ImGui::SetNextItemWidth(220);
  ImGui::InputText("budgets (FLOPs)", budgets);
  HelpMarker("Comma-separated FLOPs budgets (e.g. 1e15,1e16) for N_opt and D_opt, as --budgets.");
  ImGui::TextUnformatted("L(N, D) = E + A/N^alpha + B/D^beta");
  DrawParams("chinchilla", fit.params);
  ImGui::Text("N_opt \xe2\x88\x9d C^%s   D_opt \xe2\x88\x9d C^%s",
              EstimateText(fit.exponent_n, "", "%.3f").c_str(),
              EstimateText(fit.exponent_d, "", "%.3f").c_str());
  if (!fit.optimal.empty()) {
    ImGui::TextDisabled(
        "compute-optimal under C = %.3g\xc2\xb7N\xc2\xb7"
        "D (k from the runs' FLOPs)",
        fit.flops_per_param_token);
    if (BeginFitTable("optimal", 4, fit.optimal.size())) {
      ImGui::TableSetupColumn("C");
      ImGui::TableSetupColumn("N_opt");
      ImGui::TableSetupColumn("D_opt");
      ImGui::TableSetupColumn("L");
      ImGui::TableHeadersRow();
      for (const auto& o : fit.optimal) {
        ImGui::TableNextRow();
        ImGui::TableSetColumnIndex(0);
        ImGui::Text("%.3g", o.flops);
        ImGui::TableSetColumnIndex(1);
        ImGui::TextUnformatted(EstimateText(o.params, "", "%.3g").c_str());
        ImGui::TableSetColumnIndex(2);
        ImGui::TextUnformatted(EstimateText(o.tokens, "", "%.3g").c_str());
        ImGui::TableSetColumnIndex(3);
        ImGui::TextUnformatted(EstimateText(o.loss, "", "%.4f").c_str());
      }
      ImGui::EndTable();
    }
  }
  DrawWarnings(fit.warnings);
}

void DrawIsoFlop(const analysis::IsoFlopReport& r) {
  ImGui::Text("IsoFLOP check: %s", r.pitfall ? "PITFALL" : "no pitfall found");
  if (BeginFitTable("isoflop", 5, r.profiles.size())) {
    ImGui::TableSetupColumn("budget (FLOPs)");
    ImGui::TableSetupColumn("sizes");
    ImGui::TableSetupColumn("best N");
    ImGui::TableSetupColumn("vertex N");
    ImGui::TableSetupColumn("vertex offset");
    ImGui::TableHeadersRow();
    for (const auto& p : r.profiles) {
      ImGui::TableNextRow();
      ImGui::TableSetColumnIndex(0);
      ImGui::Text("%.3g", p.flops);
      ImGui::TableSetColumnIndex(1);
      ImGui::Text("%d", p.n_sizes);
      ImGui::TableSetColumnIndex(2);
      ImGui::Text("%.3g", p.best_params);
      ImGui::TableSetColumnIndex(3);
      ImGui::TextUnformatted(p.not_convex ? "not convex" : FormatValue(p.vertex_params).c_str());
      ImGui::TableSetColumnIndex(4);
      ImGui::Text("%+.2f%s", p.vertex_offset, p.minimum_at_edge ? " (edge minimum)" : "");
    }
    ImGui::EndTable();
  }
  for (const auto& issue : r.issues) ImGui::TextWrapped("%s", issue.c_str());
}

// The families of the observations, in value order (the heads form's choices).
std::vector<std::string> FamiliesOf(const analysis::ObservationSet& obs) {
  std::set<std::string> names;
  for (const auto& p : obs.points) names.insert(p.family);
  std::vector<std::string> out(names.begin(), names.end());
  std::stable_sort(out.begin(), out.end(), ValueLess);
  return out;
}

}  // namespace

bool FitFormCombo(std::string* form) {
  bool changed = false;
  ImGui::SetNextItemWidth(120);
  if (ImGui::BeginCombo("form", form->c_str())) {
    for (const std::string& f : analysis::FitForms()) {
      if (ImGui::Selectable(f.c_str(), f == *form)) {
        changed = f != *form;
        *form = f;
      }
    }
    ImGui::EndCombo();
  }
  HelpMarker(
      "The fit form, as `moelab fit --form`: power (per-family laws and FLOPs multipliers), "
      "joint (one law over compute and sparsity), chinchilla (L(N, D) and the compute-optimal "
      "N and D), heads (the heads ablation), isoflop (the IsoFLOP-profile check). Every form "
      "runs analysis::RunFit, as the CLI does.");
  return changed;
}

std::vector<double> BudgetsOf(const std::string& text, std::string* error) {
  error->clear();
  if (text.find_first_not_of(" ,") == std::string::npos) return {};
  try {
    return analysis::ParseBudgets(text);
  } catch (const std::exception& e) {
    *error = e.what();
    return {};
  }
}

bool BeginFitTable(const char* id, int columns, size_t rows) {
  const ImGuiStyle& st = ImGui::GetStyle();
  const float row_h = ImGui::GetTextLineHeight() + 2 * st.CellPadding.y;
  const float h = row_h * static_cast<float>(rows + 1) + st.ScrollbarSize + 4;
  return ImGui::BeginTable(id, columns,
                           ImGuiTableFlags_RowBg | ImGuiTableFlags_BordersInnerV |
                               ImGuiTableFlags_SizingFixedFit | ImGuiTableFlags_ScrollX,
                           ImVec2(0, h));
}

void DrawHeadsAblation(const FitResult& res, const std::vector<std::string>& families,
                       std::string* base, std::string* treatment) {
  ImGui::TextUnformatted("Heads ablation (relative loss difference per budget)");
  auto fam_combo = [&](const char* label, std::string* value) {
    ImGui::SetNextItemWidth(110);
    if (ImGui::BeginCombo(label, value->empty() ? "(none)" : value->c_str())) {
      if (ImGui::Selectable("(none)", value->empty())) value->clear();
      for (const auto& f : families) {
        if (ImGui::Selectable(f.c_str(), f == *value)) *value = f;
      }
      ImGui::EndCombo();
    }
  };
  fam_combo("base", base);
  ImGui::SameLine();
  fam_combo("treatment", treatment);
  HelpMarker(
      "Choose the family key that holds the head count (e.g. model.heads or var:head_ratio), "
      "then the base and the treatment family: analysis::CompareHeads pairs their runs by "
      "token budget and reports (L_treatment - L_base) / L_base at equal tokens and at equal "
      "FLOPs.");
  if (res.heads) {
    const analysis::HeadsAblation& h = *res.heads;
    if (BeginFitTable("heads", 3, h.budgets.size() + 1)) {
      ImGui::TableSetupColumn("tokens");
      ImGui::TableSetupColumn("\xce\x94 equal tokens");
      ImGui::TableSetupColumn("\xce\x94 equal FLOPs");
      ImGui::TableHeadersRow();
      auto pct = [](const analysis::Estimate& e) {
        return EstimateText({100 * e.estimate, 100 * e.lo, 100 * e.hi}, "", "%+.2f%%");
      };
      for (const auto& b : h.budgets) {
        ImGui::TableNextRow();
        ImGui::TableSetColumnIndex(0);
        ImGui::TextUnformatted(FormatValue(b.tokens).c_str());
        ImGui::TableSetColumnIndex(1);
        ImGui::TextUnformatted(pct(b.delta_equal_tokens).c_str());
        ImGui::TableSetColumnIndex(2);
        ImGui::TextUnformatted(pct(b.delta_equal_flops).c_str());
      }
      ImGui::TableNextRow();
      ImGui::TableSetColumnIndex(0);
      ImGui::TextUnformatted("mean");
      ImGui::TableSetColumnIndex(1);
      ImGui::TextUnformatted(pct(h.mean_delta_equal_tokens).c_str());
      ImGui::TableSetColumnIndex(2);
      ImGui::TextUnformatted(pct(h.mean_delta_equal_flops).c_str());
      ImGui::EndTable();
    }
    for (const auto& w : h.warnings) ImGui::TextDisabled("%s", w.c_str());
  } else if (!res.heads_error.empty() || !res.error.empty()) {
    ImGui::TextWrapped("%s", (res.heads_error.empty() ? res.error : res.heads_error).c_str());
  }
}

void DrawFitForm(const FitResult& res, const std::string& family_key, std::string* heads_base,
                 std::string* heads_treatment, std::string* budgets) {
  const analysis::FitResult* r = res.form_result ? &*res.form_result : nullptr;
  if (res.request.form == "heads") {
    DrawHeadsAblation(res, FamiliesOf(res.observations), heads_base, heads_treatment);
    return;
  }
  if (res.request.form == "chinchilla" && (!r || !r->chinchilla)) {
    ImGui::SetNextItemWidth(220);
    ImGui::InputText("budgets (FLOPs)", budgets);
  }
  if (!res.error.empty() || !r) {
    ImGui::PushStyleColor(ImGuiCol_Text, IM_COL32(240, 110, 100, 255));
    ImGui::TextWrapped("No fit: %s", res.error.c_str());
    ImGui::PopStyleColor();
    return;
  }
  ImGui::TextDisabled("families by %s", family_key.c_str());
  if (r->joint) DrawJoint(*r->joint);
  if (r->chinchilla) DrawChinchilla(*r->chinchilla, budgets);
  if (r->isoflop) DrawIsoFlop(*r->isoflop);
}

}  // namespace moelab::gui
