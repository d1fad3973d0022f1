#include "gui/full_runs_view.h"

#include <fmt/format.h>
#include <imgui.h>

#include <cmath>
#include <string>

#include "promote/plan.h"

namespace moelab::gui {

namespace {

const ImU32 kBandColor = IM_COL32(90, 160, 255, 60);
const ImU32 kLawColor = IM_COL32(120, 180, 255, 255);
const ImU32 kSweepColor = IM_COL32(205, 205, 205, 210);
const ImU32 kRunColor = IM_COL32(255, 170, 60, 255);
const ImU32 kOutsideColor = IM_COL32(240, 90, 80, 255);
const ImU32 kInsideColor = IM_COL32(110, 200, 110, 255);

double Num(const nlohmann::json& j, const char* a, const char* b = nullptr) {
  const nlohmann::json* p = &j;
  if (!p->contains(a)) return NAN;
  p = &(*p)[a];
  if (b) {
    if (!p->contains(b)) return NAN;
    p = &(*p)[b];
  }
  return p->is_number() ? p->get<double>() : NAN;
}

std::string Bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) b /= 1024, ++u;
  return fmt::format("{:.1f} {}", b, units[u]);
}

}  // namespace

void FullRunsView::Draw(const std::string& db_path, bool* settled) {
  if (!loader_ || loader_->path() != db_path) {
    loader_ = std::make_unique<FullRunsLoader>(db_path);
    selected_ = -1;
  }
  loader_->Select(selected_);
  const auto data = loader_->Data();
  if (!data || (selected_ >= 0 && data->promotion != selected_)) {
    *settled = false;
    ImGui::TextDisabled("loading promotions...");
    return;
  }
  if (!data->error.empty()) {
    ImGui::TextColored(ImVec4(0.95f, 0.45f, 0.4f, 1), "%s", data->error.c_str());
    return;
  }
  if (data->promotions.empty()) {
    ImGui::TextWrapped(
        "No promotions in this database. Plan one with `moelab promote --db FILE --sweep NAME "
        "--family KEY=VALUE --budget-flops C` or the Promote tab.");
    return;
  }
  // Chooser: promotion id, family, target.
  auto label = [](const db::PromotionRecord& p) {
    return fmt::format("#{}  {}={}  ({} law)  run {}", p.id, p.family_key, p.family, p.law,
                       p.run_id ? std::to_string(*p.run_id) : "-");
  };
  std::string current = "(newest)";
  for (const auto& p : data->promotions)
    if (p.id == data->promotion) current = label(p);
  ImGui::SetNextItemWidth(360);
  if (ImGui::BeginCombo("promotion", current.c_str())) {
    for (const auto& p : data->promotions)
      if (ImGui::Selectable(label(p).c_str(), p.id == data->promotion)) selected_ = p.id;
    ImGui::EndCombo();
  }
  const nlohmann::json& plan = data->plan;
  const double pred = Num(plan, "loss", "estimate"), lo = Num(plan, "band", "lo"),
               hi = Num(plan, "band", "hi");
  ImGui::SameLine();
  ImGui::TextDisabled("predicted %.4f, band [%.4f, %.4f] at %.3g FLOPs", pred, lo, hi,
                      Num(plan, "flops"));

  const RunCurve& run = data->promoted;
  ImGui::Text("run %lld '%s' %s", static_cast<long long>(run.run), run.name.c_str(),
              ToString(run.status));
  ImGui::SameLine();
  if (run.loss.empty()) {
    ImGui::TextDisabled("  no evaluation yet");
  } else {
    const double d = data->last_band_units;
    ImGui::TextColored(ImGui::ColorConvertU32ToFloat4(data->outside ? kOutsideColor : kInsideColor),
                       "  last val loss %.4f at %.3g FLOPs: %+.2f band units%s", run.loss.back(),
                       run.flops.back(), d, data->outside ? "  OUTSIDE THE BAND" : "  (inside)");
    if (run.status == RunStatus::kRunning || run.status == RunStatus::kQueued) {
      ImGui::SameLine();
      ImGui::TextDisabled("(the law is the frontier: a run reaches it only as its schedule ends)");
    }
  }
  if (plan.contains("config")) {
    const auto& c = plan["config"];
    ImGui::TextDisabled(
        "d_model %d, layers %d, heads %d, experts %d/%d  |  %.3g params (%.3g active), %d steps  "
        "|  memory/device %s  |  estimated time %s",
        c["model"].value("d_model", 0), c["model"].value("layers", 0), c["model"].value("heads", 0),
        c["moe"].value("experts_total", 0), c["moe"].value("experts_active", 0),
        Num(plan, "params_total"), Num(plan, "params_active"), plan.value("steps", 0),
        Bytes(Num(plan, "memory", "total_bytes")).c_str(),
        fmt::format("{:.0f} s", Num(plan, "time_s")).c_str());
  }

  // The plot: band, predicted law, sweep runs, promoted run.
  PlotBounds fit;
  std::vector<double> cx, cl, clo, chi;
  if (plan.contains("curve")) {
    for (const auto& p : plan["curve"]) {
      cx.push_back(p.value("flops", NAN));
      cl.push_back(Num(p, "loss", "estimate"));
      clo.push_back(Num(p, "band", "lo"));
      chi.push_back(Num(p, "band", "hi"));
      fit.Add(cx.back(), clo.back());
      fit.Add(cx.back(), chi.back());
    }
  }
  for (const auto& c : data->sweep)
    for (size_t i = 0; i < c.flops.size(); ++i) fit.Add(c.flops[i], c.loss[i]);
  for (size_t i = 0; i < run.flops.size(); ++i) fit.Add(run.flops[i], run.loss[i]);
  {
    Plot plot("fullruns", ImVec2(-1, -ImGui::GetFrameHeightWithSpacing()), &x_, &y_, fit, true,
              true, "validation loss vs training FLOPs: promoted run over its predicted band",
              "training FLOPs");
    ImDrawList* dl = plot.draw_list();
    for (size_t i = 1; i < cx.size(); ++i) {
      const ImVec2 a = plot.ToPixel(cx[i - 1], chi[i - 1]), b = plot.ToPixel(cx[i], chi[i]),
                   c = plot.ToPixel(cx[i], clo[i]), d = plot.ToPixel(cx[i - 1], clo[i - 1]);
      dl->AddQuadFilled(a, b, c, d, kBandColor);
    }
    for (const auto& c : data->sweep) plot.Line(c.flops, c.loss, kSweepColor, 1.4f);
    plot.Line(cx, cl, kLawColor, 1.5f);
    plot.Line(run.flops, run.loss, kRunColor, 2.2f);
    if (!run.flops.empty())
      plot.Marker(run.flops.back(), run.loss.back(), data->outside ? kOutsideColor : kRunColor,
                  4.5f);
    if (!cx.empty()) plot.VLine(cx.back(), IM_COL32(200, 200, 200, 90));
    if (plot.hovered()) {
      ImGui::BeginTooltip();
      ImGui::Text("C = %.3g FLOPs, L = %.4f", plot.mouse_x(), plot.mouse_y());
      ImGui::Text("band units here: %+.2f",
                  promote::BandUnits(plan, plot.mouse_x(), plot.mouse_y()));
      ImGui::EndTooltip();
    }
  }
  ImGui::TextColored(ImGui::ColorConvertU32ToFloat4(kRunColor), "promoted run");
  ImGui::SameLine();
  ImGui::TextColored(ImGui::ColorConvertU32ToFloat4(kLawColor), "  predicted law + band");
  ImGui::SameLine();
  ImGui::TextColored(ImGui::ColorConvertU32ToFloat4(kSweepColor), "  sweep runs (%zu)",
                     data->sweep.size());
}

}  // namespace moelab::gui
