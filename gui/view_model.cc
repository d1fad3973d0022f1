#include "gui/view_model.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <set>

namespace moelab::gui {

namespace {
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

std::string Lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}
}  // namespace

// ---- Axes ---------------------------------------------------------------------------------

double AxisMap::Forward(double v) const {
  if (log) {
    if (!(v > 0) || !(lo > 0) || !(hi > 0)) return kNaN;
    return (std::log10(v) - std::log10(lo)) / (std::log10(hi) - std::log10(lo));
  }
  return (v - lo) / (hi - lo);
}

double AxisMap::Inverse(double t) const {
  if (log) {
    const double a = std::log10(lo), b = std::log10(hi);
    return std::pow(10.0, a + t * (b - a));
  }
  return lo + t * (hi - lo);
}

std::vector<double> NiceTicks(double lo, double hi, int max_ticks) {
  std::vector<double> ticks;
  if (!std::isfinite(lo) || !std::isfinite(hi) || hi <= lo || max_ticks < 1) return ticks;
  const double raw = (hi - lo) / max_ticks;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  double step = mag;
  for (double m : {1.0, 2.0, 5.0, 10.0}) {
    step = m * mag;
    if (step >= raw) break;
  }
  const double first = std::ceil(lo / step) * step;
  for (double t = first; t <= hi + step * 1e-9; t += step) {
    ticks.push_back(std::abs(t) < step * 1e-9 ? 0.0 : t);
    if (ticks.size() > 100) break;
  }
  return ticks;
}

std::vector<double> LogTicks(double lo, double hi, int max_ticks) {
  std::vector<double> ticks;
  if (!(lo > 0) || !(hi > lo) || max_ticks < 1) return ticks;
  const int d0 = static_cast<int>(std::floor(std::log10(lo)));
  const int d1 = static_cast<int>(std::ceil(std::log10(hi)));
  const int decades = d1 - d0;
  const int stride = std::max(1, (decades + max_ticks - 1) / max_ticks);
  std::vector<double> mults = {1.0};
  if (decades * 3 <= max_ticks) mults = {1.0, 2.0, 5.0};
  for (int d = d0; d <= d1; d += stride) {
    for (double m : mults) {
      const double t = m * std::pow(10.0, d);
      if (t >= lo * (1 - 1e-12) && t <= hi * (1 + 1e-12)) ticks.push_back(t);
    }
  }
  // About one decade visible: linear nice ticks (at their log positions) label it better than
  // one or two decade marks.
  if (ticks.size() < 3) {
    std::vector<double> lin = NiceTicks(lo, hi, std::min(max_ticks, 6));
    std::erase_if(lin, [](double t) { return t <= 0; });
    if (lin.size() > ticks.size()) return lin;
  }
  return ticks;
}

std::string FormatValue(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[32];
  const double a = std::abs(v);
  if (a == 0) return "0";
  if (a >= 1e5 || a < 1e-3) {
    std::snprintf(buf, sizeof(buf), "%.3g", v);
  } else if (a >= 100) {
    std::snprintf(buf, sizeof(buf), "%.0f", v);
  } else {
    std::snprintf(buf, sizeof(buf), "%.4g", v);
  }
  return buf;
}

std::string SignificantDigits(double v, int digits) {
  if (!std::isfinite(v)) return FormatValue(v);
  const double a = std::abs(v);
  const int magnitude = a > 0 ? static_cast<int>(std::floor(std::log10(a))) : 0;
  const int decimals = std::max(0, digits - 1 - magnitude);
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.*f", decimals, v);
  return buf;
}

void PadRange(double* lo, double* hi, bool log, double fraction) {
  if (!std::isfinite(*lo) || !std::isfinite(*hi)) {
    *lo = log ? 1 : 0;
    *hi = log ? 10 : 1;
    return;
  }
  if (log) {
    *lo = std::max(*lo, 1e-300);
    *hi = std::max(*hi, *lo);
    double a = std::log10(*lo), b = std::log10(*hi);
    if (b - a < 1e-9) {
      a -= 0.5;
      b += 0.5;
    }
    const double pad = (b - a) * fraction;
    *lo = std::pow(10.0, a - pad);
    *hi = std::pow(10.0, b + pad);
    return;
  }
  if (*hi - *lo <= std::abs(*hi) * 1e-12) {
    const double d = *lo == 0 ? 1.0 : std::abs(*lo) * 0.1;
    *lo -= d;
    *hi += d;
    return;
  }
  const double pad = (*hi - *lo) * fraction;
  *lo -= pad;
  *hi += pad;
}

// ---- Series processing --------------------------------------------------------------------

void DownsampleM4(std::span<const double> xs, std::span<const double> ys, const AxisMap& x_axis,
                  int columns, std::vector<double>* out_x, std::vector<double>* out_y) {
  out_x->clear();
  out_y->clear();
  const size_t n = std::min(xs.size(), ys.size());
  if (n == 0 || columns < 1) return;
  const double vis_lo = std::min(x_axis.lo, x_axis.hi), vis_hi = std::max(x_axis.lo, x_axis.hi);
  size_t begin = std::lower_bound(xs.begin(), xs.begin() + n, vis_lo) - xs.begin();
  size_t end = std::upper_bound(xs.begin(), xs.begin() + n, vis_hi) - xs.begin();
  const M4Output out{xs, ys, out_x, out_y};
  out.EmitFiniteBefore(begin);
  int64_t col = std::numeric_limits<int64_t>::min();
  size_t first = 0, last = 0, imin = 0, imax = 0;
  bool open = false;
  auto flush = [&]() {
    if (!open) return;
    out.EmitColumn(first, imin, imax, last);
    open = false;
  };
  // Column of x: one multiply on linear axes (this loop sees every visible point, so it is
  // the cost of a zoom), log10 only on log axes.
  const bool log = x_axis.log;
  const double scale = columns / (x_axis.hi - x_axis.lo);
  for (size_t i = begin; i < end; ++i) {
    const double y = ys[i];
    if (!std::isfinite(y)) continue;
    double t;
    if (log) {
      t = x_axis.Forward(xs[i]) * columns;
      if (std::isnan(t)) continue;
    } else {
      t = (xs[i] - x_axis.lo) * scale;
    }
    const int64_t c = std::clamp<int64_t>(static_cast<int64_t>(t), 0, columns - 1);
    if (c != col) {
      flush();
      col = c;
      first = last = imin = imax = i;
      open = true;
      continue;
    }
    last = i;
    if (y < ys[imin]) imin = i;
    if (y > ys[imax]) imax = i;
  }
  flush();
  out.EmitFiniteFrom(end, n);
}

void M4Output::Emit(size_t i) const {
  out_x->push_back(xs[i]);
  out_y->push_back(ys[i]);
}

void M4Output::EmitColumn(size_t first, size_t imin, size_t imax, size_t last) const {
  size_t idx[4] = {first, imin, imax, last};
  std::sort(idx, idx + 4);
  for (int k = 0; k < 4; ++k) {
    if (k > 0 && idx[k] == idx[k - 1]) continue;
    Emit(idx[k]);
  }
}

void M4Output::EmitFiniteBefore(size_t begin) const {
  for (size_t i = begin; i-- > 0;) {
    if (std::isfinite(ys[i])) {
      Emit(i);
      return;
    }
  }
}

void M4Output::EmitFiniteFrom(size_t end, size_t n) const {
  for (size_t i = end; i < n; ++i) {
    if (std::isfinite(ys[i])) {
      Emit(i);
      return;
    }
  }
}

std::vector<double> DebiasedEma(std::span<const double> ys, double weight) {
  std::vector<double> out(ys.begin(), ys.end());
  if (weight <= 0) return out;
  weight = std::min(weight, 0.9999);
  double m = 0, decay = 1;
  for (size_t i = 0; i < ys.size(); ++i) {
    if (!std::isfinite(ys[i])) continue;
    m = weight * m + (1 - weight) * ys[i];
    decay *= weight;
    out[i] = m / (1 - decay);
  }
  return out;
}

std::vector<size_t> GapStarts(std::span<const double> steps) {
  std::vector<size_t> out;
  if (steps.size() < 3) return out;
  std::vector<double> d(steps.size() - 1);
  for (size_t i = 1; i < steps.size(); ++i) d[i - 1] = steps[i] - steps[i - 1];
  std::vector<double> sorted = d;
  std::nth_element(sorted.begin(), sorted.begin() + sorted.size() / 2, sorted.end());
  const double median = sorted[sorted.size() / 2];
  if (!(median > 0)) return out;
  for (size_t i = 0; i < d.size(); ++i) {
    if (d[i] > 2 * median) out.push_back(i + 1);
  }
  return out;
}

int64_t NearestIndexAtOrBefore(std::span<const double> xs, double x) {
  if (xs.empty()) return -1;
  auto it = std::upper_bound(xs.begin(), xs.end(), x);
  if (it == xs.begin()) return 0;
  return static_cast<int64_t>(it - xs.begin()) - 1;
}

// ---- Colours ------------------------------------------------------------------------------

uint32_t Rgba::Packed() const {
  auto c = [](float v) { return static_cast<uint32_t>(std::clamp(v, 0.0f, 1.0f) * 255.0f + 0.5f); };
  return (c(a) << 24) | (c(b) << 16) | (c(g) << 8) | c(r);
}

Rgba Viridis(double t) {
  // Nine samples of matplotlib's viridis; linear interpolation between them is visually exact
  // at heatmap sizes.
  static const float kStops[9][3] = {
      {0.267f, 0.005f, 0.329f}, {0.283f, 0.141f, 0.458f}, {0.254f, 0.265f, 0.530f},
      {0.207f, 0.372f, 0.553f}, {0.164f, 0.471f, 0.558f}, {0.128f, 0.567f, 0.551f},
      {0.135f, 0.659f, 0.518f}, {0.267f, 0.749f, 0.441f}, {0.478f, 0.821f, 0.318f}};
  static const float kEnd[3] = {0.993f, 0.906f, 0.144f};
  if (std::isnan(t)) return {0.5f, 0.5f, 0.5f, 1};
  t = std::clamp(t, 0.0, 1.0);
  const double pos = t * 9.0;
  const int i = std::min(static_cast<int>(pos), 8);
  const double f = pos - i;
  const float* a = kStops[i];
  const float* b = i + 1 < 9 ? kStops[i + 1] : kEnd;
  return {static_cast<float>(a[0] + (b[0] - a[0]) * f),
          static_cast<float>(a[1] + (b[1] - a[1]) * f),
          static_cast<float>(a[2] + (b[2] - a[2]) * f), 1};
}

Rgba HeatColor(double v, double vmin, double vmax) {
  if (!std::isfinite(v)) return {0.5f, 0.5f, 0.5f, 1};
  if (!(vmax > vmin)) return Viridis(0.5);
  return Viridis((v - vmin) / (vmax - vmin));
}

Rgba ContrastText(const Rgba& bg) {
  const float lum = 0.299f * bg.r + 0.587f * bg.g + 0.114f * bg.b;
  return lum > 0.5f ? Rgba{0, 0, 0, 1} : Rgba{1, 1, 1, 1};
}

// ---- Runs ---------------------------------------------------------------------------------

namespace {
void Flatten(const nlohmann::json& j, const std::string& prefix,
             std::map<std::string, std::string>* out) {
  if (j.is_object()) {
    for (auto it = j.begin(); it != j.end(); ++it) {
      Flatten(it.value(), prefix.empty() ? it.key() : prefix + "." + it.key(), out);
    }
    return;
  }
  if (j.is_string()) {
    (*out)[prefix] = j.get<std::string>();
  } else {
    // dump() writes the shortest round-trip form, so a diff never hides a real difference.
    (*out)[prefix] = j.dump();
  }
}
}  // namespace

std::map<std::string, std::string> FlattenConfig(const nlohmann::json& config) {
  std::map<std::string, std::string> out;
  if (config.is_object()) Flatten(config, "", &out);
  return out;
}

std::string LookupKey(const RunKeys& run, const std::string& key) {
  if (key.rfind("var:", 0) == 0) {
    auto it = run.vars.find(key.substr(4));
    return it == run.vars.end() ? "" : it->second;
  }
  if (key == "name") return run.name;
  if (key == "status") return run.status;
  auto it = run.config.find(key);
  return it == run.config.end() ? "" : it->second;
}

bool MatchesFilter(const RunKeys& run, const std::string& filter) {
  std::string hay = Lower(run.name) + " " + Lower(run.status);
  for (const auto& [k, v] : run.vars) hay += " " + Lower(k) + "=" + Lower(v);
  for (const auto& [k, v] : run.config) hay += " " + Lower(v);
  size_t pos = 0;
  const std::string f = Lower(filter);
  while (pos < f.size()) {
    size_t end = f.find(' ', pos);
    if (end == std::string::npos) end = f.size();
    if (end > pos && hay.find(f.substr(pos, end - pos)) == std::string::npos) return false;
    pos = end + 1;
  }
  return true;
}

bool IsNumber(const std::string& s, double* value) {
  if (s.empty()) return false;
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (end != s.c_str() + s.size()) return false;
  if (value) *value = v;
  return true;
}

bool ValueLess(const std::string& a, const std::string& b) {
  double x = 0, y = 0;
  const bool na = IsNumber(a, &x), nb = IsNumber(b, &y);
  if (na && nb) return x < y || (x == y && a < b);
  if (na != nb) return na;
  return a < b;
}

std::vector<Group> GroupRuns(const std::vector<RunKeys>& runs, const std::string& key) {
  std::map<std::string, std::vector<int>> by;
  for (size_t i = 0; i < runs.size(); ++i)
    by[LookupKey(runs[i], key)].push_back(static_cast<int>(i));
  std::vector<Group> groups;
  for (auto& [v, m] : by) groups.push_back({v, std::move(m)});
  std::stable_sort(groups.begin(), groups.end(),
                   [](const Group& a, const Group& b) { return ValueLess(a.value, b.value); });
  return groups;
}

std::vector<DiffRow> ConfigDiff(const std::vector<std::map<std::string, std::string>>& configs) {
  std::set<std::string> keys;
  for (const auto& c : configs) {
    for (const auto& [k, v] : c) keys.insert(k);
  }
  std::vector<DiffRow> rows;
  for (const auto& k : keys) {
    DiffRow row{k, {}};
    bool differs = false;
    for (const auto& c : configs) {
      auto it = c.find(k);
      row.values.push_back(it == c.end() ? "\xe2\x80\x94" : it->second);
      if (row.values.size() > 1 && row.values.back() != row.values.front()) differs = true;
      if (it == c.end()) differs = true;
    }
    if (differs && configs.size() > 1) rows.push_back(std::move(row));
  }
  return rows;
}

namespace {

// A name split after each separator, so the parts join back to the name.
std::vector<std::string> NameParts(const std::string& name) {
  std::vector<std::string> parts(1);
  for (char ch : name) {
    parts.back() += ch;
    if (ch == '/' || ch == '-' || ch == '_' || ch == '.' || ch == ' ') parts.emplace_back();
  }
  if (parts.back().empty()) parts.pop_back();
  return parts;
}

// Each name without the parts every name starts and ends with ("…" where parts were cut).
std::vector<std::string> NameDifferences(const std::vector<std::string>& names) {
  std::vector<std::vector<std::string>> parts;
  size_t shortest = SIZE_MAX;
  for (const auto& n : names) {
    parts.push_back(NameParts(n));
    shortest = std::min(shortest, parts.back().size());
  }
  size_t head = 0, tail = 0;
  auto same = [&](auto part_of) {
    for (const auto& p : parts) {
      if (part_of(p) != part_of(parts.front())) return false;
    }
    return true;
  };
  while (head < shortest && same([&](const auto& p) { return p[head]; })) ++head;
  while (tail + head < shortest && same([&](const auto& p) { return p[p.size() - 1 - tail]; }))
    ++tail;
  std::vector<std::string> out;
  for (const auto& p : parts) {
    std::string mid;
    for (size_t i = head; i + tail < p.size(); ++i) mid += p[i];
    // Separators at the cut ends say nothing: "s8-" reads "s8".
    auto sep = [](char c) { return c == '/' || c == '-' || c == '_' || c == '.' || c == ' '; };
    while (!mid.empty() && sep(mid.back())) mid.pop_back();
    while (!mid.empty() && sep(mid.front())) mid.erase(mid.begin());
    if (mid.empty()) mid = "(" + std::to_string(p.size() - head - tail) + " parts)";
    out.push_back((head > 0 ? "\xe2\x80\xa6" : "") + mid + (tail > 0 ? "\xe2\x80\xa6" : ""));
  }
  return out;
}

bool AllDistinct(const std::vector<std::string>& v) {
  std::set<std::string> seen(v.begin(), v.end());
  return seen.size() == v.size();
}

}  // namespace

std::vector<std::string> DistinguishingLabels(const std::vector<const RunKeys*>& runs,
                                              int max_config_keys) {
  std::vector<std::string> label(runs.size());
  if (runs.empty()) return label;
  std::vector<std::map<std::string, std::string>> vars, configs;
  std::vector<std::string> names;
  for (const RunKeys* r : runs) {
    vars.push_back(r->vars);
    configs.push_back(r->config);
    names.push_back(r->name);
  }
  auto append = [&](size_t i, const std::string& part) {
    label[i] += (label[i].empty() ? "" : " ") + part;
  };
  for (const DiffRow& row : ConfigDiff(vars)) {
    for (size_t i = 0; i < runs.size(); ++i) append(i, row.key + "=" + row.values[i]);
  }
  if (!AllDistinct(label) && AllDistinct(names)) {
    const std::vector<std::string> diff = NameDifferences(names);
    for (size_t i = 0; i < runs.size(); ++i) append(i, diff[i]);
  }
  if (!AllDistinct(label)) {
    int used = 0;
    for (const DiffRow& row : ConfigDiff(configs)) {
      if (used++ >= max_config_keys) break;
      for (size_t i = 0; i < runs.size(); ++i) append(i, row.key + "=" + row.values[i]);
    }
  }
  for (size_t i = 0; i < runs.size(); ++i) {
    label[i] = "#" + std::to_string(runs[i]->id) + (label[i].empty() ? "" : " " + label[i]);
  }
  return label;
}

// ---- Max logits and experts ---------------------------------------------------------------

int ExpertLabelStride(int experts, float row_px, float line_px) {
  if (experts <= 1 || row_px >= line_px) return 1;
  const double need = line_px / std::max(row_px, 1e-3f);
  for (int base = 1;; base *= 10) {
    for (int m : {1, 2, 4, 5, 8}) {
      const int k = m * base;
      if (k > 1 && k >= need) return std::min(k, experts);
    }
    if (base > experts) return experts;
  }
}

std::vector<float> MaxOverHeads(std::span<const float> values, int layers, int heads) {
  std::vector<float> out;
  if (layers <= 0 || heads <= 0) return out;
  const size_t per = static_cast<size_t>(layers) * heads;
  const size_t steps = values.size() / per;
  out.resize(steps * layers);
  for (size_t s = 0; s < steps; ++s) {
    for (int l = 0; l < layers; ++l) {
      const float* row = values.data() + s * per + static_cast<size_t>(l) * heads;
      out[s * layers + l] = *std::max_element(row, row + heads);
    }
  }
  return out;
}

ClipSeries ClipFraction(std::span<const int64_t> steps, std::span<const ClipPoint> events,
                        int layers, int heads) {
  ClipSeries out;
  if (layers <= 0 || heads <= 0) return out;
  std::map<int64_t, std::set<int>> clipped;
  for (const auto& e : events) clipped[e.step].insert(e.layer * heads + e.head);
  std::set<int64_t> all(steps.begin(), steps.end());
  for (const auto& [s, set] : clipped) all.insert(s);
  const double total = static_cast<double>(layers) * heads;
  for (int64_t s : all) {
    auto it = clipped.find(s);
    out.steps.push_back(static_cast<double>(s));
    out.fraction.push_back(it == clipped.end() ? 0.0 : it->second.size() / total);
  }
  return out;
}

Imbalance ExpertImbalance(std::span<const int64_t> counts) {
  Imbalance out;
  if (counts.empty()) return out;
  double sum = 0, mx = 0;
  for (int64_t c : counts) {
    sum += static_cast<double>(c);
    mx = std::max(mx, static_cast<double>(c));
  }
  const double mean = sum / counts.size();
  if (mean <= 0) return out;
  double var = 0;
  for (int64_t c : counts) var += (c - mean) * (c - mean);
  var /= counts.size();
  out.cv = std::sqrt(var) / mean;
  out.max_over_mean = mx / mean;
  return out;
}

std::optional<double> ClipTau(const std::map<std::string, std::string>& flat_config) {
  auto it = flat_config.find("optimizer.qk_clip_tau");
  double tau = 0;
  if (it == flat_config.end() || !IsNumber(it->second, &tau) || !(tau > 0)) return std::nullopt;
  return tau;
}

}  // namespace moelab::gui
