// View-model logic of moelab-gui that needs no OpenGL and no ImGui: per-pixel downsampling,
// debiased EMA, run grouping and filtering, colour maps, axis ticks, config diffs and expert
// imbalance. Kept separate so unit tests can check it without a display.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace moelab::gui {

// ---- Axes ---------------------------------------------------------------------------------

// Maps data coordinates to a unit interval, linearly or in log10. Log axes clamp non-positive
// values to NaN so callers can skip them.
struct AxisMap {
  double lo = 0, hi = 1;
  bool log = false;
  double Forward(double v) const;  // data -> [0, 1] over [lo, hi]
  double Inverse(double t) const;  // [0, 1] -> data
};

// "Nice" tick positions (1, 2, 5 × 10^k steps) inside [lo, hi]; at most about max_ticks.
std::vector<double> NiceTicks(double lo, double hi, int max_ticks);
// Decades (and 2, 5 multiples when few decades are visible) inside [lo, hi], lo > 0.
std::vector<double> LogTicks(double lo, double hi, int max_ticks);
// Short label: 3 significant digits, SI-like exponents for large/small magnitudes.
std::string FormatValue(double v);
// v with `digits` significant digits in fixed notation (29.73 -> "29.7", 5.123 -> "5.12",
// 123.4 -> "123"; never an exponent, so 1234 -> "1234"): heatmap cell labels.
std::string SignificantDigits(double v, int digits);
// Pads a [lo, hi] range by a fraction (in log space for log axes) and fixes empty ranges.
void PadRange(double* lo, double* hi, bool log, double fraction = 0.05);

// ---- Series processing --------------------------------------------------------------------

// Per pixel column min/max/first/last (M4, Jugel et al. 2014) of the points of (xs, ys) whose x
// lies in [x0, x1], plus the nearest point on either side so lines reach the plot edges. xs must
// be ascending. NaN values are skipped. The output keeps index order inside each column, so
// drawing it as a polyline is pixel-identical to drawing every point.
void DownsampleM4(std::span<const double> xs, std::span<const double> ys, const AxisMap& x_axis,
                  int columns, std::vector<double>* out_x, std::vector<double>* out_y);

// What DownsampleM4 and DownsampleM4Pyramid (gui/pyramid.h) append to their output, so both
// give the same points in the same order.
struct M4Output {
  std::span<const double> xs, ys;
  std::vector<double>* out_x;
  std::vector<double>* out_y;

  void Emit(size_t i) const;
  // One column's first, min, max and last points, in index order, each once.
  void EmitColumn(size_t first, size_t imin, size_t imax, size_t last) const;
  // The nearest finite point before `begin` (at or after `end`, below n) connects the line to
  // the plot's left (right) edge.
  void EmitFiniteBefore(size_t begin) const;
  void EmitFiniteFrom(size_t end, size_t n) const;
};

// TensorBoard-style exponential moving average with debiasing: s_t = m_t / (1 - w^t) where
// m_t = w m_{t-1} + (1 - w) y_t. NaNs are passed through without updating the average. w = 0
// returns the input.
std::vector<double> DebiasedEma(std::span<const double> ys, double weight);

// Where a line through a series must break: the indices i whose step follows a gap of missing
// steps, steps[i] - steps[i - 1] more than twice the series' median spacing (so a series
// recorded every k steps has no gaps, and one with a stretch of missing records has one).
// steps ascending; fewer than three points have no gaps.
std::vector<size_t> GapStarts(std::span<const double> steps);

// Index of the last point with xs[i] <= x (or the first point when x is before all points);
// -1 for empty input.
int64_t NearestIndexAtOrBefore(std::span<const double> xs, double x);

// ---- Colours ------------------------------------------------------------------------------

struct Rgba {
  float r = 0, g = 0, b = 0, a = 1;
  uint32_t Packed() const;  // ImGui's IM_COL32 layout (ABGR in memory, little endian)
};

// Viridis, t in [0, 1] (clamped); NaN gives mid grey.
Rgba Viridis(double t);
// Heatmap colour of v on [vmin, vmax]; vmin == vmax maps to the middle of the scale.
Rgba HeatColor(double v, double vmin, double vmax);
// Black or white, whichever reads on the background.
Rgba ContrastText(const Rgba& background);
// Categorical colours for the app's dark plot background (gui/palette.cc): Okabe & Ito's
// colour-blind-safe set (black replaced by light grey), then colours generated to be as far as
// possible from every earlier one and from the background in OKLab, as seen with normal vision
// and simulated protanopia, deuteranopia and tritanopia. kPaletteSize of them, then cycling.
inline constexpr int kPaletteSize = 48;
// Where the ordered gradient starts on viridis.
inline constexpr double kGradientStart = 0.42;
Rgba CategoryColor(int index);
// Colour of group `rank` among `count` groups: a gradient when the groups are ordered numbers
// (viridis from its middle up, which reads on the dark background), categories otherwise.
Rgba GroupColor(int rank, int count, bool ordered);
// The plot background the palette is made for (ImGui's dark FrameBg over its WindowBg).
Rgba PlotBackground();

// OKLab (Ottosson 2020) of an sRGB colour: L in [0, 1] and a, b; Euclidean distance there is
// close to perceived difference.
struct OkLab {
  double l = 0, a = 0, b = 0;
};
OkLab ToOkLab(const Rgba& c);
double OkDistance(const OkLab& x, const OkLab& y);
// The colour as seen with a colour-vision deficiency (Machado et al. 2009, severity 1).
enum class Cvd { kNone, kProtan, kDeutan, kTritan };
Rgba SimulateCvd(const Rgba& c, Cvd kind);
// The smallest OKLab distance between two colours over normal vision and the three simulated
// dichromacies: how distinct they are for everyone.
double CvdSafeDistance(const Rgba& x, const Rgba& y);

// ---- Runs: keys, filtering, grouping, diff ------------------------------------------------

// A run's config flattened to dotted keys ("optimizer.lr" -> "0.003"); arrays are kept as JSON
// text. Strings are unquoted.
std::map<std::string, std::string> FlattenConfig(const nlohmann::json& config);

// What the run table and grouping need to know about a run.
struct RunKeys {
  int64_t id = 0;
  std::string name;
  std::string status;
  std::map<std::string, std::string> vars;    // sweep variables
  std::map<std::string, std::string> config;  // flattened config
};

// Key syntax used across the GUI: "var:NAME" is a sweep variable, anything else a config key.
std::string LookupKey(const RunKeys& run, const std::string& key);
// Case-insensitive match of every space-separated word against name, status, vars and config
// values. An empty filter matches everything.
bool MatchesFilter(const RunKeys& run, const std::string& filter);

// Orders strings that look like numbers numerically, others lexically; numbers first.
bool ValueLess(const std::string& a, const std::string& b);
bool IsNumber(const std::string& s, double* value = nullptr);

struct Group {
  std::string value;         // the key's value ("" when a run lacks the key)
  std::vector<int> members;  // indices into the input
};
// Groups runs by key, groups ordered by ValueLess, members in input order.
std::vector<Group> GroupRuns(const std::vector<RunKeys>& runs, const std::string& key);

// Fields whose values differ among the given flattened configs (a missing field counts as a
// difference), sorted by key. values[i] is run i's value or "—" when absent.
struct DiffRow {
  std::string key;
  std::vector<std::string> values;
};
std::vector<DiffRow> ConfigDiff(const std::vector<std::map<std::string, std::string>>& configs);

// Short labels for compared runs that say what tells them apart, "#id" then: the sweep
// variables whose values differ ("sparsity=16"); where those leave two runs alike, the part of
// the names that differs (common leading and trailing '/', '-', '_', '.' separated parts cut,
// marked "…"); where still alike, up to `max_config_keys` differing config fields.
std::vector<std::string> DistinguishingLabels(const std::vector<const RunKeys*>& runs,
                                              int max_config_keys = 2);

// ---- Max logits and experts ---------------------------------------------------------------

// Which expert rows of a heatmap get a label: 1 (every one) when a row is at least a text line
// high, else every k-th with k the smallest of 2, 4, 5, 8, 10, 20, 40, 50, 80, 100, ... that
// spaces labels a line apart (at most `experts`).
int ExpertLabelStride(int experts, float row_px, float line_px);

// Per step, max over heads for each layer: out[i * layers + l].
std::vector<float> MaxOverHeads(std::span<const float> values, int layers, int heads);

struct ClipSeries {
  std::vector<double> steps;
  std::vector<double> fraction;  // heads clipped / (layers * heads)
};
// Fraction of heads clipped at each step of `steps` (ascending), from (step, layer, head) events.
struct ClipPoint {
  int64_t step = 0;
  int layer = 0;
  int head = 0;
};
ClipSeries ClipFraction(std::span<const int64_t> steps, std::span<const ClipPoint> events,
                        int layers, int heads);

// Coefficient of variation (population std / mean) and max/mean of one layer's expert counts;
// both 0 for an all-zero row.
struct Imbalance {
  double cv = 0;
  double max_over_mean = 0;
};
Imbalance ExpertImbalance(std::span<const int64_t> counts);

// τ of a run from its config JSON (optimizer.qk_clip_tau); nullopt when QK-Clip is off.
std::optional<double> ClipTau(const std::map<std::string, std::string>& flat_config);

}  // namespace moelab::gui
