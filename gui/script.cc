#include "gui/script.h"

#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>

#include "gui/app.h"
#include "gui/plot_export.h"
#include "gui/promote_panel.h"
#include "gui/sweep_control.h"

namespace moelab::gui {

ScriptRunner::ScriptRunner(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    std::fprintf(stderr, "moelab-gui: cannot read script %s\n", path.c_str());
    status_ = 1;
    return;
  }
  for (std::string line; std::getline(in, line);) {
    const size_t start = line.find_first_not_of(" \t");
    if (start == std::string::npos || line[start] == '#') continue;
    lines_.push_back(line.substr(start));
  }
}

bool ScriptRunner::Fail(App* app, const std::string& why) {
  std::fprintf(stderr, "moelab-gui: script line '%s': %s\n", lines_[next_].c_str(), why.c_str());
  status_ = 1;
  app->quit_ = true;
  return false;
}

void ScriptRunner::StartWait(std::istream& in, double default_s, TimePoint now) {
  double timeout = default_s;
  in >> timeout;
  if (!waiting_) {
    waiting_ = true;
    deadline_ = now + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                          std::chrono::duration<double>(timeout));
  }
}

bool ScriptRunner::PromoteAction(App* app, const std::string& cmd, std::istream& in,
                                 TimePoint now) {
  if (cmd == "promote-set") {
    // promote-set FIELD VALUE: a control of the Promote tab (gui/promote_panel.h).
    std::string field, value, error;
    in >> field >> value;
    if (!app->promote_panel_) app->promote_panel_ = std::make_unique<PromotePanel>();
    if (!app->promote_panel_->Set(field, value, &error)) return Fail(app, error);
    app->SetView(View::kPromote);
  } else if (cmd == "promote-plan" || cmd == "promote-write" || cmd == "promote-launch") {
    if (!app->promote_panel_) app->promote_panel_ = std::make_unique<PromotePanel>();
    app->promote_panel_->Press(cmd == "promote-plan" ? 0 : cmd == "promote-write" ? 1 : 2);
    app->SetView(View::kPromote);
  } else if (cmd == "wait-promote") {
    // wait-promote [ok|refused] [TIMEOUT_S]: until the pressed action finished as expected.
    std::string expect = "ok";
    const std::streampos at = in.tellg();
    if (!(in >> expect) || (expect != "ok" && expect != "refused")) {
      in.clear();
      in.seekg(at);
      expect = "ok";
    }
    StartWait(in, 120, now);
    const PromotePanel* panel = app->promote_panel_.get();
    const auto state = panel ? panel->state() : PromotePanel::State::kIdle;
    if (state == PromotePanel::State::kBusy || state == PromotePanel::State::kIdle) {
      if (now > deadline_) Fail(app, "timed out");
      return false;
    }
    const bool refused = state == PromotePanel::State::kRefused;
    if (refused != (expect == "refused")) {
      return Fail(app, refused ? "refused: " + panel->error() : "planned, not refused");
    }
    std::fprintf(stderr, "moelab-gui: promote %s%s\n", refused ? "refused: " : "planned",
                 refused ? panel->error().c_str() : "");
  } else {
    return Fail(app, "unknown action");
  }
  return true;
}

void ScriptRunner::Step(App* app) {
  if (status_ >= 0) {
    if (status_ == 1) app->quit_ = true;
    return;
  }
  if (next_ >= lines_.size()) {
    status_ = 0;
    return;
  }
  std::istringstream in(lines_[next_]);
  std::string cmd;
  in >> cmd;
  const auto now = std::chrono::steady_clock::now();
  auto start_wait = [&](double default_s) { StartWait(in, default_s, now); };
  auto done = [&] {
    waiting_ = false;
    ++next_;
    std::fprintf(stderr, "moelab-gui: script: %s\n", lines_[next_ - 1].c_str());
  };
  auto timed_out = [&] { return now > deadline_; };
  // The runs of the editor's sweep, by id.
  auto sweep_runs = [&] {
    std::vector<const RunEntry*> out;
    if (!app->runs_) return out;
    for (const auto& r : app->runs_->runs) {
      if (!app->sweeps_.check || r->sweep_name != app->sweeps_.check->name) continue;
      out.push_back(r.get());
    }
    return out;
  };
  const std::string& sweep = app->sweeps_.check ? app->sweeps_.check->name : "";
  const std::string db = app->store_ ? app->store_->path() : "";

  if (cmd == "open") {
    std::string path;
    in >> path;
    if (!app->OpenSpec(path)) return (void)Fail(app, app->sweeps_.message);
    app->SetView(View::kSweeps);
    app->CheckSpecNow();
  } else if (cmd == "replace") {
    // replace OLD => NEW (the rest of the line; OLD and NEW may hold spaces)
    std::string rest;
    std::getline(in, rest);
    const size_t arrow = rest.find(" => ");
    if (arrow == std::string::npos) return (void)Fail(app, "expected: replace OLD => NEW");
    const std::string from = rest.substr(1, arrow - 1), to = rest.substr(arrow + 4);
    const size_t at = app->sweeps_.text.find(from);
    if (at == std::string::npos) return (void)Fail(app, "'" + from + "' is not in the editor");
    app->sweeps_.text.replace(at, from.size(), to);
    app->CheckSpecNow();
  } else if (cmd == "save") {
    if (!app->SaveSpec()) return (void)Fail(app, app->sweeps_.message);
  } else if (cmd == "launch" || cmd == "rerun") {
    std::string opt;
    if (in >> opt && opt == "-j") in >> app->sweeps_.parallel;
    if (!app->LaunchSpec(cmd == "rerun")) return (void)Fail(app, app->sweeps_.message);
  } else if (cmd == "rerun-sweep") {
    // The Rerun button of a sweep in the list: opens its confirmation dialog.
    std::string name;
    in >> name;
    app->sweeps_.rerun_confirm = name.empty() ? sweep : name;
    app->sweeps_.rerun_open_request = true;
    app->SetView(View::kSweeps);
  } else if (cmd == "confirm" || cmd == "cancel") {
    app->sweeps_.rerun_answer = cmd == "confirm" ? 1 : -1;
  } else if (cmd == "stop-sweep") {
    if (!app->StopSweep(sweep)) return (void)Fail(app, app->sweeps_.message);
  } else if (cmd == "resume-sweep") {
    if (!app->ResumeSweep(sweep)) return (void)Fail(app, app->sweeps_.message);
  } else if (cmd == "stop-run" || cmd == "resume-run") {
    size_t i = 0;
    in >> i;
    const auto runs = sweep_runs();
    if (i >= runs.size()) return (void)Fail(app, "the sweep has no run " + std::to_string(i));
    const bool ok =
        cmd == "stop-run" ? app->StopRun(runs[i]->row.id) : app->ResumeRun(runs[i]->row.id);
    if (!ok) return (void)Fail(app, app->sweeps_.message);
  } else if (cmd == "wait-runs") {
    size_t n = 0;
    std::string statuses;
    in >> n >> statuses;
    start_wait(120);
    size_t have = 0;
    for (const RunEntry* r : sweep_runs()) {
      have +=
          ("," + statuses + ",").find(std::string(",") + ToString(r->row.effective_status) + ",") !=
          std::string::npos;
    }
    if (have < n) {
      if (timed_out()) Fail(app, "timed out with " + std::to_string(have) + " such runs");
      return;
    }
  } else if (cmd == "wait-step") {
    int64_t step = 0;
    in >> step;
    start_wait(120);
    bool reached = false;
    for (const RunEntry* r : sweep_runs()) {
      reached =
          reached || (r->row.effective_status == RunStatus::kRunning && r->row.last_step >= step);
    }
    if (!reached) {
      if (timed_out()) Fail(app, "timed out");
      return;
    }
  } else if (cmd == "wait-idle") {
    start_wait(120);
    if (SweepRunnerPid(db, sweep) > 0) {
      if (timed_out()) Fail(app, "the sweep runner is still running");
      return;
    }
  } else if (cmd.rfind("promote-", 0) == 0 || cmd == "wait-promote") {
    if (!PromoteAction(app, cmd, in, now)) return;
  } else if (cmd == "view") {
    std::string name;
    in >> name;
    View v;
    if (!App::ParseView(name, &v)) return (void)Fail(app, "unknown view");
    app->SetView(v);
  } else if (cmd == "sleep") {
    start_wait(0);
    // `sleep S`: the timeout is the duration.
    if (!timed_out()) return;
  } else if (cmd == "xrange") {
    double lo = 0, hi = 0;
    if (!(in >> lo >> hi) || !(hi > lo)) return (void)Fail(app, "expected: xrange LO HI");
    app->SetCurveXRange(lo, hi);
  } else if (cmd == "wait-settled") {
    // Frames until the view shows everything at full quality (data loaded, every plot
    // refined): the count tells tests that refinement was spread over frames.
    if (!waiting_) settle_frames_ = 0;
    start_wait(60);
    if (!app->Settled()) {
      ++settle_frames_;
      if (timed_out()) Fail(app, "not settled");
      return;
    }
    std::fprintf(stderr, "moelab-gui: settled after %d frames\n", settle_frames_ + 1);
  } else if (cmd == "save-plot") {
    // save-plot OUT.{png,svg} NAME: File > Save plot as, for the plot listed as NAME (its
    // title); waits for the outcome (the next frame).
    std::string out, name;
    in >> out;
    std::getline(in >> std::ws, name);
    if (!waiting_) {
      if (out.empty() || name.empty()) return (void)Fail(app, "expected: save-plot OUT NAME");
      start_wait(30);
      app->plot_save_state_ = 0;
      PlotExport::Get().Request(name, out);
      return;
    }
    if (app->plot_save_state_ == 0 || !app->plot_capture_.path.empty()) {
      if (timed_out()) Fail(app, "timed out");
      return;
    }
    if (app->plot_save_state_ < 0) return (void)Fail(app, app->plot_save_message_);
  } else if (cmd == "dump-text") {
    // dump-text OUT.txt: the text this frame draws (ImGui's log: widgets, tables with " | "
    // between cells, heatmap labels) and one "CLIPPED ..." line per cut-off table.
    std::string out;
    if (!(in >> out)) return (void)Fail(app, "expected: dump-text OUT.txt");
    std::remove(out.c_str());
    app->text_dump_path_ = out;
  } else if (cmd == "screenshot") {
    in >> app->screenshot_request_;
  } else if (cmd == "quit") {
    app->quit_ = true;
    status_ = 0;
  } else {
    return (void)Fail(app, "unknown action");
  }
  done();
}

}  // namespace moelab::gui
