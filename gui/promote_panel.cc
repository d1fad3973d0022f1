#include "gui/promote_panel.h"

#include <fmt/format.h>
#include <imgui.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <set>

#include "analysis/compute_optimal.h"
#include "db/fits.h"
#include "sweeps/plan.h"

namespace moelab::gui {

namespace {

template <typename T>
bool Ready(const std::future<T>& f) {
  return f.valid() && f.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
}

double ParseNumber(const char* s) {
  char* end = nullptr;
  const double v = std::strtod(s, &end);
  return end != s ? v : 0;
}

}  // namespace

bool PromotePanel::Set(const std::string& field, const std::string& value, std::string* error) {
  auto copy = [&](char* dst, size_t n) {
    std::snprintf(dst, n, "%s", value.c_str());
    return true;
  };
  auto integer = [&](int* out) {
    char* end = nullptr;
    const long v = std::strtol(value.c_str(), &end, 10);
    if (end == value.c_str() || *end != 0 || v < 1) {
      *error = field + " needs a positive integer, not '" + value + "'";
      return false;
    }
    *out = static_cast<int>(v);
    return true;
  };
  if (field == "sweep") {
    want_sweep_ = value;
    return true;
  }
  if (field == "family") {
    want_family_ = value;
    return true;
  }
  if (field == "budget") return copy(budget_, sizeof budget_);
  if (field == "loss") return copy(target_loss_, sizeof target_loss_);
  if (field == "ranks") return integer(&ranks_);
  if (field == "threads") return integer(&threads_);
  if (field == "device") {
    if (value != "cpu" && value != "cuda") {
      *error = "device is cpu or cuda, not '" + value + "'";
      return false;
    }
    device_ = value == "cuda" ? 1 : 0;
    return true;
  }
  if (field == "measure") {
    measure_ = value == "1" || value == "on" || value == "true";
    return true;
  }
  *error = "unknown promote field '" + field +
           "' (known: sweep, family, budget, loss, ranks, threads, device, measure)";
  return false;
}

PromotePanel::State PromotePanel::state() const {
  if (!script_error_.empty()) return State::kRefused;
  if (pressed_ >= 0 || (job_.valid() && !Ready(job_))) return State::kBusy;
  if (job_.valid()) return State::kBusy;  // finished, not collected by Draw yet
  if (!outcome_) return State::kIdle;
  return outcome_->error.empty() ? State::kDone : State::kRefused;
}

std::string PromotePanel::error() const {
  if (!script_error_.empty()) return script_error_;
  return outcome_ ? outcome_->error : "";
}

void PromotePanel::Draw(const std::string& db_path, bool* settled) {
  if (db_path != db_path_) {
    db_path_ = db_path;
    choices_.reset();
    outcome_.reset();
    choices_job_ = std::async(std::launch::async, [path = db_path]() {
      Choices c;
      try {
        for (const auto& s : db::ListSweeps(path)) {
          std::set<std::string> fams;
          for (const auto& f : db::ListFits(path, s.id)) {
            if (f.form != "power" && f.form != "chinchilla") continue;
            for (const auto& o :
                 analysis::ObservationsFromJson(nlohmann::json::parse(f.inputs_json)))
              fams.insert(f.family_key + "=" + o.family);
            break;  // the newest usable fit is the one promote uses
          }
          c.sweeps.push_back(s.name);
          c.families.emplace_back(fams.begin(), fams.end());
        }
      } catch (const std::exception& e) {
        c.error = e.what();
      }
      return c;
    });
  }
  if (Ready(choices_job_)) choices_ = choices_job_.get();
  if (!choices_) {
    *settled = false;
    ImGui::TextDisabled("reading sweeps and fits...");
    return;
  }
  // A scripted press that cannot happen fails the script instead of waiting for ever.
  auto cannot = [&](const std::string& why) {
    if (pressed_ >= 0 || !want_sweep_.empty() || !want_family_.empty()) script_error_ = why;
    pressed_ = -1;
  };
  if (!choices_->error.empty()) {
    cannot(choices_->error);
    ImGui::TextColored(ImVec4(0.95f, 0.45f, 0.4f, 1), "%s", choices_->error.c_str());
    return;
  }
  if (choices_->sweeps.empty()) {
    cannot("no sweeps in this database");
    ImGui::TextDisabled("No sweeps in this database.");
    return;
  }
  const auto& sweeps = choices_->sweeps;
  if (!want_sweep_.empty()) {
    const auto it = std::find(sweeps.begin(), sweeps.end(), want_sweep_);
    if (it == sweeps.end()) script_error_ = "no sweep '" + want_sweep_ + "' in this database";
    if (it != sweeps.end() && it - sweeps.begin() != sweep_)
      sweep_ = it - sweeps.begin(), family_ = 0;
    want_sweep_.clear();
  }
  sweep_ = std::min<int>(sweep_, static_cast<int>(sweeps.size()) - 1);
  ImGui::SetNextItemWidth(200);
  if (ImGui::BeginCombo("sweep##promote", sweeps[sweep_].c_str())) {
    for (int i = 0; i < static_cast<int>(sweeps.size()); ++i)
      if (ImGui::Selectable(sweeps[i].c_str(), i == sweep_)) sweep_ = i, family_ = 0;
    ImGui::EndCombo();
  }
  const auto& fams = choices_->families[sweep_];
  ImGui::SameLine();
  if (fams.empty()) {
    cannot("no stored fit for sweep " + sweeps[sweep_]);
    ImGui::TextDisabled("no stored fit: run `moelab fit --sweep %s --by KEY` first",
                        sweeps[sweep_].c_str());
    return;
  }
  if (!want_family_.empty()) {
    const auto it = std::find(fams.begin(), fams.end(), want_family_);
    if (it == fams.end()) {
      script_error_ = "no family '" + want_family_ + "' in the stored fit of " + sweeps[sweep_];
    } else {
      family_ = it - fams.begin();
    }
    want_family_.clear();
  }
  family_ = std::min<int>(family_, static_cast<int>(fams.size()) - 1);
  ImGui::SetNextItemWidth(160);
  if (ImGui::BeginCombo("family##promote", fams[family_].c_str())) {
    for (int i = 0; i < static_cast<int>(fams.size()); ++i)
      if (ImGui::Selectable(fams[i].c_str(), i == family_)) family_ = i;
    ImGui::EndCombo();
  }
  ImGui::SetNextItemWidth(110);
  ImGui::InputText("budget FLOPs", budget_, sizeof budget_);
  ImGui::SameLine();
  ImGui::SetNextItemWidth(90);
  ImGui::InputText("or target loss", target_loss_, sizeof target_loss_);
  ImGui::SameLine();
  ImGui::SetNextItemWidth(80);
  ImGui::InputInt("ranks", &ranks_);
  ImGui::SameLine();
  ImGui::SetNextItemWidth(80);
  ImGui::InputInt("threads", &threads_);
  ImGui::SameLine();
  ImGui::SetNextItemWidth(70);
  ImGui::Combo("device", &device_, "cpu\0cuda\0");
  ImGui::SameLine();
  ImGui::Checkbox("measure rate", &measure_);
  ranks_ = std::max(1, ranks_);
  threads_ = std::max(1, threads_);

  const bool busy = job_.valid() && !Ready(job_);
  if (Ready(job_)) outcome_ = job_.get();
  if (busy) *settled = false;
  auto start = [&](int action) {  // 0 plan, 1 write, 2 write + launch
    promote::PromoteRequest r;
    r.db_path = db_path_;
    r.sweep = sweeps[sweep_];
    r.family = fams[family_];
    r.target.budget_flops = ParseNumber(budget_);
    r.target.target_loss = r.target.budget_flops > 0 ? 0 : ParseNumber(target_loss_);
    r.layout.ranks = ranks_;
    r.layout.threads = threads_;
    r.layout.device = device_ == 1 ? "cuda" : "cpu";
    if (measure_) {
      r.measure = [](const RunConfig& c, std::string* how) {
        const auto tp = sweeps::MeasureThroughput(c, c.train.threads, 3, 3.0);
        *how = tp.how;
        return tp.flops_per_s;
      };
    }
    job_ = std::async(std::launch::async, [r, action]() {
      Outcome o;
      try {
        o.plan = promote::PreparePromotion(r);
        o.text = promote::FormatPlan(o.plan->plan);
        if (action >= 1) {
          o.recorded = promote::RecordPromotion(r, *o.plan, promote::MoelabBinaryBeside(""));
          o.text += fmt::format("\nrecorded promotion {}; run {} '{}' queued; files in {}\n",
                                o.recorded->promotion_id, o.recorded->run_id, o.recorded->run_name,
                                o.recorded->out_dir);
        }
        if (action == 2) {
          o.pid = promote::LaunchPromotion(o.recorded->out_dir, r.layout.ranks);
          o.text += fmt::format("launched (pid {}): watch it in the Full runs tab\n", o.pid);
        }
      } catch (const std::exception& e) {
        o.error = e.what();
      }
      return o;
    });
  };
  ImGui::BeginDisabled(busy);
  if (ImGui::Button("Plan") || (!busy && pressed_ == 0)) start(0);
  ImGui::SameLine();
  if (ImGui::Button("Write") || (!busy && pressed_ == 1)) start(1);
  ImGui::SameLine();
  if (ImGui::Button("Write and launch") || (!busy && pressed_ == 2)) start(2);
  ImGui::EndDisabled();
  if (!busy) pressed_ = -1;
  if (busy) {
    ImGui::SameLine();
    ImGui::TextColored(ImVec4(0.9f, 0.8f, 0.3f, 1), "planning...");
  }
  if (!outcome_) {
    ImGui::TextDisabled(
        "The plan scales the family's largest run to the budget with the sweep's stored fit "
        "(compute-optimal law when a Chinchilla fit exists, else L(C) with N, D ∝ √C).");
    return;
  }
  if (!outcome_->error.empty()) {
    ImGui::PushStyleColor(ImGuiCol_Text, IM_COL32(240, 110, 100, 255));
    ImGui::TextWrapped("Refused: %s", outcome_->error.c_str());
    ImGui::PopStyleColor();
    return;
  }
  ImGui::BeginChild("plan", ImVec2(0, 0), true, ImGuiWindowFlags_HorizontalScrollbar);
  ImGui::TextUnformatted(outcome_->text.c_str());
  ImGui::EndChild();
}

}  // namespace moelab::gui
