// `moelab-gui --script FILE`: scripted UI actions, one per line, run one per frame through the
// same App methods the buttons call (tests and demos drive the real control room with them).
//
//   open SPEC.json            open a spec in the Sweeps editor (and show the Sweeps view)
//   replace OLD => NEW        edit the editor's buffer (first OLD -> NEW) as typing would
//   save                      write the buffer to its file
//   launch [-j N]             Launch (detached `moelab sweep run`); rerun: the same with --rerun
//   rerun-sweep [NAME]        the Rerun button of a listed sweep (default: the editor's): opens
//                             its confirmation dialog; confirm | cancel answer it
//   stop-sweep | resume-sweep the editor's sweep (SIGTERM to its runner / `moelab sweep resume`)
//   stop-run I | resume-run I the I-th run (0-based, by id) of the editor's sweep
//   wait-runs N STATUS[,STATUS...] [TIMEOUT_S]   until N runs of the sweep have such a status
//   wait-step N [TIMEOUT_S]   until a run of the sweep is running at step >= N
//   wait-idle [TIMEOUT_S]     until no runner holds the sweep's lock
//   xrange LO HI              zoom the curves' x axis to [LO, HI] (as the mouse wheel does)
//   wait-settled [TIMEOUT_S]  until the view's data is loaded and every plot is refined;
//                             prints "settled after N frames"
//   promote-set FIELD VALUE   a Promote tab control: sweep, family (KEY=VALUE), budget (FLOPs),
//                             loss (target), ranks, threads, device (cpu|cuda), measure (on|off)
//   promote-plan | promote-write | promote-launch   press Plan / Write / Write and launch
//   wait-promote [ok|refused] [TIMEOUT_S]   until the pressed action planned (or was refused)
//   save-plot OUT.{png,svg} NAME   File > Save plot as: the shown plot titled NAME (as the
//                             menu lists it) to OUT; fails when no such plot is shown
//   dump-text OUT.txt         this frame's text as ImGui logs it (table cells joined by " | ",
//                             draw-list labels included) and a "CLIPPED ..." line for each
//                             table whose columns are cut off (tests read what a view says)
//   view NAME | sleep S | screenshot OUT.png | quit
//
// A failed action or a wait that times out ends the script with status 1 (the app quits).
#pragma once

#include <chrono>
#include <istream>
#include <string>
#include <vector>

namespace moelab::gui {

class App;

class ScriptRunner {
 public:
  explicit ScriptRunner(const std::string& path);
  // Runs at most one action (or one check of a wait) per frame.
  void Step(App* app);
  // -1 while running, 0 when every action succeeded, 1 on failure.
  int status() const { return status_; }

 private:
  using TimePoint = std::chrono::steady_clock::time_point;
  bool Fail(App* app, const std::string& why);
  // Starts a wait of the line's timeout (default_s when it has none) unless one is under way.
  void StartWait(std::istream& in, double default_s, TimePoint now);
  // The Promote tab's actions (promote-set, promote-plan|write|launch, wait-promote): true
  // when done, false while waiting or after a failure.
  bool PromoteAction(App* app, const std::string& cmd, std::istream& in, TimePoint now);
  std::vector<std::string> lines_;
  size_t next_ = 0;
  int status_ = -1;
  bool waiting_ = false;
  int settle_frames_ = 0;
  std::chrono::steady_clock::time_point deadline_;
};

}  // namespace moelab::gui
