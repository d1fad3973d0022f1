// The scaling view of moelab-gui (App::*View and its helpers).
#include <imgui.h>
#include <imgui_internal.h>
#include <imgui_stdlib.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <functional>
#include <limits>
#include <numeric>
#include <set>

#include "analysis/frontier.h"
#include "analysis/model_free.h"
#include "gui/app.h"
#include "gui/app_internal.h"
#include "gui/fits.h"
#include "gui/view_fit_forms.h"
#include "gui/widgets.h"

namespace moelab::gui {

// ---- Scaling laws ---------------------------------------------------------------------------

namespace {

// "name value [lo, hi]" of each parameter of a stored power-law family fit; a parameter
// without an interval says why (the family's interval note), never "nan".
std::string ParamsText(const nlohmann::json& family) {
  std::string out;
  const std::string note = family.value("interval_note", std::string());
  for (const auto& p : family.value("params", nlohmann::json::array())) {
    if (!p.is_object() || !p.contains("name")) continue;
    const nlohmann::json& v = p.value("value", nlohmann::json());
    std::string value = "?";
    if (v.is_object() && v.contains("estimate") && v["estimate"].is_number()) {
      auto num = [&](const char* k) { return v[k].is_number() ? v[k].get<double>() : NAN; };
      value = EstimateText({num("estimate"), num("lo"), num("hi")}, note);
    } else if (v.is_number()) {
      value = EstimateText({v.get<double>(), NAN, NAN}, note);
    }
    out += (out.empty() ? "" : "   ") + p["name"].get<std::string>() + " " + value;
  }
  return out;
}

// The model-free primary reading (analysis/model_free.h) beside the fit: FLOPs to each target
// loss interpolated on every seed's own points, as a ratio to the reference, paired by seed.
// Drawn as stored or as computed with the fit (gui/fits.cc), with the fit's own options.
void DrawModelFree(const FitResult& res, const std::string& key,
                   std::map<std::string, ImU32>& fam_color) {
  // Which estimand the numbers are (analysis/frontier.h): a frontier over model sizes or one
  // size's training curve.
  const std::string estimand =
      analysis::EstimandLabel(analysis::EstimandOf(res.observations.points));
  ImGui::TextWrapped(
      "Model-free (primary; verdicts rest on it), estimand %s: FLOPs to reach L*, interpolated "
      "on each seed's points, relative to the reference (geometric mean over seeds):",
      estimand.c_str());
  if (!res.model_free) {
    ImGui::TextWrapped("unavailable: %s (the fitted law below is the only reading)",
                       res.model_free_error.c_str());
    return;
  }
  analysis::ModelFreeTable t = *res.model_free;
  std::stable_sort(t.rows.begin(), t.rows.end(), [](const auto& a, const auto& b) {
    if (a.target_loss != b.target_loss) return a.target_loss < b.target_loss;
    return ValueLess(a.family, b.family);
  });
  ImGui::PushStyleColor(ImGuiCol_Text, ImGui::GetStyleColorVec4(ImGuiCol_TextDisabled));
  ImGui::TextWrapped("reference %s = %s; loss range every (family, seed) covers [%.4f, %.4f]",
                     key.c_str(), t.reference.c_str(), t.range_lo, t.range_hi);
  ImGui::PopStyleColor();
  std::set<std::string> notes;
  if (BeginFitTable("model free", 5, t.rows.size())) {
    ImGui::TableSetupColumn("L*");
    ImGui::TableSetupColumn(key.c_str());
    ImGui::TableSetupColumn("seeds");
    ImGui::TableSetupColumn("FLOPs ratio");
    ImGui::TableSetupColumn("tokens ratio");
    ImGui::TableHeadersRow();
    for (const auto& r : t.rows) {
      ImGui::TableNextRow();
      ImGui::TableSetColumnIndex(0);
      ImGui::Text("%.4f", r.target_loss);
      ImGui::TableSetColumnIndex(1);
      ImGui::TextColored(ImGui::ColorConvertU32ToFloat4(fam_color[r.family]), "%s",
                         r.family.c_str());
      ImGui::TableSetColumnIndex(2);
      ImGui::Text("%zu", r.seeds.size());
      ImGui::TableSetColumnIndex(3);
      ImGui::TextUnformatted(EstimateText(r.flops_ratio, r.interval_note, "%.3f").c_str());
      ImGui::TableSetColumnIndex(4);
      ImGui::TextUnformatted(EstimateText(r.tokens_ratio, r.interval_note, "%.3f").c_str());
      if (!r.interval_note.empty()) notes.insert(r.interval_note);
    }
    ImGui::EndTable();
  }
  for (const auto& n : notes) ImGui::TextWrapped("intervals: %s", n.c_str());
  for (const auto& n : t.notes) ImGui::TextWrapped("note: %s", n.c_str());
}

}  // namespace

bool App::StoredFits(uint64_t data_version, const std::vector<double>& ended) {
  const std::string key = settings_.family_key.rfind("var:", 0) == 0
                              ? settings_.family_key.substr(4)
                              : settings_.family_key;
  Signature sig;
  sig.Add(scaling_.sweep).Add(data_version).Add(std::hash<std::string>{}(key));
  if (sig.h != scaling_.stored_key) {
    scaling_.stored_key = sig.h;
    scaling_.stored.clear();
    try {
      std::optional<int64_t> sweep;
      if (scaling_.sweep >= 0) sweep = scaling_.sweep;
      for (auto& f : db::ListFits(store_->path(), sweep)) {
        if (f.family_key == key) scaling_.stored.push_back(std::move(f));
      }
    } catch (const std::exception&) {
      // An older database without the fits table: nothing stored.
    }
    scaling_.stored_result.reset();
    scaling_.stored_error.clear();
    for (const db::FitRecord& f : scaling_.stored) {
      if (f.form != "power") continue;
      std::string why;
      if (auto r = FitResultFromStored(f, &why)) {
        scaling_.stored_result = std::make_shared<const FitResult>(std::move(*r));
      } else {
        scaling_.stored_error = "stored fit #" + std::to_string(f.id) + ": " + why;
      }
      break;  // the newest power-law fit only
    }
  }
  if (!scaling_.stored.empty() &&
      ImGui::CollapsingHeader("Stored fits (moelab fit)",
                              scaling_.stored_result ? 0 : ImGuiTreeNodeFlags_DefaultOpen)) {
    for (size_t i = 0; i < scaling_.stored.size() && i < 5; ++i) {
      const db::FitRecord& f = scaling_.stored[i];
      const std::time_t t = static_cast<std::time_t>(f.created_at);
      char when[32] = "?";
      std::strftime(when, sizeof when, "%Y-%m-%d %H:%M", std::localtime(&t));
      ImGui::Text("#%lld  %s  %s by %s", static_cast<long long>(f.id), when, f.form.c_str(),
                  f.family_key.c_str());
      const nlohmann::json r = nlohmann::json::parse(f.result_json, nullptr, false);
      // `moelab fit` stores {"fits": {"families": [...]}, "multipliers": {...}}; older rows
      // (and the GUI's own fits) keep the families at the top level.
      const nlohmann::json& fits = r.is_object() && r.contains("fits") ? r["fits"] : r;
      if (fits.is_object() && fits.contains("families") && fits["families"].is_array()) {
        for (const auto& fam : fits["families"]) {
          if (!fam.is_object()) continue;
          const std::string name = fam.value("family", std::string("?"));
          ImGui::TextDisabled("    %s: %s", name.c_str(), ParamsText(fam).c_str());
        }
      }
    }
  }
  if (!scaling_.stored_result) {
    if (!scaling_.stored_error.empty()) {
      ImGui::TextDisabled("Fitted here instead: %s.", scaling_.stored_error.c_str());
    }
    return true;
  }
  const FitResult& s = *scaling_.stored_result;
  const db::FitRecord& row = scaling_.stored.front();
  const int newer = static_cast<int>(
      std::count_if(ended.begin(), ended.end(), [&](double e) { return e > row.created_at; }));
  if (scaling_.fit_requested) {
    ImGui::TextWrapped(
        "Recomputed here with the options of stored fit #%lld (not stored). The stored result "
        "is unchanged:",
        static_cast<long long>(s.stored_fit));
    ImGui::SameLine();
    if (ImGui::SmallButton("Show stored fit")) scaling_.fit_requested = false;
    return true;
  }
  ImGui::TextWrapped(
      "Stored fit #%lld as `moelab fit` stored it: every estimate, interval and option below "
      "is the row's, nothing is recomputed. No bands (the row holds intervals, not the bootstrap "
      "draws a band needs).",
      static_cast<long long>(s.stored_fit));
  if (newer > 0) {
    ImGui::TextColored(ImVec4(0.9f, 0.8f, 0.3f, 1),
                       "%d finished run%s ended after this fit: Recompute to include them.", newer,
                       newer == 1 ? "" : "s");
  }
  if (ImGui::Button("Recompute with these options (in the background)")) {
    scaling_.fit_requested = true;
  }
  return false;
}

void App::ScalingView() {
  if (!scaling_.fit_job) scaling_.fit_job = std::make_unique<FitJob>();
  const RunsSnapshot& rs = *runs_;
  // Scope: a sweep or every run.
  std::string sweep_label = "(all runs)";
  if (scaling_.sweep >= 0) {
    auto it = rs.sweeps.find(scaling_.sweep);
    sweep_label = it != rs.sweeps.end() ? it->second : "#" + std::to_string(scaling_.sweep);
  }
  ImGui::SetNextItemWidth(180);
  if (ImGui::BeginCombo("sweep", sweep_label.c_str())) {
    if (ImGui::Selectable("(all runs)", scaling_.sweep < 0)) scaling_.sweep = -1;
    for (const auto& [id, name] : rs.sweeps) {
      if (ImGui::Selectable(name.c_str(), scaling_.sweep == id)) scaling_.sweep = id;
    }
    ImGui::EndCombo();
  }
  ImGui::SameLine();
  ImGui::SetNextItemWidth(200);
  KeyCombo("family", &settings_.family_key, rs, "(choose a key)");
  HelpMarker(
      "Runs are grouped into families by this sweep variable or config key. Each family's "
      "compute-optimal frontier (lower envelope of validation loss over training FLOPs) is "
      "fitted with L(C) = E + A·C^-α by analysis/ (Huber loss in log space, bootstrap over "
      "runs, 200 resamples here). Drag the dashed target line to move L*.");
  ImGui::SameLine();
  FitFormCombo(&scaling_.form);
  // A key this database does not have (say, last session's): fall back to its first sweep
  // variable rather than an empty view.
  const bool known =
      settings_.family_key.rfind("var:", 0) == 0
          ? std::binary_search(rs.var_keys.begin(), rs.var_keys.end(),
                               settings_.family_key.substr(4))
          : std::binary_search(rs.config_keys.begin(), rs.config_keys.end(), settings_.family_key);
  if (!known && !rs.var_keys.empty()) settings_.family_key = "var:" + rs.var_keys.front();
  if (settings_.family_key.empty()) {
    ImGui::TextDisabled("Choose the key that defines the families (e.g. var:sparsity).");
    return;
  }
  // Refit (without a stored fit to show) when the set of finished runs in scope changes.
  Signature data;
  std::vector<double> ended;
  for (const auto& r : rs.runs) {
    if (scaling_.sweep >= 0 && r->row.sweep_id != scaling_.sweep) continue;
    if (r->row.effective_status != RunStatus::kDone &&
        r->row.effective_status != RunStatus::kDiverged)
      continue;
    data.Add(r->row.id).Add(r->row.updated_at.value_or(0));
    ended.push_back(r->row.ended_at.value_or(r->row.updated_at.value_or(0)));
  }
  // The newest stored fit is drawn as stored; analysis/ fits here only without one or when
  // Recompute was pressed (then with the stored fit's options).
  const bool power = scaling_.form == "power";  // stored fits are drawn for the power form
  const bool use_stored = power && !StoredFits(data.h, ended);
  FitRequest req;
  if (power && scaling_.stored_result && scaling_.fit_requested) {
    req = RequestFromStored(*scaling_.stored_result, store_->path());
  } else {
    req.db_path = store_->path();
    if (scaling_.sweep >= 0) req.sweep_id = scaling_.sweep;
    req.family_key = settings_.family_key.rfind("var:", 0) == 0 ? settings_.family_key.substr(4)
                                                                : settings_.family_key;
    req.reference = scaling_.chosen_reference;  // the model-free table follows the chooser
  }
  req.heads_base = scaling_.heads_base;
  req.heads_treatment = scaling_.heads_treatment;
  req.form = scaling_.form;
  if (req.form == "chinchilla") req.budgets = BudgetsOf(scaling_.budgets, &scaling_.budgets_error);
  req.data_version = data.h;
  std::shared_ptr<const FitResult> res;
  if (use_stored) {
    res = scaling_.stored_result;
    if (!res) return;
    if (res->stored_multipliers && res->stored_multipliers->target_loss > 0 &&
        scaling_.target_family_key != req.family_key) {
      // L* where the stored multipliers were computed.
      scaling_.target_family_key = req.family_key;
      scaling_.target_loss = res->stored_multipliers->target_loss;
    }
    ImGui::TextDisabled("%d runs, %zu points", res->observations.runs_used,
                        res->observations.points.size());
  } else {
    scaling_.fit_job->Submit(req);
    res = scaling_.fit_job->Result();
    const bool busy = scaling_.fit_job->Busy();
    if (busy || !res || !(res->request == req)) frame_settled_ = false;
    if (busy) {
      ImGui::TextColored(ImVec4(0.9f, 0.8f, 0.3f, 1), "fitting...");
      ImGui::SameLine();
    }
    if (!res) return;
    if (res->request.family_key != req.family_key || res->request.sweep_id != req.sweep_id ||
        res->request.form != req.form) {
      ImGui::TextDisabled("fitting %s ...", req.family_key.c_str());
      return;
    }
    ImGui::TextDisabled("%d runs, %zu points, %zu skipped, fitted in %.1f s",
                        res->observations.runs_used, res->observations.points.size(),
                        res->observations.skipped.size(), res->seconds);
  }
  if (ImGui::IsItemHovered() && !res->observations.skipped.empty()) {
    ImGui::BeginTooltip();
    for (size_t i = 0; i < res->observations.skipped.size() && i < 30; ++i) {
      ImGui::TextUnformatted(res->observations.skipped[i].c_str());
    }
    ImGui::EndTooltip();
  }
  {
    std::string text;
    for (const std::string& o : OptionsText(res->options)) text += (text.empty() ? "" : "; ") + o;
    if (use_stored && !res->options_stored) {
      ImGui::TextWrapped("Options: not stored with this row (a `moelab fit` older than them).");
    } else {
      ImGui::TextWrapped("Options%s: %s.", use_stored ? " (stored)" : "", text.c_str());
    }
  }
  if (!power) {
    if (!scaling_.budgets_error.empty())
      ImGui::TextWrapped("budgets: %s", scaling_.budgets_error.c_str());
    DrawFitForm(*res, req.family_key, &scaling_.heads_base, &scaling_.heads_treatment,
                &scaling_.budgets);
    return;
  }
  if (!res->error.empty() || !res->fits) {
    ImGui::PushStyleColor(ImGuiCol_Text, IM_COL32(240, 110, 100, 255));
    ImGui::TextWrapped("No fit: %s", res->error.c_str());
    ImGui::PopStyleColor();
    return;
  }
  if (!res->law_error.empty()) {
    // No law could be fitted, but the model-free table could: it stands alone (as in the CLI).
    std::map<std::string, ImU32> colors;
    if (res->model_free)
      for (const auto& row : res->model_free->rows) colors[row.family] = IM_COL32_WHITE;
    DrawModelFree(*res, req.family_key, colors);
    ImGui::TextWrapped("Fitted law (secondary): not fitted: %s", res->law_error.c_str());
    return;
  }
  ScalingLaws(*res, use_stored);
}

// The power form: each family's points, frontier and law beside the tables.
void App::ScalingLaws(const FitResult& fit, bool use_stored) {
  const FitResult* res = &fit;
  const FitRequest& req = res->request;
  const analysis::FamilyFits& fits = *res->fits;
  std::vector<std::string> families;
  for (const auto& f : fits.families) families.push_back(f.family);
  std::stable_sort(families.begin(), families.end(), ValueLess);
  bool ordered = true;
  for (const auto& f : families) ordered = ordered && IsNumber(f);
  std::map<std::string, ImU32> fam_color;
  for (size_t i = 0; i < families.size(); ++i) {
    fam_color[families[i]] =
        ToImU32(GroupColor(static_cast<int>(i), static_cast<int>(families.size()), ordered));
  }
  if (std::find(families.begin(), families.end(), scaling_.fit_reference) == families.end()) {
    scaling_.fit_reference =
        families.back();  // the sparsest / largest value: the report's reference
  }
  // Default L*: inside every family's measured frontier loss range.
  double lo_all = -INFINITY, hi_all = INFINITY;
  for (const auto& f : fits.families) {
    lo_all = std::max(lo_all, f.min_loss);
    hi_all = std::min(hi_all, f.max_loss);
  }
  if (!(scaling_.target_loss > 0) || scaling_.target_family_key != req.family_key) {
    scaling_.target_family_key = req.family_key;
    scaling_.target_loss = hi_all > lo_all ? lo_all + 0.3 * (hi_all - lo_all) : lo_all;
  }

  ScalingPlot(fit, use_stored, families, ordered, &fam_color);
  ImGui::SameLine();
  ScalingTables(fit, use_stored, families, &fam_color);
}

// The plot: points, bands, laws and frontiers by family, the draggable L* line, the legend.
void App::ScalingPlot(const FitResult& result, bool use_stored,
                      const std::vector<std::string>& families, bool ordered,
                      std::map<std::string, ImU32>* colors) {
  const FitResult* res = &result;
  const FitRequest& req = res->request;
  const analysis::FamilyFits& fits = *res->fits;
  std::map<std::string, ImU32>& fam_color = *colors;
  const ImVec2 avail = ImGui::GetContentRegionAvail();
  const float plot_w = avail.x * 0.6f;
  ImGui::BeginGroup();
  PlotBounds fit;
  for (const auto& p : res->observations.points) {
    if (p.flops > 0 && p.loss > 0 && std::isfinite(p.loss)) fit.Add(p.flops, p.loss);
  }
  // Room for the frontier dots at the left and right edges (the plot pads y, not x): 4 % of
  // the decades shown on each side.
  if (fit.x_lo > 0 && fit.x_hi > fit.x_lo) {
    const double pad = std::pow(fit.x_hi / fit.x_lo, 0.04);
    fit.x_lo /= pad;
    fit.x_hi *= pad;
  }
  // Dragging the target line must not pan the plot.
  const ImVec2 mouse = ImGui::GetIO().MousePos;
  // A stored fit has multipliers at its own L* only: the line stays there.
  const bool near_target = !use_stored && std::abs(mouse.y - scaling_.target_px) < 6 &&
                           mouse.x > scaling_.plot_rect.Min.x && mouse.x < scaling_.plot_rect.Max.x;
  if (near_target && ImGui::IsMouseClicked(ImGuiMouseButton_Left)) scaling_.dragging_target = true;
  if (!ImGui::IsMouseDown(ImGuiMouseButton_Left)) scaling_.dragging_target = false;
  {
    Plot plot("scaling", ImVec2(plot_w, -ImGui::GetFrameHeightWithSpacing() * 1.5f), &scaling_.x,
              &scaling_.y, fit, true, true, "validation loss vs training FLOPs (log-log)",
              "training FLOPs", !scaling_.dragging_target && !near_target);
    scaling_.plot_rect = plot.inner();
    if (scaling_.dragging_target) scaling_.target_loss = plot.mouse_y();
    Signature sig;
    sig.Add(res).Add(ordered);
    LineCanvas& canvas = Canvas("scaling");
    if (canvas.Begin(plot, sig.h, sig.h)) {
      for (const auto& b : res->bands) {
        if (!b.has_band()) continue;  // a stored fit: no draws
        canvas.FillBetween(plot, b.flops, b.lo, b.hi,
                           (fam_color[b.family] & 0x00FFFFFF) | 0x38000000);
      }
      for (const auto& p : res->observations.points) {
        canvas.Dot(plot, p.flops, p.loss, (fam_color[p.family] & 0x00FFFFFF) | 0x60000000, 1.6f);
      }
      for (const auto& b : res->bands)
        canvas.Line(plot, b.flops, b.loss, fam_color[b.family], 1.6f);
      for (const auto& f : fits.families) {
        std::vector<double> fx, fy;
        for (const auto& p : f.frontier) {
          fx.push_back(p.flops);
          fy.push_back(p.loss);
          canvas.Dot(plot, p.flops, p.loss, fam_color[f.family], 3.2f);
        }
      }
    }
    canvas.End(plot);
    plot.HLine(scaling_.target_loss, IM_COL32(240, 240, 240, 200), true, nullptr);
    scaling_.target_px = plot.ToPixel(plot.x_axis().lo, scaling_.target_loss).y;
    const std::string t =
        "L* = " + FormatValue(scaling_.target_loss) + (use_stored ? " (stored)" : " (drag)");
    plot.draw_list()->AddText(
        ImVec2(plot.inner().Min.x + 6, scaling_.target_px - ImGui::GetFontSize() - 2),
        IM_COL32(240, 240, 240, 230), t.c_str());
    if (near_target || scaling_.dragging_target) ImGui::SetMouseCursor(ImGuiMouseCursor_ResizeNS);
    if (plot.hovered() && !scaling_.dragging_target) {
      ImGui::BeginTooltip();
      ImGui::Text("C = %s FLOPs", FormatValue(plot.mouse_x()).c_str());
      for (const auto& f : fits.families) {
        ImGui::TextColored(ImGui::ColorConvertU32ToFloat4(fam_color[f.family]), "%s: L = %s",
                           f.family.c_str(), FormatValue(f.LossAtCompute(plot.mouse_x())).c_str());
      }
      ImGui::EndTooltip();
    }
  }
  // Family legend.
  for (size_t i = 0; i < families.size(); ++i) {
    if (i > 0) ImGui::SameLine();
    ImGui::TextColored(ImGui::ColorConvertU32ToFloat4(fam_color[families[i]]),
                       "\xe2\x96\xa0 %s = %s", req.family_key.c_str(), families[i].c_str());
  }
  ImGui::EndGroup();
}

// The tables: multipliers at L*, the model-free reading, the fitted laws, the heads ablation.
void App::ScalingTables(const FitResult& fit, bool use_stored,
                        const std::vector<std::string>& families,
                        std::map<std::string, ImU32>* colors) {
  const FitResult* res = &fit;
  const FitRequest& req = res->request;
  const analysis::FamilyFits& fits = *res->fits;
  std::map<std::string, ImU32>& fam_color = *colors;
  // Right: multiplier table, fit parameters, heads ablation.
  ImGui::BeginChild("fit tables", ImVec2(0, 0), false);
  const analysis::MultiplierTable* stored_table =
      use_stored && res->stored_multipliers ? &*res->stored_multipliers : nullptr;
  if (stored_table) {
    scaling_.fit_reference = stored_table->reference;
    ImGui::TextWrapped(
        "FLOPs to reach L* = %s relative to %s = %s as `moelab fit` stored them (C_family / "
        "C_reference, bootstrap interval; Recompute for another L* or reference):",
        FormatValue(stored_table->target_loss).c_str(), req.family_key.c_str(),
        stored_table->reference.c_str());
  } else {
    ImGui::SetNextItemWidth(140);
    if (ImGui::BeginCombo("reference", scaling_.fit_reference.c_str())) {
      for (const auto& f : families) {
        if (ImGui::Selectable(f.c_str(), f == scaling_.fit_reference)) {
          scaling_.fit_reference = scaling_.chosen_reference = f;
        }
      }
      ImGui::EndCombo();
    }
    ImGui::TextWrapped(
        "FLOPs to reach L* = %s relative to %s = %s (C_family / C_reference, %.0f%% "
        "bootstrap interval):",
        FormatValue(scaling_.target_loss).c_str(), req.family_key.c_str(),
        scaling_.fit_reference.c_str(), 100 * res->options.level);
  }
  try {
    analysis::MultiplierOptions mo;
    mo.level = res->options.level;
    analysis::MultiplierTable table =
        stored_table ? *stored_table
                     : analysis::ComputeMultiplierTable(fits, scaling_.fit_reference,
                                                        scaling_.target_loss, mo);
    if (BeginFitTable("multipliers", 3, table.rows.size())) {
      ImGui::TableSetupColumn("family");
      ImGui::TableSetupColumn("multiplier");
      ImGui::TableSetupColumn("FLOPs to L*");
      ImGui::TableHeadersRow();
      std::stable_sort(table.rows.begin(), table.rows.end(),
                       [](const auto& a, const auto& b) { return ValueLess(a.family, b.family); });
      for (const auto& row : table.rows) {
        ImGui::TableNextRow();
        ImGui::TableSetColumnIndex(0);
        ImGui::TextColored(ImGui::ColorConvertU32ToFloat4(fam_color[row.family]), "%s",
                           row.family.c_str());
        ImGui::TableSetColumnIndex(1);
        if (row.ok) {
          ImGui::TextUnformatted(EstimateText(row.multiplier, row.interval_note, "%.3f").c_str());
          for (const auto& flag : row.flags) {
            if (ImGui::IsItemHovered()) ImGui::SetTooltip("%s", flag.c_str());
          }
          ImGui::TableSetColumnIndex(2);
          ImGui::TextUnformatted(
              EstimateText(row.compute_family, row.interval_note, "%.3g").c_str());
        } else {
          ImGui::TextDisabled("refused");
          ImGui::TableSetColumnIndex(2);
          ImGui::TextDisabled("%s", row.refusal.c_str());
        }
      }
      ImGui::EndTable();
    }
  } catch (const std::exception& e) {
    ImGui::TextWrapped("%s", e.what());
  }
  ImGui::Spacing();
  DrawModelFree(*res, req.family_key, fam_color);
  ImGui::Spacing();
  ImGui::TextWrapped(
      "Fitted L(C) = E + A·(C/1e15)^-α per family (secondary, smoothed), estimand %s:",
      analysis::EstimandLabel(analysis::EstimandOf(res->observations.points)).c_str());
  if (BeginFitTable("params", 7, families.size())) {
    ImGui::TableSetupColumn("family");
    ImGui::TableSetupColumn("seeds");
    ImGui::TableSetupColumn("points");
    ImGui::TableSetupColumn("E");
    ImGui::TableSetupColumn("A");
    ImGui::TableSetupColumn("\xce\xb1");
    ImGui::TableSetupColumn("rmse(log)");
    ImGui::TableHeadersRow();
    for (const auto& name : families) {
      const analysis::PowerLawFit& f = fits.Get(name);
      ImGui::TableNextRow();
      ImGui::TableSetColumnIndex(0);
      ImGui::TextColored(ImGui::ColorConvertU32ToFloat4(fam_color[name]), "%s%s", name.c_str(),
                         f.misfit.rejected ? "  form rejected" : "");
      if (f.misfit.rejected && ImGui::IsItemHovered()) {
        ImGui::SetTooltip("%s", f.misfit.reason.c_str());
      }
      ImGui::TableSetColumnIndex(1);
      ImGui::Text("%d", f.n_units);
      ImGui::TableSetColumnIndex(2);
      ImGui::Text("%d", f.diagnostics.n_points);
      for (const auto& p : f.params) {
        const int col = p.name == "E" ? 3 : p.name == "A" ? 4 : p.name == "alpha" ? 5 : -1;
        if (col < 0) continue;
        ImGui::TableSetColumnIndex(col);
        ImGui::Text("%s%s", EstimateText(p.value, f.interval_note).c_str(),
                    p.at_bound ? " (at bound)" : "");
      }
      ImGui::TableSetColumnIndex(6);
      ImGui::Text("%.4f", f.diagnostics.rmse_log);
    }
    ImGui::EndTable();
  }
  std::set<std::string> notes;
  for (const auto& f : fits.families) {
    if (!f.interval_note.empty()) notes.insert(f.interval_note);
  }
  for (const auto& n : notes) ImGui::TextWrapped("intervals: %s", n.c_str());
  for (const auto& w : fits.warnings) ImGui::TextWrapped("%s", w.c_str());
  if (use_stored && !res->stored_basis.empty()) {
    ImGui::TextWrapped("verdict rests on: %s", res->stored_basis.c_str());
  }

  ImGui::Spacing();
  ImGui::Separator();
  DrawHeadsAblation(*res, families, &scaling_.heads_base, &scaling_.heads_treatment);
  ImGui::EndChild();
}

}  // namespace moelab::gui
