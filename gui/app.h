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

#include "db/fits.h"
#include "gui/data_store.h"
#include "gui/plot.h"
#include "gui/settings.h"

namespace moelab::gui {

class FitJob;          // gui/fits.h
struct FitResult;      // gui/fits.h
struct SpecCheck;      // gui/sweep_control.h
class PlanCalibrator;  // gui/plan_calibration.h
class ScriptRunner;    // gui/script.h
class PromotePanel;    // gui/promote_panel.h
class FullRunsView;    // gui/full_runs_view.h

enum class View {
  kRuns,
  kCurves,
  kLogits,
  kExperts,
  kScaling,
  kCompare,
  kSweeps,
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
  std::string script_path;    // --script: scripted actions (gui/script.h), for tests and demos
  // Per-frame budget for refining plots after a zoom (ms); < 0: the default (app_internal.h).
  // 0 refines one series per panel and about every other canvas per frame (tests).
  double refine_budget_ms = -1;
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
  static bool HasScalingView();  // always true (analysis/ is always built); kept for callers
  void SetView(View v);
  void OpenDatabase(const std::string& path);
  // Replaces the run selection (as clicks in the Runs view would).
  void Select(const std::vector<int64_t>& runs);
  // Sets the Curves x range as a zoom would (the benchmark's interaction frames).
  void SetCurveXRange(double lo, double hi);
  bool quit_requested() const { return quit_; }
  // Where the last frame's time went (moelab-gui-bench's profile): the curve panels' decimation
  // (downsampling) and CPU rasterisation of their canvases (including the texture upload), in
  // CPU time of the UI thread.
  struct FrameProfile {
    double downsample_ms = 0, raster_ms = 0;
    int downsamples = 0, rasters = 0;
    // Refinement left for later frames: panels with series still on an older decimation,
    // canvases showing their previous picture moved to the new ranges.
    int stale_panels = 0, deferred_canvases = 0;
  };
  const FrameProfile& frame_profile() const { return profile_; }
  // --script: the exit status once the script ended (0 ok, 1 a step failed), -1 while running.
  int script_status() const;
  // A screenshot the script asked for this frame ("" = none); main saves it after rendering.
  std::string TakeScreenshotRequest();
  // A plot saved as PNG this frame (File > Save plot as): main reads the rectangle back after
  // rendering and reports the outcome.
  struct PlotCapture {
    std::string path;
    int x0 = 0, y0 = 0, x1 = 0, y1 = 0;
  };
  bool TakePlotCapture(PlotCapture* out);
  void PlotCaptureDone(bool ok, const std::string& path);

 private:
  friend class ScriptRunner;
  using Clock = std::chrono::steady_clock;
  struct CurveCache;  // gui/app_internal.h
  struct LogitCache;
  struct ExpertCache;

  // Each view's own state (Tracy-style: one member struct per view, one file per view).
  struct RunsViewState {
    int64_t last_clicked = -1;
    std::vector<int64_t> row_order;  // the run table's current order (for Shift+click ranges)
  };
  struct CurvesViewState {
    AxisState x;
    AxisState y[5];
    std::map<std::pair<int64_t, int>, std::unique_ptr<CurveCache>> caches;
    // Per-frame refinement scheduling (gui/view_curves.cc): panels still to draw this frame,
    // the time the overdue canvases still to draw will take, and per panel the series where
    // the last frame's decimation budget ran out.
    int panels_left = 0;
    double reserve_ms = 0;
    size_t refine_turn[5] = {0, 0, 0, 0, 0};
    double last_x_lo = 0, last_x_hi = 0;  // the x range of the last frame
  };
  struct CompareViewState {
    AxisState x, y[2];
  };
  struct LogitsViewState {
    // Per column (one per selected run with max logits, else two).
    AxisState x;
    std::map<int, AxisState> y, clip_y;
    std::map<int, int> step;         // index into the run's steps; absent or -1: the latest
    std::map<int, int64_t> runs;     // a column's run chosen in its combo
    std::vector<int64_t> selection;  // the selection the columns were chosen for
    std::map<int64_t, std::unique_ptr<LogitCache>> caches;
  };
  struct ExpertsViewState {
    AxisState x;
    std::map<int, AxisState> cv_y, mm_y;  // per shown run
    int64_t run = -1;                     // chosen in the combo when no run is selected
    std::map<int64_t, std::unique_ptr<ExpertCache>> caches;
  };
  struct SweepsViewState {
    std::string spec_path;  // the spec file the editor shows
    std::string text;       // the editor's buffer
    std::string saved_text;
    std::string checked_text;  // the text `check` was computed for
    std::unique_ptr<SpecCheck> check;
    Clock::time_point edited_at;
    int parallel = 1;
    std::string selected_sweep;
    std::string message;  // the last action's outcome
    bool message_error = false;
    std::unique_ptr<PlanCalibrator> calibrator;  // the plan's time estimate, in the background
    int revealed_line = 0;                       // the error line last scrolled into view
    std::string rerun_confirm;                   // the sweep the Rerun dialog asks about
    bool rerun_open_request = false;             // --script: open the dialog as a click would
    int rerun_answer = 0;                        // --script: 1 confirm, -1 cancel
  };
  struct ScalingViewState {
    std::unique_ptr<FitJob> fit_job;
    int64_t sweep = -1;  // -1: all runs
    std::string fit_reference;
    std::string chosen_reference;  // picked in the reference chooser ("" = the largest family)
    std::string target_family_key;
    std::string heads_base, heads_treatment;
    double target_loss = 0;
    float target_px = -1e9f;  // the target line's pixel row last frame (for dragging)
    ImRect plot_rect;
    bool dragging_target = false;
    AxisState x, y;
    // Fits `moelab fit` stored for the scope and key, newest first: the newest power-law one is
    // shown as stored; a background refit (with its options) runs only when asked.
    std::vector<db::FitRecord> stored;
    uint64_t stored_key = 0;
    // The newest stored power-law fit as a FitResult (curves, points, its multiplier table),
    // drawn until Recompute is pressed; stored_error says why it cannot be.
    std::shared_ptr<const FitResult> stored_result;
    std::string stored_error;
    bool fit_requested = false;
    std::string form = "power";          // the fit form (`moelab fit --form`)
    std::string budgets, budgets_error;  // chinchilla: FLOPs budgets as typed, why unreadable
  };

  void MenuBar();
  void OpenDialog();
  void SavePlotDialog();  // the path for File > Save plot as
  void StatusLine();
  void WelcomeView();
  void SweepsView();  // gui/view_sweeps.cc
  // Sweep control (gui/view_sweeps.cc); each sets the Sweeps view's message, true on success.
  bool OpenSpec(const std::string& path);
  bool SaveSpec();
  bool LaunchSpec(bool rerun);
  // Every run of the sweep trained again (`sweep run --rerun` of its stored spec); the button
  // asks for confirmation first.
  bool RerunSweep(const std::string& name);
  bool StopSweep(const std::string& name);
  bool ResumeSweep(const std::string& name);
  bool StopRun(int64_t run);
  bool ResumeRun(int64_t run);
  void Report(bool ok, const std::string& message);
  void CheckSpecNow();  // gui/view_welcome.cc: no database open yet
  void RunsView();      // gui/view_runs.cc
  void CurvesView();    // gui/view_curves.cc
  void LogitsView();    // gui/view_logits.cc
  void ExpertsView();   // gui/view_experts.cc
  void CompareView();   // gui/view_compare.cc
  void ScalingView();   // gui/view_scaling.cc
  // The Scaling view's power form (gui/view_scaling.cc): ScalingLaws lays out the plot and the
  // tables of a fit, its families in value order with their colours.
  void ScalingLaws(const FitResult& fit, bool use_stored);
  void ScalingPlot(const FitResult& result, bool use_stored,
                   const std::vector<std::string>& families, bool ordered,
                   std::map<std::string, ImU32>* colors);
  void ScalingTables(const FitResult& fit, bool use_stored,
                     const std::vector<std::string>& families,
                     std::map<std::string, ImU32>* colors);
  // The Sweeps view's panes (gui/view_sweeps.cc): the database's sweeps and their runs; the
  // spec editor with its validation, plan and Launch.
  void SweepsList();
  void SweepSpecEditor();
  // Runs a matrix view can show (has() true of their shape): selected runs first, in selection
  // order, then the others. Shared by the max-logit and expert views.
  std::vector<int64_t> RunsWithShape(bool (*has)(const db::RunShape&));
  // The stored fits of the scaling view's scope (ended: when each finished run in scope
  // ended); false while the newest stored power-law fit is shown as stored (no refit until
  // Recompute is pressed).
  bool StoredFits(uint64_t data_version, const std::vector<double>& ended);

  // Runs the curve panels draw: the selection, or every run when nothing is selected.
  std::vector<int64_t> ShownRuns() const;
  void AssignColors(const std::vector<int64_t>& runs);
  void Legend(const std::vector<int64_t>& runs);
  // A run's series of one metric, ready to draw (its cache is current).
  struct CurveShown {
    int64_t run;
    CurveCache* cache;
  };
  // The series of `metric` for `runs` whose data is loaded, caches brought up to date; widens
  // x_extent by their x range.
  std::vector<CurveShown> PrepareCurves(int metric, const std::vector<int64_t>& runs,
                                        PlotBounds* x_extent);
  // Metric panels laid out ncol per row. They share one x axis (x_state) fitted to the union
  // of every panel's data, so the panels stay aligned while following live and zoom together.
  void CurvePanels(const std::vector<int>& metrics, const char* id_prefix,
                   const std::vector<int64_t>& runs, ImVec2 size, int ncol, AxisState* x,
                   AxisState* const* y);
  // One metric panel; x_extent is the union over the linked panels.
  void CurvePanel(const char* id, int metric, const std::vector<CurveShown>& shown, bool no_runs,
                  ImVec2 size, const PlotBounds& x_extent, AxisState* x, AxisState* y);
  void LogitColumn(int column, int64_t run, double vmin, double vmax, float width);
  // One run's expert loads (heatmaps and imbalance curves) in `height` pixels.
  void ExpertsPanel(int index, int64_t run, float height);
  // Selected runs a view cannot show, each with why ("run #7 (name): no max logits recorded
  // (a model without attention layers)"), as lines of text.
  void AbsentRuns(const std::vector<int64_t>& absent, const char* what);
  // The selected runs, in selection order, split by whether has() is true of their shape.
  void SplitSelection(bool (*has)(const db::RunShape&), std::vector<int64_t>* with,
                      std::vector<int64_t>* without) const;
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

  // Shared by the views: the selection and run colours.
  std::vector<int64_t> selection_;  // ordered by selection time
  std::set<int64_t> selected_;
  std::map<int64_t, ImU32> colors_;
  std::vector<std::pair<std::string, ImU32>> legend_;
  std::map<std::string, std::unique_ptr<LineCanvas>> canvases_;

  RunsViewState runs_view_;
  CurvesViewState curves_view_;
  CompareViewState compare_;
  LogitsViewState logits_;
  ExpertsViewState experts_;
  ScalingViewState scaling_;
  SweepsViewState sweeps_;
  std::unique_ptr<ScriptRunner> script_;
  std::string screenshot_request_;
  // --script dump-text: this frame's text (ImGui's log) and its cut-off tables go to this file.
  std::string text_dump_path_;
  // Saving a plot (gui/plot_export.h): the dialog's plot and path, the PNG main still has to
  // read back, and the last save's outcome (state 0 none yet, 1 saved, -1 failed).
  std::string save_plot_name_, save_plot_path_;
  bool save_plot_dialog_ = false;
  PlotCapture plot_capture_;
  int plot_save_state_ = 0;
  std::string plot_save_message_;
  Clock::time_point plot_save_at_;
  FrameProfile profile_;

  bool frame_settled_ = false;
  View frame_view_ = View::kCount;  // the view drawn by the last frame
  Clock::time_point downsample_deadline_,
      canvas_deadline_;  // every item this frame asked for was there

  // Promotion (issue 12): gui/promote_panel.cc, gui/full_runs_view.cc
  std::unique_ptr<PromotePanel> promote_panel_;
  std::unique_ptr<FullRunsView> full_runs_view_;
};

}  // namespace moelab::gui
