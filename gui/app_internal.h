// Internal to moelab-gui's App: constants the views share and the per-view cache structs.
// Not part of the app's interface (gui/app.h); only gui/app.cc and gui/view_*.cc include it.
#pragma once

#include <imgui.h>
#include <time.h>

#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "gui/app.h"
#include "gui/plot.h"
#include "gui/pyramid.h"
#include "gui/view_model.h"

namespace moelab::gui {

inline constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

struct MetricDef {
  const char* title;
  const char* key;
  bool eval;  // keyed by evaluation step (x from the eval_* columns)
  // The smoothing slider applies: noisy measurements only. The learning rate is a schedule
  // (smoothing would bend its warmup and decay) and evaluations are already averages.
  bool smoothed;
};
inline const MetricDef kMetrics[5] = {{"train loss", "loss", false, true},
                                      {"validation loss", "val_loss", true, false},
                                      {"learning rate", "lr", false, false},
                                      {"grad norm", "grad_norm", false, true},
                                      {"tokens/s", "tokens_per_s", false, true}};
inline const char* const kXNames[4] = {"step", "tokens", "training FLOPs", "wall time (s)"};
inline const char* const kXKeys[4] = {"", "tokens", "flops", "wall_time"};
inline const char* const kXEvalKeys[4] = {"", "eval_tokens", "eval_flops", "eval_wall_time"};

inline const ImU32 kTauColor = IM_COL32(235, 80, 70, 255);
inline constexpr size_t kMaxRawRuns = 20;
// Evaluation points get a dot while they are at least this far apart on average.
inline constexpr float kMinDotSpacingPx = 8;
// The per-frame budget (wall time from the frame's start) for refining plots: decimation may
// run until half of it, rasterising canvases until all of it. Past them, plots show their
// previous decimation / picture moved to the new ranges and refine over the next frames, so
// zooming 100 runs never stalls the UI. AppOptions::refine_budget_ms overrides it (tests).
inline constexpr double kRefineBudgetMs = 10;

// CPU time of the calling thread in ms: profile numbers that a loaded machine's preemption does
// not inflate (wall time there is mostly waiting for a core).
inline double ThreadCpuMs() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

inline std::string Opt(const std::optional<double>& v) {
  return v ? FormatValue(*v) : "\xe2\x80\x94";
}

// ---- Caches: derived data recomputed only when a source version or the view changes. ----

struct App::CurveCache {
  std::shared_ptr<const SeriesData> y_src, x_src;
  uint64_t y_version = 0, x_version = 0;
  int x_kind = -1;
  float smoothing = -1;
  std::vector<double> xs, smooth;  // x per point, smoothed values
  std::vector<double> breaks;      // x of the first point after each gap of missing steps
  MinMaxPyramid pyramid;           // over smooth: a zoom reads O(log n) per pixel column
  MinMaxPyramid raw_pyramid;       // over the raw values, built when raw lines are shown
  PlotBounds extent;
  // Downsampled for the current view.
  double v_lo = kNaN, v_hi = kNaN;
  bool v_log = false, v_raw = false;
  int v_cols = 0;
  std::vector<double> ds_x, ds_y, raw_x, raw_y;
  uint64_t ds_gen = 0;  // bumped on every downsample, for the canvas signature
  // ds in axis coordinates (log10 on log axes) for the canvas, as of t_gen and the log flags.
  std::vector<double> ds_tx, ds_ty, breaks_t;
  uint64_t t_gen = ~uint64_t{0};
  bool t_log_x = false, t_log_y = false;
  // The y range of ds inside the x range last asked for (auto-fit reads it every frame).
  uint64_t fit_gen = ~uint64_t{0};
  double fit_x_lo = kNaN, fit_x_hi = kNaN;
  bool fit_log = false;
  PlotBounds fit_y;
};

struct App::LogitCache {
  uint64_t version = 0;
  std::vector<std::vector<double>> layer_series;  // per layer, max over heads
  ClipSeries clip;
  std::vector<double> clip_steps;  // distinct steps with clip events
  uint64_t range_version = 0;
  float vmin = 0, vmax = 0;
  double v_lo = kNaN, v_hi = kNaN;
  int v_cols = 0;
  std::vector<std::vector<double>> ds_x, ds_y;
  std::vector<double> clip_ds_x, clip_ds_y;
};

struct App::ExpertCache {
  uint64_t version = 0;
  std::vector<std::vector<double>> cv, max_mean;  // per layer, per step
  uint64_t hm_sig = 0;
  int bins = 0;
  std::vector<std::vector<double>> share;  // per layer, [bin * experts + e]
  double vmax = 0;                         // the largest share: top of the colour scale
  std::vector<std::unique_ptr<Texture>> tex;
};

}  // namespace moelab::gui
