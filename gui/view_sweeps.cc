// The Sweeps view: the control room. Left, the database's sweeps and their runs with Stop /
// Resume / Rerun; right, a spec editor validated as you type (the sweeps/ code `moelab sweep
// plan` runs), its plan, and Launch. Every action starts or signals `moelab` processes
// (gui/sweep_control.h): the sweep engine's locks and dedupe decide what actually trains.
#include <imgui.h>
#include <imgui_stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "core/host.h"
#include "db/reader.h"
#include "gui/app.h"
#include "gui/app_internal.h"
#include "gui/plan_calibration.h"
#include "gui/sweep_control.h"
#include "gui/view_adaptive.h"
#include "gui/widgets.h"
#include "sweeps/runner.h"

namespace moelab::gui {

namespace fs = std::filesystem;

namespace {

constexpr const char* kNewSpec = R"({
  "name": "my-sweep",
  "base": {
    "model": {"vocab_size": 64, "d_model": 32, "layers": 2, "heads": 2, "ffn_hidden": 64,
              "seq_len": 32},
    "moe": {"experts_total": 4, "experts_active": 2, "expert_hidden": 32},
    "data": {"source": "markov"},
    "train": {"batch_size": 4, "steps": 50}
  },
  "grid": {"moe.experts_total": [4, 8]},
  "seeds": [1]
}
)";

std::string Stamp() {
  return std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(
                            std::chrono::system_clock::now().time_since_epoch())
                            .count());
}

}  // namespace

void App::Report(bool ok, const std::string& message) {
  sweeps_.message = message;
  sweeps_.message_error = !ok;
}

void App::CheckSpecNow() {
  const std::string db = store_ ? store_->path() : "";
  const std::string path = sweeps_.spec_path.empty() ? "untitled.json" : sweeps_.spec_path;
  if (!sweeps_.calibrator) sweeps_.calibrator = std::make_unique<PlanCalibrator>();
  sweeps_.check = std::make_unique<SpecCheck>(
      CheckSpecText(sweeps_.text, path, db, sweeps_.parallel, sweeps_.calibrator.get()));
  sweeps_.checked_text = sweeps_.text;
}

bool App::OpenSpec(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    Report(false, "cannot open " + path);
    return false;
  }
  std::stringstream ss;
  ss << in.rdbuf();
  sweeps_.spec_path = path;
  sweeps_.text = sweeps_.saved_text = ss.str();
  sweeps_.checked_text.clear();
  Report(true, "opened " + path);
  return true;
}

bool App::SaveSpec() {
  if (sweeps_.spec_path.empty()) {
    Report(false, "give the spec a file name first");
    return false;
  }
  std::error_code ec;
  if (fs::path(sweeps_.spec_path).has_parent_path()) {
    fs::create_directories(fs::path(sweeps_.spec_path).parent_path(), ec);
  }
  const std::string tmp = sweeps_.spec_path + ".tmp";
  {
    std::ofstream out(tmp);
    out << sweeps_.text;
    if (!out) {
      Report(false, "cannot write " + sweeps_.spec_path);
      return false;
    }
  }
  fs::rename(tmp, sweeps_.spec_path, ec);
  if (ec) {
    Report(false, "cannot write " + sweeps_.spec_path + ": " + ec.message());
    return false;
  }
  sweeps_.saved_text = sweeps_.text;
  Report(true, "saved " + sweeps_.spec_path);
  return true;
}

bool App::LaunchSpec(bool rerun) {
  if (!store_) {
    Report(false, "open a database first (File > Open database): runs are recorded there");
    return false;
  }
  if (sweeps_.checked_text != sweeps_.text || !sweeps_.check) CheckSpecNow();
  if (!sweeps_.check->ok) {
    Report(false, "the spec is not valid: " + sweeps_.check->error);
    return false;
  }
  if (sweeps_.text != sweeps_.saved_text && !SaveSpec()) return false;
  const std::string& name = sweeps_.check->name;
  const std::string db = store_->path();
  if (const int pid = SweepRunnerPid(db, name); pid > 0) {
    Report(false, "sweep '" + name + "' is already running (pid " + std::to_string(pid) + ")");
    return false;
  }
  std::vector<std::string> argv = {
      MoelabBinary(),    "sweep",      "run",
      sweeps_.spec_path, "--db",       db,
      "--no-live",       "--parallel", std::to_string(sweeps_.parallel)};
  if (rerun) argv.push_back("--rerun");
  const std::string log = sweeps::SweepDir(db, name) + "/gui-" + Stamp() + ".log";
  const Launched l = LaunchDetached(argv, db, rerun ? "rerun" : "launch", log);
  if (l.pid < 0) {
    Report(false, l.error);
    return false;
  }
  sweeps_.selected_sweep = name;
  Report(true, (rerun ? "rerunning '" : "launched '") + name + "' (pid " + std::to_string(l.pid) +
                   "), log " + log);
  return true;
}

bool App::RerunSweep(const std::string& name) {
  // Rerun trains every run again from the spec the database stored for the sweep.
  try {
    const std::string db = store_ ? store_->path() : "";
    db::Reader reader(db);
    const std::string spec = reader.SweepSpecJson(name);
    const std::string path = sweeps::SweepDir(db, name) + "/gui-rerun-spec.json";
    std::error_code ec;
    fs::create_directories(fs::path(path).parent_path(), ec);
    std::ofstream(path) << spec;
    return OpenSpec(path) && LaunchSpec(true);
  } catch (const std::exception& ex) {
    Report(false, ex.what());
    return false;
  }
}

bool App::StopSweep(const std::string& name) {
  const std::string db = store_ ? store_->path() : "";
  const int pid = SweepRunnerPid(db, name);
  std::string error;
  if (pid < 0 || !Terminate(pid, &error)) {
    Report(false, pid < 0 ? "no process is running sweep '" + name + "'" : error);
    return false;
  }
  RecordAction(db, "stop-sweep", pid, name);
  Report(true, "asked sweep '" + name + "' (pid " + std::to_string(pid) +
                   ") to stop: its trainers checkpoint first");
  return true;
}

bool App::ResumeSweep(const std::string& name) {
  if (!store_) return false;
  const std::string db = store_->path();
  if (const int pid = SweepRunnerPid(db, name); pid > 0) {
    Report(false, "sweep '" + name + "' is still running (pid " + std::to_string(pid) + ")");
    return false;
  }
  const std::vector<std::string> argv = {
      MoelabBinary(), "sweep",      "resume",
      name,           "--db",       db,
      "--no-live",    "--parallel", std::to_string(sweeps_.parallel)};
  const std::string log = sweeps::SweepDir(db, name) + "/gui-" + Stamp() + ".log";
  const Launched l = LaunchDetached(argv, db, "resume", log);
  if (l.pid < 0) {
    Report(false, l.error);
    return false;
  }
  Report(true, "resuming '" + name + "' (pid " + std::to_string(l.pid) + "), log " + log);
  return true;
}

bool App::StopRun(int64_t run) {
  const RunEntry* e = runs_ ? runs_->Find(run) : nullptr;
  if (!e || e->row.status != RunStatus::kRunning || !e->row.pid) {
    Report(false, "run " + std::to_string(run) + " is not running");
    return false;
  }
  if (e->row.host != HostName()) {
    Report(false, "run " + std::to_string(run) + " runs on " + e->row.host + ", not here");
    return false;
  }
  std::string error;
  const int pid = static_cast<int>(*e->row.pid);
  if (!Terminate(pid, &error)) {
    Report(false, error);
    return false;
  }
  RecordAction(store_->path(), "stop-run", pid, std::to_string(run));
  Report(true, "asked run " + std::to_string(run) + " (pid " + std::to_string(pid) +
                   ") to checkpoint and stop");
  return true;
}

bool App::ResumeRun(int64_t run) {
  const RunEntry* e = runs_ ? runs_->Find(run) : nullptr;
  if (!store_ || !e) return false;
  const RunStatus st = e->row.effective_status;
  if (st == RunStatus::kRunning || st == RunStatus::kDone) {
    Report(false, "run " + std::to_string(run) + " is " + ToString(st));
    return false;
  }
  // `moelab train --resume --run-id` continues the run from its last checkpoint and keeps
  // exactly the rows up to it (db::RunWriter::Attach), as the sweep runner's own launches do.
  // The checkpoint folder is the one the run recorded; the config is the run's own.
  const std::string db = store_->path();
  const std::string dir = sweeps::SweepDir(db, e->sweep_name.empty() ? "lone-runs" : e->sweep_name);
  std::error_code ec;
  fs::create_directories(dir, ec);
  const std::string cfg = dir + "/gui-run-" + std::to_string(run) + ".json";
  try {
    db::Reader reader(db);
    std::ofstream(cfg) << reader.RunConfigJson(run);
  } catch (const std::exception& ex) {
    Report(false, ex.what());
    return false;
  }
  std::vector<std::string> argv = {
      MoelabBinary(),      "train",  cfg,         "--db",          db,        "--run-id",
      std::to_string(run), "--name", e->row.name, "--no-progress", "--resume"};
  if (!e->row.checkpoint_path.empty()) {
    argv.push_back("--checkpoint-dir");
    argv.push_back(fs::path(e->row.checkpoint_path).parent_path().string());
  }
  const Launched l = LaunchDetached(argv, db, "resume-run", dir + "/gui-" + Stamp() + ".log");
  if (l.pid < 0) {
    Report(false, l.error);
    return false;
  }
  Report(true, "resuming run " + std::to_string(run) + " (pid " + std::to_string(l.pid) + ")");
  return true;
}

void App::SweepsView() {
  SweepsList();
  ImGui::SameLine();
  SweepSpecEditor();
}

void App::SweepsList() {
  const std::string db = store_ ? store_->path() : "";
  // ---- Left: the sweeps of the database and their runs. ----
  ImGui::BeginChild("sweeps_list", ImVec2(ImGui::GetContentRegionAvail().x * 0.48f, 0), true);
  if (!store_ || !runs_) {
    ImGui::TextWrapped("Open a database to see its sweeps and launch into it.");
  } else {
    std::map<std::string, std::vector<const RunEntry*>> members;
    for (const auto& r : runs_->runs) {
      if (!r->sweep_name.empty()) members[r->sweep_name].push_back(r.get());
    }
    std::vector<std::string> names;
    for (const auto& [id, name] : runs_->sweeps) names.push_back(name);
    if (sweeps_.check && !sweeps_.check->name.empty() &&
        std::find(names.begin(), names.end(), sweeps_.check->name) == names.end()) {
      names.push_back(sweeps_.check->name);  // launched, not recorded yet
    }
    ImGui::TextDisabled("Sweeps in %s", db.c_str());
    if (ImGui::BeginTable("sweeps", 4,
                          ImGuiTableFlags_RowBg | ImGuiTableFlags_BordersInnerV |
                              ImGuiTableFlags_SizingFixedFit)) {
      ImGui::TableSetupColumn("sweep", ImGuiTableColumnFlags_WidthStretch);
      ImGui::TableSetupColumn("runs");
      ImGui::TableSetupColumn("runner");
      ImGui::TableSetupColumn("actions");
      ImGui::TableHeadersRow();
      for (const std::string& name : names) {
        ImGui::PushID(name.c_str());
        ImGui::TableNextRow();
        ImGui::TableSetColumnIndex(0);
        if (ImGui::Selectable(name.c_str(), sweeps_.selected_sweep == name)) {
          sweeps_.selected_sweep = name;
        }
        ImGui::TableSetColumnIndex(1);
        std::map<std::string, int> by_status;
        for (const RunEntry* r : members[name]) ++by_status[ToString(r->row.effective_status)];
        std::string counts;
        for (const auto& [s, n] : by_status) {
          counts += (counts.empty() ? "" : ", ") + std::to_string(n) + " " + s;
        }
        ImGui::TextUnformatted(counts.empty() ? "-" : counts.c_str());
        ImGui::TableSetColumnIndex(2);
        const int pid = SweepRunnerPid(db, name);
        if (pid > 0) {
          ImGui::TextColored(ImColor(StatusColor(RunStatus::kRunning)), "pid %d", pid);
        } else {
          ImGui::TextDisabled("idle");
        }
        ImGui::TableSetColumnIndex(3);
        ImGui::BeginDisabled(pid < 0);
        if (ImGui::SmallButton("Stop")) StopSweep(name);
        ImGui::EndDisabled();
        ImGui::SameLine();
        ImGui::BeginDisabled(pid > 0);
        if (ImGui::SmallButton("Resume")) ResumeSweep(name);
        ImGui::SameLine();
        // Rerun retrains every run of the sweep: it asks first.
        if (ImGui::SmallButton("Rerun") ||
            (sweeps_.rerun_open_request && sweeps_.rerun_confirm == name)) {
          sweeps_.rerun_confirm = name;
          sweeps_.rerun_open_request = false;
          ImGui::OpenPopup("Rerun sweep?");
        }
        ImGui::EndDisabled();
        if (ImGui::BeginPopupModal("Rerun sweep?", nullptr, ImGuiWindowFlags_AlwaysAutoResize)) {
          const size_t n = members[name].size();
          ImGui::Text("Rerun sweep '%s'?", name.c_str());
          ImGui::TextWrapped(
              "This trains all %zu runs again from the spec the database stored "
              "(moelab sweep run --rerun), replacing their results. Resume continues "
              "unfinished runs instead.",
              n);
          // (--script answers through rerun_answer: 1 confirm, -1 cancel.)
          if (ImGui::Button("Rerun all runs") || sweeps_.rerun_answer > 0) {
            RerunSweep(sweeps_.rerun_confirm);
            ImGui::CloseCurrentPopup();
          }
          ImGui::SameLine();
          if (ImGui::Button("Cancel") || sweeps_.rerun_answer < 0 ||
              ImGui::IsKeyPressed(ImGui::GetKeyIndex(ImGuiKey_Escape))) {
            ImGui::CloseCurrentPopup();
          }
          sweeps_.rerun_answer = 0;
          ImGui::EndPopup();
        }
        ImGui::PopID();
      }
      ImGui::EndTable();
    }
    if (!sweeps_.selected_sweep.empty()) {
      AdaptivePanel(db, sweeps_.selected_sweep);  // above the runs table, which takes the rest
      ImGui::Separator();
      ImGui::Text("Runs of %s", sweeps_.selected_sweep.c_str());
      if (ImGui::BeginTable(
              "sweep_runs", 4,
              ImGuiTableFlags_RowBg | ImGuiTableFlags_ScrollY | ImGuiTableFlags_SizingFixedFit)) {
        ImGui::TableSetupColumn("run", ImGuiTableColumnFlags_WidthStretch);
        ImGui::TableSetupColumn("status");
        ImGui::TableSetupColumn("step");
        ImGui::TableSetupColumn("");
        ImGui::TableHeadersRow();
        for (const RunEntry* r : members[sweeps_.selected_sweep]) {
          ImGui::PushID(static_cast<int>(r->row.id));
          ImGui::TableNextRow();
          ImGui::TableSetColumnIndex(0);
          ImGui::Text("#%lld %s", static_cast<long long>(r->row.id), r->row.name.c_str());
          ImGui::TableSetColumnIndex(1);
          ImGui::TextColored(ImColor(StatusColor(r->row.effective_status)), "%s",
                             ToString(r->row.effective_status));
          ImGui::TableSetColumnIndex(2);
          ImGui::Text("%lld / %lld", static_cast<long long>(r->row.last_step),
                      static_cast<long long>(r->row.shape.total_steps));
          ImGui::TableSetColumnIndex(3);
          const bool running = r->row.effective_status == RunStatus::kRunning;
          ImGui::BeginDisabled(!running);
          if (ImGui::SmallButton("Stop")) StopRun(r->row.id);
          ImGui::EndDisabled();
          ImGui::SameLine();
          ImGui::BeginDisabled(running || r->row.effective_status == RunStatus::kDone);
          if (ImGui::SmallButton("Resume")) ResumeRun(r->row.id);
          ImGui::EndDisabled();
          ImGui::PopID();
        }
        ImGui::EndTable();
      }
    }
  }
  ImGui::EndChild();
}

void App::SweepSpecEditor() {
  // ---- Right: the spec editor, its validation and plan, Launch. ----
  ImGui::BeginChild("sweep_editor", ImVec2(0, 0), true);
  ImGui::SetNextItemWidth(-260);
  ImGui::InputTextWithHint("##spec_path", "spec file (experiments/.../spec.json)",
                           &sweeps_.spec_path);
  ImGui::SameLine();
  if (ImGui::Button("Open")) OpenSpec(sweeps_.spec_path);
  ImGui::SameLine();
  if (ImGui::Button("New")) {
    sweeps_.text = kNewSpec;
    sweeps_.saved_text.clear();
    sweeps_.checked_text.clear();
  }
  ImGui::SameLine();
  if (ImGui::Button("Save")) SaveSpec();
  ImGui::SameLine();
  ImGui::TextDisabled(sweeps_.text != sweeps_.saved_text ? "modified" : "saved");

  const float editor_h = ImGui::GetContentRegionAvail().y * 0.5f;
  const SpecCheck* shown_check = sweeps_.check.get();
  // The error's line while it is about the text shown (a JSON syntax error has one).
  const int mark_line = shown_check && !shown_check->ok && sweeps_.checked_text == sweeps_.text
                            ? shown_check->line
                            : 0;
  // A new error line is scrolled into view once; then the user scrolls as they like.
  const bool reveal = mark_line > 0 && mark_line != sweeps_.revealed_line;
  sweeps_.revealed_line = mark_line;
  if (CodeEditor("##spec", &sweeps_.text, ImVec2(-1, editor_h), mark_line, reveal)) {
    sweeps_.edited_at = Clock::now();
  }
  // Validate as you type: once the text rested 150 ms (expanding a big spec takes a moment).
  if (sweeps_.text != sweeps_.checked_text &&
      Clock::now() - sweeps_.edited_at > std::chrono::milliseconds(150)) {
    CheckSpecNow();
  }
  // Check again when the rate arrives (the plan then has times) or the runs at once change.
  if (sweeps_.check && sweeps_.check->ok &&
      ((sweeps_.check->calibrating && !sweeps_.calibrator->Busy()) ||
       sweeps_.check->parallel != sweeps_.parallel)) {
    CheckSpecNow();
  }
  if (sweeps_.check && sweeps_.check->calibrating) frame_settled_ = false;
  const SpecCheck* c = sweeps_.check.get();
  if (c && !c->ok) {
    ImGui::PushStyleColor(ImGuiCol_Text, IM_COL32(240, 110, 100, 255));
    if (!c->error_path.empty()) {
      ImGui::TextWrapped("error at %s: %s", c->error_path.c_str(), c->error_reason.c_str());
    } else {
      ImGui::TextWrapped("error: %s", c->error.c_str());
    }
    ImGui::PopStyleColor();
  } else if (c && c->ok) {
    ImGui::TextColored(ImColor(StatusColor(RunStatus::kDone)),
                       "valid: sweep '%s', %d runs (%d unique)", c->name.c_str(), c->runs,
                       c->unique);
    for (const auto& w : c->warnings) ImGui::TextDisabled("warning: %s", w.c_str());
  }
  ImGui::SetNextItemWidth(100);
  ImGui::InputInt("parallel", &sweeps_.parallel);
  sweeps_.parallel = std::clamp(sweeps_.parallel, 1, 64);
  ImGui::SameLine();
  ImGui::BeginDisabled(!c || !c->ok || !store_);
  if (ImGui::Button("Launch")) LaunchSpec(false);
  ImGui::EndDisabled();
  HelpMarker(
      "Launch saves the spec and starts `moelab sweep run` detached (it outlives the GUI; its "
      "log is in <db>.sweeps/<sweep>/). Done runs with the same config are reused; the sweep "
      "lock refuses a second runner.");
  if (!sweeps_.message.empty()) {
    ImGui::PushStyleColor(ImGuiCol_Text, sweeps_.message_error ? IM_COL32(240, 110, 100, 255)
                                                               : IM_COL32(170, 200, 170, 255));
    ImGui::TextWrapped("%s", sweeps_.message.c_str());
    ImGui::PopStyleColor();
  }
  if (c && c->ok) {
    if (c->calibrating) {
      ImGui::PushStyleColor(ImGuiCol_Text, ImGui::GetStyleColorVec4(ImGuiCol_TextDisabled));
      ImGui::TextWrapped(
          "Plan (moelab sweep plan --parallel %d). Estimated times follow: measuring this "
          "machine's training rate in the background (a few seconds of the largest run)...",
          c->parallel);
      ImGui::PopStyleColor();
    } else {
      ImGui::TextDisabled("Plan (moelab sweep plan --parallel %d)%s", c->parallel,
                          c->time_estimate.empty()
                              ? ""
                              : ", times from a rate measured in the background (cached)");
      if (!c->time_estimate.empty()) {
        ImGui::SameLine();
        HelpMarker(("Estimated times from a rate measured once in the background this session "
                    "and cached for the largest run's config and threads per run: " +
                    c->time_estimate)
                       .c_str());
      }
    }
    ImGui::BeginChild("plan", ImVec2(0, 0), false, ImGuiWindowFlags_HorizontalScrollbar);
    ImGui::TextUnformatted(c->plan.c_str());
    ImGui::EndChild();
  }
  ImGui::EndChild();
}

}  // namespace moelab::gui
