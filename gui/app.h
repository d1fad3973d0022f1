// The moelab-gui application: one full-window ImGui frame with a menu bar, a tab per view and a
// status line. All database access goes through DataStore (background thread); everything here
// runs on the UI thread and only reads immutable snapshots.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "gui/data_store.h"
#include "gui/plot.h"
#include "gui/settings.h"

namespace moelab::gui {

class FitJob;  // gui/fits.h; only when analysis/ is built
class PromotePanel;  // gui/promote_panel.h; only when analysis/ is built
class FullRunsView;  // gui/full_runs_view.h; only when analysis/ is built

enum class View {
  kRuns,
  kCurves,
  kLogits,
  kExperts,
  kScaling,
  kCompare,
  kPromote,
  kFullRuns,
  kCount
};

struct AppOptions {
  std::string db_path;
  std::string view;           // "" = last session's (or runs)
  std::vector<int64_t> runs;  // initial selection
  std::string family_key;     // scaling-law families ("var:NAME" or a config key)
  std::string color_key;      // curves colour key
  bool headless = false;      // screenshot / bench: no settings are read or written
  std::string settings_path;  // gui.json; "" = defaults, nothing saved
};

class App {
 public:
  explicit App(const AppOptions& options);
  ~App();

  // Builds one frame of the whole UI (between ImGui::NewFrame and ImGui::Render).
  void Frame();
  // True once the data the current view draws is loaded (headless captures wait for it).
  bool Settled() const;
  // View names accepted by --view: runs, curves, logits, experts, scaling, compare.
  static const char* ViewName(View v);
  static bool ParseView(const std::string& name, View* out);
  static bool HasScalingView();
  void SetView(View v);
  void OpenDatabase(const std::string& path);
  // Replaces the run selection (as clicks in the Runs view would).
  void Select(const std::vector<int64_t>& runs);
  // Sets the Curves x range as a zoom would (the benchmark's interaction frames).
  void SetCurveXRange(double lo, double hi);
  bool quit_requested() const { return quit_; }

 private:
  struct CurveCache;
  struct LogitCache;
  struct ExpertCache;

  void MenuBar();
  void OpenDialog();
  void StatusLine();
  void RunsView();
  void CurvesView();
  void LogitsView();
  void ExpertsView();
  void CompareView();
  void ScalingView();

  // Runs the curve panels draw: the selection, or every run when nothing is selected.
  std::vector<int64_t> ShownRuns() const;
  void AssignColors(const std::vector<int64_t>& runs);
  void Legend(const std::vector<int64_t>& runs);
  // One metric panel for `runs`; x is shared between panels so zoom/pan stay linked.
  void CurvePanel(const char* id, int metric, const std::vector<int64_t>& runs, ImVec2 size,
                  AxisState* x, AxisState* y);
  void LogitColumn(int column, int64_t run, double vmin, double vmax, float width);
  std::string RunLabel(int64_t run) const;
  LineCanvas& Canvas(const std::string& id);

  AppOptions options_;
  Settings settings_;
  std::unique_ptr<DataStore> store_;
  std::shared_ptr<const RunsSnapshot> runs_;  // this frame's snapshot
  View view_ = View::kRuns;
  bool view_forced_ = false;  // SetView was called: select that tab once
  bool quit_ = false;
  bool open_dialog_ = false;
  std::string dialog_path_;

  std::vector<int64_t> selection_;  // ordered by selection time
  std::set<int64_t> selected_;
  int64_t last_clicked_ = -1;
  std::vector<int64_t> row_order_;  // the run table's current order (for Shift+click ranges)

  std::map<int64_t, ImU32> colors_;
  std::vector<std::pair<std::string, ImU32>> legend_;

  AxisState curve_x_;
  AxisState curve_y_[5];
  AxisState compare_x_, compare_y_[2];
  AxisState logit_x_, logit_y_[2], clip_y_[2];
  AxisState expert_x_, expert_cv_y_, expert_mm_y_;
  int logit_step_[2] = {-1, -1};  // index into the run's steps; -1 follows the latest
  int64_t logit_runs_[2] = {-1, -1};
  int64_t expert_run_ = -1;
  std::map<std::pair<int64_t, int>, std::unique_ptr<CurveCache>> curves_;
  std::map<int64_t, std::unique_ptr<LogitCache>> logit_caches_;
  std::map<int64_t, std::unique_ptr<ExpertCache>> expert_caches_;
  std::map<std::string, std::unique_ptr<LineCanvas>> canvases_;
  bool frame_settled_ = false;
  View frame_view_ = View::kCount;  // the view drawn by the last frame
  using Clock = std::chrono::steady_clock;
  Clock::time_point downsample_deadline_, canvas_deadline_;  // every item this frame asked for was there

  // Scaling laws
  std::unique_ptr<FitJob> fit_job_;
  int64_t scaling_sweep_ = -1;  // -1: all runs
  std::string fit_reference_;
  std::string target_family_key_;
  std::string heads_base_, heads_treatment_;
  double target_loss_ = 0;
  float target_px_ = -1e9f;  // the target line's pixel row last frame (for dragging)
  ImRect plot_rect_;
  bool dragging_target_ = false;
  AxisState scaling_x_, scaling_y_;

  // Promotion (issue 12): gui/promote_panel.cc, gui/full_runs_view.cc
  std::unique_ptr<PromotePanel> promote_panel_;
  std::unique_ptr<FullRunsView> full_runs_view_;
};

}  // namespace moelab::gui
