#include "gui/app.h"

#include <imgui.h>
#include <imgui_internal.h>
#include <imgui_stdlib.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <numeric>

#ifdef MOELAB_GUI_HAVE_FITS
#include "gui/fits.h"
#include "gui/full_runs_view.h"
#include "gui/promote_panel.h"
#else
namespace moelab::gui {
class FitJob {};
class PromotePanel {};
class FullRunsView {};
}  // namespace moelab::gui
#endif

namespace moelab::gui {

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

struct MetricDef {
  const char* title;
  const char* key;
  bool eval;  // keyed by evaluation step (x from the eval_* columns)
};
const MetricDef kMetrics[5] = {{"train loss", "loss", false},
                               {"validation loss", "val_loss", true},
                               {"learning rate", "lr", false},
                               {"grad norm", "grad_norm", false},
                               {"tokens/s", "tokens_per_s", false}};
const char* kXNames[4] = {"step", "tokens", "training FLOPs", "wall time (s)"};
const char* kXKeys[4] = {"", "tokens", "flops", "wall_time"};
const char* kXEvalKeys[4] = {"", "eval_tokens", "eval_flops", "eval_wall_time"};

const ImU32 kTauColor = IM_COL32(235, 80, 70, 255);
constexpr size_t kMaxRawRuns = 20;
// Per-frame budgets: past them, plots show their previous downsample / picture moved to the
// new ranges and refine over the next frames, so zooming 100 runs never stalls the UI.
constexpr int kDownsampleBudgetMs = 12;
constexpr int kCanvasBudgetMs = 20;

ImU32 StatusColor(const std::string& s) {
  if (s == "running") return IM_COL32(90, 180, 255, 255);
  if (s == "done") return IM_COL32(110, 200, 110, 255);
  if (s == "failed" || s == "diverged") return IM_COL32(235, 90, 80, 255);
  if (s == "queued") return IM_COL32(170, 170, 170, 255);
  return IM_COL32(220, 190, 90, 255);
}

std::string Opt(const std::optional<double>& v) { return v ? FormatValue(*v) : "\xe2\x80\x94"; }

void HelpMarker(const char* text) {
  ImGui::SameLine();
  ImGui::TextDisabled("(?)");
  if (ImGui::IsItemHovered()) ImGui::SetTooltip("%s", text);
}

// A key chooser over sweep variables and config keys ("" = none).
bool KeyCombo(const char* label, std::string* key, const RunsSnapshot& runs, const char* none) {
  bool changed = false;
  std::string preview = key->empty() ? none : *key;
  if (ImGui::BeginCombo(label, preview.c_str(), ImGuiComboFlags_HeightLarge)) {
    if (ImGui::Selectable(none, key->empty())) {
      key->clear();
      changed = true;
    }
    for (const auto& v : runs.var_keys) {
      const std::string k = "var:" + v;
      if (ImGui::Selectable(k.c_str(), *key == k)) {
        *key = k;
        changed = true;
      }
    }
    for (const auto& k : runs.config_keys) {
      if (ImGui::Selectable(k.c_str(), *key == k)) {
        *key = k;
        changed = true;
      }
    }
    ImGui::EndCombo();
  }
  return changed;
}

}  // namespace

// ---- Caches: derived data recomputed only when a source version or the view changes. ----

struct App::CurveCache {
  std::shared_ptr<const SeriesData> y_src, x_src;
  uint64_t y_version = 0, x_version = 0;
  int x_kind = -1;
  float smoothing = -1;
  std::vector<double> xs, smooth;  // x per point, smoothed values
  PlotBounds extent;
  // Downsampled for the current view.
  double v_lo = kNaN, v_hi = kNaN;
  bool v_log = false, v_raw = false;
  int v_cols = 0;
  std::vector<double> ds_x, ds_y, raw_x, raw_y;
  uint64_t ds_gen = 0;  // bumped on every downsample, for the canvas signature
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
  std::vector<std::unique_ptr<Texture>> tex;
};

// ---- App ------------------------------------------------------------------------------------

App::App(const AppOptions& options) : options_(options) {
  if (!options_.headless && !options_.settings_path.empty()) {
    settings_ = LoadSettings(options_.settings_path);
  }
  std::string path = options_.db_path.empty() ? settings_.db_path : options_.db_path;
  View v = View::kRuns;
  if (!options_.view.empty() && ParseView(options_.view, &v)) {
    SetView(v);
  } else if (ParseView(settings_.view, &v)) {
    SetView(v);
  }
  for (int64_t id : options_.runs) {
    if (selected_.insert(id).second) selection_.push_back(id);
  }
  if (!path.empty()) OpenDatabase(path);
  if (options_.headless) settings_.follow_live = true;
  if (!options_.family_key.empty()) settings_.family_key = options_.family_key;
  if (!options_.color_key.empty()) settings_.color_key = options_.color_key;
}

App::~App() {
  if (!options_.headless && !options_.settings_path.empty()) {
    settings_.view = ViewName(view_);
    SaveSettings(settings_, options_.settings_path);
  }
}

const char* App::ViewName(View v) {
  switch (v) {
    case View::kRuns:
      return "runs";
    case View::kCurves:
      return "curves";
    case View::kLogits:
      return "logits";
    case View::kExperts:
      return "experts";
    case View::kScaling:
      return "scaling";
    case View::kCompare:
      return "compare";
    case View::kPromote:
      return "promote";
    case View::kFullRuns:
      return "full-runs";
    default:
      return "runs";
  }
}

bool App::ParseView(const std::string& name, View* out) {
  for (int i = 0; i < static_cast<int>(View::kCount); ++i) {
    const View v = static_cast<View>(i);
    if (name == ViewName(v) || (v == View::kLogits && name == "max-logits")) {
      if ((v == View::kScaling || v == View::kPromote || v == View::kFullRuns) && !HasScalingView())
        return false;
      *out = v;
      return true;
    }
  }
  return false;
}

bool App::HasScalingView() {
#ifdef MOELAB_GUI_HAVE_FITS
  return true;
#else
  return false;
#endif
}

void App::SetView(View v) {
  view_ = v;
  view_forced_ = true;
}

void App::OpenDatabase(const std::string& path) {
  store_.reset();  // joins the old poller before starting a new one
  store_ = std::make_unique<DataStore>(path);
  curves_.clear();
  logit_caches_.clear();
  expert_caches_.clear();
  logit_runs_[0] = logit_runs_[1] = -1;
  expert_run_ = -1;
  settings_.db_path = path;
  settings_.AddRecent(path);
}

void App::Select(const std::vector<int64_t>& runs) {
  selection_.clear();
  selected_.clear();
  for (int64_t id : runs) {
    if (selected_.insert(id).second) selection_.push_back(id);
  }
}

void App::SetCurveXRange(double lo, double hi) {
  curve_x_ = {false, lo, hi};
  settings_.follow_live = false;
}

bool App::Settled() const {
  // The tab bar shows the requested tab one frame after it is asked for: until the view was
  // drawn, its data was not even requested.
  return store_ && store_->Settled() && frame_settled_ && frame_view_ == view_ && !view_forced_;
}

std::string App::RunLabel(int64_t run) const {
  const RunEntry* e = runs_ ? runs_->Find(run) : nullptr;
  if (!e) return "#" + std::to_string(run);
  return e->row.name.empty() ? "#" + std::to_string(run) : e->row.name;
}

std::vector<int64_t> App::ShownRuns() const {
  std::vector<int64_t> out;
  if (!runs_) return out;
  if (!selection_.empty()) {
    for (int64_t id : selection_) {
      if (runs_->Find(id)) out.push_back(id);
    }
    return out;
  }
  for (const auto& r : runs_->runs) out.push_back(r->row.id);
  return out;
}

void App::AssignColors(const std::vector<int64_t>& runs) {
  colors_.clear();
  legend_.clear();
  if (settings_.color_key.empty()) {
    for (size_t i = 0; i < runs.size(); ++i) {
      const ImU32 c = ToImU32(CategoryColor(static_cast<int>(i)));
      colors_[runs[i]] = c;
      legend_.emplace_back(RunLabel(runs[i]), c);
    }
    return;
  }
  std::vector<RunKeys> keys;
  for (int64_t id : runs) keys.push_back(runs_->Find(id)->keys);
  std::vector<Group> groups = GroupRuns(keys, settings_.color_key);
  bool ordered = true;
  for (const auto& g : groups) ordered = ordered && IsNumber(g.value);
  for (size_t gi = 0; gi < groups.size(); ++gi) {
    const ImU32 c =
        ToImU32(GroupColor(static_cast<int>(gi), static_cast<int>(groups.size()), ordered));
    for (int m : groups[gi].members) colors_[runs[m]] = c;
    const std::string v = groups[gi].value.empty() ? "(none)" : groups[gi].value;
    legend_.emplace_back(
        settings_.color_key + " = " + v + " (" + std::to_string(groups[gi].members.size()) + ")",
        c);
  }
}

void App::Legend(const std::vector<int64_t>& runs) {
  (void)runs;
  const float max_x = ImGui::GetWindowPos().x + ImGui::GetWindowContentRegionMax().x;
  const size_t limit = 24;
  for (size_t i = 0; i < legend_.size() && i < limit; ++i) {
    const auto& [label, color] = legend_[i];
    const float w = ImGui::CalcTextSize(label.c_str()).x + ImGui::GetFontSize() + 16;
    if (i > 0) {
      ImGui::SameLine();
      if (ImGui::GetCursorScreenPos().x + w > max_x) ImGui::NewLine();
    }
    const ImVec2 p = ImGui::GetCursorScreenPos();
    const float s = ImGui::GetFontSize();
    ImGui::GetWindowDrawList()->AddRectFilled(ImVec2(p.x, p.y + s * 0.2f),
                                              ImVec2(p.x + s * 0.8f, p.y + s), color, 2);
    ImGui::Dummy(ImVec2(s, s));
    ImGui::SameLine(0, 4);
    ImGui::TextUnformatted(label.c_str());
  }
  if (legend_.size() > limit) {
    ImGui::SameLine();
    ImGui::TextDisabled("+%d more", static_cast<int>(legend_.size() - limit));
  }
}

LineCanvas& App::Canvas(const std::string& id) {
  auto& slot = canvases_[id];
  if (!slot) slot = std::make_unique<LineCanvas>();
  return *slot;
}

// ---- Frame ----------------------------------------------------------------------------------

void App::Frame() {
  frame_settled_ = true;
  frame_view_ = View::kCount;
  downsample_deadline_ = Clock::now() + std::chrono::milliseconds(kDownsampleBudgetMs);
  canvas_deadline_ = Clock::now() + std::chrono::milliseconds(kCanvasBudgetMs);
  runs_ = store_ ? store_->Runs() : std::make_shared<RunsSnapshot>();
  // Before the first listing no view knows what to ask for: not settled yet.
  if (store_ && runs_->version == 0 && store_->error().empty()) frame_settled_ = false;
  const ImGuiViewport* vp = ImGui::GetMainViewport();
  ImGui::SetNextWindowPos(vp->WorkPos);
  ImGui::SetNextWindowSize(vp->WorkSize);
  ImGui::PushStyleVar(ImGuiStyleVar_WindowBorderSize, 0);
  ImGui::Begin("moelab", nullptr,
               ImGuiWindowFlags_NoDecoration | ImGuiWindowFlags_NoMove |
                   ImGuiWindowFlags_NoBringToFrontOnFocus | ImGuiWindowFlags_MenuBar |
                   ImGuiWindowFlags_NoSavedSettings);
  ImGui::PopStyleVar();
  MenuBar();

  const std::string error = store_ ? store_->error() : "";
  if (!store_) {
    ImGui::TextWrapped(
        "No database open. Use File > Open database (Ctrl+O), or start with "
        "moelab-gui --db FILE.");
  } else if (!error.empty()) {
    ImGui::PushStyleColor(ImGuiCol_Text, IM_COL32(240, 110, 100, 255));
    ImGui::TextWrapped("Cannot read %s: %s", store_->path().c_str(), error.c_str());
    ImGui::PopStyleColor();
    ImGui::TextWrapped(
        "The app keeps retrying, so a database that is being created will "
        "appear on its own. Open another file with File > Open database.");
  }

  const float status_h = ImGui::GetFrameHeightWithSpacing();
  if (ImGui::BeginTabBar("views")) {
    for (int i = 0; i < static_cast<int>(View::kCount); ++i) {
      const View v = static_cast<View>(i);
      if ((v == View::kScaling || v == View::kPromote || v == View::kFullRuns) && !HasScalingView())
        continue;
      static const char* kTitles[] = {"Runs",         "Curves",  "Max logits", "Experts",
                                      "Scaling laws", "Compare", "Promote",    "Full runs"};
      ImGuiTabItemFlags flags = 0;
      if (view_forced_ && v == view_) flags |= ImGuiTabItemFlags_SetSelected;
      if (ImGui::BeginTabItem(kTitles[i], nullptr, flags)) {
        if (!view_forced_) view_ = v;
        frame_view_ = v;
        ImGui::BeginChild("view", ImVec2(0, -status_h), false);
        if (store_ && error.empty()) {
          switch (v) {
            case View::kRuns:
              RunsView();
              break;
            case View::kCurves:
              CurvesView();
              break;
            case View::kLogits:
              LogitsView();
              break;
            case View::kExperts:
              ExpertsView();
              break;
            case View::kScaling:
              ScalingView();
              break;
            case View::kCompare:
              CompareView();
              break;
#ifdef MOELAB_GUI_HAVE_FITS
            case View::kPromote:
              if (!promote_panel_) promote_panel_ = std::make_unique<PromotePanel>();
              promote_panel_->Draw(store_->path(), &frame_settled_);
              break;
            case View::kFullRuns:
              if (!full_runs_view_) full_runs_view_ = std::make_unique<FullRunsView>();
              full_runs_view_->Draw(store_->path(), &frame_settled_);
              break;
#endif
            default:
              break;
          }
        }
        ImGui::EndChild();
        ImGui::EndTabItem();
      }
    }
    view_forced_ = false;
    ImGui::EndTabBar();
  }
  StatusLine();
  ImGui::End();
  if (open_dialog_) OpenDialog();
}

void App::MenuBar() {
  const ImGuiIO& io = ImGui::GetIO();
  if (io.KeyCtrl && ImGui::IsKeyPressed('O', false)) {
    open_dialog_ = true;
  }
  if (!ImGui::BeginMenuBar()) return;
  if (ImGui::BeginMenu("File")) {
    if (ImGui::MenuItem("Open database...", "Ctrl+O")) open_dialog_ = true;
    if (ImGui::BeginMenu("Recent", !settings_.recent.empty())) {
      for (const auto& r : settings_.recent) {
        if (ImGui::MenuItem(r.c_str())) {
          OpenDatabase(r);
          break;
        }
      }
      ImGui::EndMenu();
    }
    ImGui::Separator();
    if (ImGui::MenuItem("Quit", "Ctrl+Q")) quit_ = true;
    ImGui::EndMenu();
  }
  if (io.KeyCtrl && ImGui::IsKeyPressed('Q', false)) quit_ = true;
  ImGui::EndMenuBar();
}

void App::OpenDialog() {
  // Debian packages no native file dialog for ImGui: a path field, the recent files and the
  // *.db files next to the typed path do the job.
  if (!ImGui::IsPopupOpen("Open database")) {
    ImGui::OpenPopup("Open database");
    if (dialog_path_.empty() && store_) dialog_path_ = store_->path();
  }
  ImGui::SetNextWindowSize(ImVec2(640, 420), ImGuiCond_Appearing);
  if (ImGui::BeginPopupModal("Open database", &open_dialog_)) {
    ImGui::SetNextItemWidth(-80);
    const bool enter =
        ImGui::InputText("##path", &dialog_path_, ImGuiInputTextFlags_EnterReturnsTrue);
    ImGui::SameLine();
    if (ImGui::Button("Open") || enter) {
      OpenDatabase(dialog_path_);
      open_dialog_ = false;
      ImGui::CloseCurrentPopup();
    }
    ImGui::BeginChild("files", ImVec2(0, -ImGui::GetFrameHeightWithSpacing()), true);
    if (!settings_.recent.empty()) ImGui::TextDisabled("Recent");
    for (const auto& r : settings_.recent) {
      if (ImGui::Selectable(r.c_str(), r == dialog_path_, ImGuiSelectableFlags_AllowDoubleClick)) {
        dialog_path_ = r;
        if (ImGui::IsMouseDoubleClicked(0)) {
          OpenDatabase(r);
          open_dialog_ = false;
        }
      }
    }
    namespace fs = std::filesystem;
    std::error_code ec;
    fs::path dir = fs::path(dialog_path_).has_parent_path() ? fs::path(dialog_path_).parent_path()
                                                            : fs::current_path(ec);
    if (fs::is_directory(fs::path(dialog_path_), ec)) dir = dialog_path_;
    ImGui::TextDisabled("In %s", dir.string().c_str());
    if (ImGui::Selectable("..")) dialog_path_ = dir.parent_path().string() + "/";
    for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
      const fs::path p = it->path();
      const bool is_dir = it->is_directory(ec);
      const std::string ext = p.extension().string();
      if (!is_dir && ext != ".db" && ext != ".sqlite" && ext != ".sqlite3") continue;
      const std::string label = p.filename().string() + (is_dir ? "/" : "");
      if (ImGui::Selectable(label.c_str(), p.string() == dialog_path_,
                            ImGuiSelectableFlags_AllowDoubleClick)) {
        dialog_path_ = p.string() + (is_dir ? "/" : "");
        if (!is_dir && ImGui::IsMouseDoubleClicked(0)) {
          OpenDatabase(dialog_path_);
          open_dialog_ = false;
        }
      }
    }
    ImGui::EndChild();
    if (ImGui::Button("Cancel")) {
      open_dialog_ = false;
      ImGui::CloseCurrentPopup();
    }
    ImGui::EndPopup();
  }
}

void App::StatusLine() {
  ImGui::Separator();
  if (!store_) {
    ImGui::TextDisabled("no database");
    return;
  }
  int running = 0;
  for (const auto& r : runs_->runs) running += r->row.effective_status == "running" ? 1 : 0;
  const int pending = store_->Pending();
  ImGui::TextDisabled("%s  |  %d runs, %d running  |  %zu selected%s", store_->path().c_str(),
                      static_cast<int>(runs_->runs.size()), running, selection_.size(),
                      pending > 0 ? "" : "  |  up to date");
  if (pending > 0) {
    ImGui::SameLine();
    ImGui::TextColored(ImVec4(0.9f, 0.8f, 0.3f, 1), "|  loading %d series...", pending);
  }
}

// ---- Runs -----------------------------------------------------------------------------------

void App::RunsView() {
  const RunsSnapshot& rs = *runs_;
  ImGui::SetNextItemWidth(220);
  ImGui::InputTextWithHint("##filter", "filter (words: name, status, values)", &settings_.filter);
  ImGui::SameLine();
  ImGui::SetNextItemWidth(200);
  KeyCombo("group by", &settings_.group_key, rs, "(no grouping)");
  ImGui::SameLine();
  ImGui::SetNextItemWidth(200);
  std::string add;
  if (KeyCombo("add column", &add, rs, "(choose a config key)") && !add.empty() &&
      add.rfind("var:", 0) != 0 &&
      std::find(settings_.columns.begin(), settings_.columns.end(), add) ==
          settings_.columns.end()) {
    settings_.columns.push_back(add);
  }
  ImGui::SameLine();
  if (ImGui::Button("Select shown")) {
    for (int64_t id : row_order_) {
      if (selected_.insert(id).second) selection_.push_back(id);
    }
  }
  ImGui::SameLine();
  if (ImGui::Button("Clear selection")) {
    selection_.clear();
    selected_.clear();
  }
  HelpMarker(
      "Click selects a run, Ctrl+click toggles, Shift+click selects a range. The selection "
      "drives Curves, Max logits, Experts and Compare (Curves shows every run when none is "
      "selected). Right-click a config column header to remove it.");

  // Columns: sweep, name, status, sweep vars, chosen config keys, summary metrics.
  std::vector<std::string> cols;
  for (const auto& v : rs.var_keys) cols.push_back("var:" + v);
  for (const auto& c : settings_.columns) {
    if (std::find(rs.config_keys.begin(), rs.config_keys.end(), c) != rs.config_keys.end()) {
      cols.push_back(c);
    }
  }
  const int fixed_before = 3, fixed_after = 4;
  // ImGui tables take at most 64 columns.
  if (cols.size() > static_cast<size_t>(64 - fixed_before - fixed_after)) {
    cols.resize(64 - fixed_before - fixed_after);
  }
  const int ncols = fixed_before + static_cast<int>(cols.size()) + fixed_after;

  std::vector<const RunEntry*> shown;
  for (const auto& r : rs.runs) {
    if (MatchesFilter(r->keys, settings_.filter)) shown.push_back(r.get());
  }

  const ImGuiTableFlags flags =
      ImGuiTableFlags_Sortable | ImGuiTableFlags_SortMulti | ImGuiTableFlags_Resizable |
      ImGuiTableFlags_RowBg | ImGuiTableFlags_BordersInnerV | ImGuiTableFlags_ScrollY |
      ImGuiTableFlags_ScrollX | ImGuiTableFlags_Hideable | ImGuiTableFlags_SizingFixedFit;
  if (!ImGui::BeginTable("runs", ncols, flags)) return;
  ImGui::TableSetupScrollFreeze(2, 1);
  ImGui::TableSetupColumn("sweep");
  ImGui::TableSetupColumn("name", ImGuiTableColumnFlags_DefaultSort);
  ImGui::TableSetupColumn("status", ImGuiTableColumnFlags_WidthFixed, 150);
  for (const auto& c : cols) {
    ImGui::TableSetupColumn(c.rfind("var:", 0) == 0 ? c.c_str() + 4 : c.c_str());
  }
  ImGui::TableSetupColumn("last loss");
  ImGui::TableSetupColumn("best val loss");
  ImGui::TableSetupColumn("tokens/s");
  ImGui::TableSetupColumn("steps");
  ImGui::TableHeadersRow();
  for (int c = 0; c < static_cast<int>(cols.size()); ++c) {
    if (cols[c].rfind("var:", 0) == 0) continue;
    ImGui::PushID(c);
    if (ImGui::TableGetHoveredColumn() == fixed_before + c &&
        ImGui::IsMouseReleased(ImGuiMouseButton_Right)) {
      std::erase(settings_.columns, cols[c]);
    }
    ImGui::PopID();
  }

  // Sort: each column has a string or numeric key.
  auto cell_key = [&](const RunEntry* r, int col) -> std::pair<double, std::string> {
    if (col == 0) return {kNaN, r->sweep_name};
    if (col == 1) return {kNaN, r->row.name};
    if (col == 2) return {kNaN, r->row.effective_status};
    if (col < fixed_before + static_cast<int>(cols.size())) {
      return {kNaN, LookupKey(r->keys, cols[col - fixed_before])};
    }
    switch (col - fixed_before - static_cast<int>(cols.size())) {
      case 0:
        return {r->row.last_loss.value_or(kNaN), ""};
      case 1:
        return {r->row.best_val_loss.value_or(kNaN), ""};
      case 2:
        return {r->row.tokens_per_s.value_or(kNaN), ""};
      default:
        return {static_cast<double>(r->row.last_step), ""};
    }
  };
  if (ImGuiTableSortSpecs* specs = ImGui::TableGetSortSpecs(); specs && specs->SpecsCount > 0) {
    std::stable_sort(shown.begin(), shown.end(), [&](const RunEntry* a, const RunEntry* b) {
      for (int i = 0; i < specs->SpecsCount; ++i) {
        const ImGuiTableColumnSortSpecs& s = specs->Specs[i];
        auto ka = cell_key(a, s.ColumnIndex), kb = cell_key(b, s.ColumnIndex);
        int cmp = 0;
        if (!ka.second.empty() || !kb.second.empty() ||
            (std::isnan(ka.first) && std::isnan(kb.first))) {
          cmp = ValueLess(ka.second, kb.second) ? -1 : ValueLess(kb.second, ka.second) ? 1 : 0;
        } else if (std::isnan(ka.first) != std::isnan(kb.first)) {
          // Missing values sort last whatever the direction.
          return std::isnan(kb.first);
        } else {
          cmp = ka.first < kb.first ? -1 : ka.first > kb.first ? 1 : 0;
        }
        if (cmp != 0) return s.SortDirection == ImGuiSortDirection_Ascending ? cmp < 0 : cmp > 0;
      }
      return a->row.id < b->row.id;
    });
  }

  // Grouping keeps the sort order inside each group.
  std::vector<std::pair<std::string, std::vector<const RunEntry*>>> groups;
  if (settings_.group_key.empty()) {
    groups.emplace_back("", shown);
  } else {
    std::vector<RunKeys> keys;
    for (const auto* r : shown) keys.push_back(r->keys);
    for (const auto& g : GroupRuns(keys, settings_.group_key)) {
      std::vector<const RunEntry*> members;
      for (int m : g.members) members.push_back(shown[m]);
      std::stable_sort(members.begin(), members.end(), [&](const RunEntry* a, const RunEntry* b) {
        return std::find(shown.begin(), shown.end(), a) < std::find(shown.begin(), shown.end(), b);
      });
      groups.emplace_back(g.value.empty() ? "(none)" : g.value, std::move(members));
    }
  }

  row_order_.clear();
  for (const auto& [label, members] : groups) {
    bool open = true;
    if (!settings_.group_key.empty()) {
      ImGui::TableNextRow();
      ImGui::TableSetColumnIndex(0);
      double best = kNaN;
      for (const auto* r : members) {
        if (r->row.best_val_loss && !(*r->row.best_val_loss >= best)) best = *r->row.best_val_loss;
      }
      const std::string head = settings_.group_key + " = " + label + "  (" +
                               std::to_string(members.size()) + " runs, best val " +
                               FormatValue(best) + ")";
      open = ImGui::TreeNodeEx(head.c_str(), ImGuiTreeNodeFlags_DefaultOpen |
                                                 ImGuiTreeNodeFlags_SpanFullWidth |
                                                 ImGuiTreeNodeFlags_NoTreePushOnOpen);
    }
    if (!open) continue;
    for (const RunEntry* r : members) {
      const int64_t id = r->row.id;
      row_order_.push_back(id);
      ImGui::TableNextRow();
      ImGui::PushID(static_cast<int>(id));
      ImGui::TableSetColumnIndex(0);
      ImGui::TextUnformatted(r->sweep_name.c_str());
      ImGui::TableSetColumnIndex(1);
      const bool is_sel = selected_.count(id) > 0;
      const std::string name = r->row.name.empty() ? "#" + std::to_string(id) : r->row.name;
      if (ImGui::Selectable(
              name.c_str(), is_sel,
              ImGuiSelectableFlags_SpanAllColumns | ImGuiSelectableFlags_AllowItemOverlap)) {
        const ImGuiIO& io = ImGui::GetIO();
        if (io.KeyShift && last_clicked_ >= 0) {
          auto a = std::find(row_order_.begin(), row_order_.end(), last_clicked_);
          if (a != row_order_.end()) {
            for (auto it = a; it != row_order_.end(); ++it) {
              if (selected_.insert(*it).second) selection_.push_back(*it);
            }
          } else if (selected_.insert(id).second) {
            selection_.push_back(id);
          }
        } else if (io.KeyCtrl) {
          if (is_sel) {
            selected_.erase(id);
            std::erase(selection_, id);
          } else {
            selected_.insert(id);
            selection_.push_back(id);
          }
        } else {
          selected_ = {id};
          selection_ = {id};
        }
        last_clicked_ = id;
      }
      if (ImGui::IsItemHovered() && !r->row.error.empty()) {
        ImGui::SetTooltip("%s", r->row.error.c_str());
      }
      ImGui::TableSetColumnIndex(2);
      const std::string& st = r->row.effective_status;
      if (st == "running" && r->row.shape.total_steps > 0) {
        const float frac = std::clamp(
            static_cast<float>(r->row.last_step) / static_cast<float>(r->row.shape.total_steps),
            0.0f, 1.0f);
        char overlay[64];
        std::snprintf(overlay, sizeof(overlay), "running %.0f%%", frac * 100);
        ImGui::PushStyleColor(ImGuiCol_PlotHistogram, StatusColor(st));
        ImGui::ProgressBar(frac, ImVec2(-1, ImGui::GetTextLineHeight()), overlay);
        ImGui::PopStyleColor();
      } else {
        ImGui::PushStyleColor(ImGuiCol_Text, StatusColor(st));
        ImGui::TextUnformatted(r->row.stale ? "failed (stale)" : st.c_str());
        ImGui::PopStyleColor();
      }
      for (size_t c = 0; c < cols.size(); ++c) {
        ImGui::TableSetColumnIndex(fixed_before + static_cast<int>(c));
        ImGui::TextUnformatted(LookupKey(r->keys, cols[c]).c_str());
      }
      int c = fixed_before + static_cast<int>(cols.size());
      ImGui::TableSetColumnIndex(c++);
      ImGui::TextUnformatted(Opt(r->row.last_loss).c_str());
      ImGui::TableSetColumnIndex(c++);
      ImGui::TextUnformatted(Opt(r->row.best_val_loss).c_str());
      ImGui::TableSetColumnIndex(c++);
      ImGui::TextUnformatted(Opt(r->row.tokens_per_s).c_str());
      ImGui::TableSetColumnIndex(c++);
      if (r->row.shape.total_steps > 0) {
        ImGui::Text("%lld / %lld", static_cast<long long>(r->row.last_step),
                    static_cast<long long>(r->row.shape.total_steps));
      } else {
        ImGui::Text("%lld", static_cast<long long>(r->row.last_step));
      }
      ImGui::PopID();
    }
  }
  ImGui::EndTable();
}

// ---- Curves ---------------------------------------------------------------------------------

void App::CurvePanel(const char* id, int metric, const std::vector<int64_t>& runs, ImVec2 size,
                     AxisState* x_state, AxisState* y_state) {
  const MetricDef& m = kMetrics[metric];
  const int xk = settings_.x_axis;
  const float smoothing = settings_.smoothing;
  const bool log_x = settings_.log_x && xk != 0 ? true : settings_.log_x;
  const bool log_y = settings_.log_y && metric != 4;
  struct Shown {
    int64_t run;
    CurveCache* cache;
  };
  std::vector<Shown> shown;
  PlotBounds x_extent;
  for (int64_t run : runs) {
    auto y = store_->Series(run, m.key);
    std::shared_ptr<const SeriesData> x;
    if (xk != 0) x = store_->Series(run, m.eval ? kXEvalKeys[xk] : kXKeys[xk]);
    if (!y || (xk != 0 && !x)) {
      frame_settled_ = false;
      continue;
    }
    auto& slot = curves_[{run, metric}];
    if (!slot) slot = std::make_unique<CurveCache>();
    CurveCache& c = *slot;
    if (c.y_version != y->version || c.y_src != y || c.x_kind != xk ||
        (x && (c.x_version != x->version || c.x_src != x)) || c.smoothing != smoothing) {
      c.y_src = y;
      c.x_src = x;
      c.y_version = y->version;
      c.x_version = x ? x->version : 0;
      c.x_kind = xk;
      c.smoothing = smoothing;
      const size_t n = x ? std::min(x->values.size(), y->values.size()) : y->values.size();
      if (x) {
        c.xs.assign(x->values.begin(), x->values.begin() + n);
        if (xk == 3 && n > 0) {
          // Wall time as seconds since the run's first record, so runs started at different
          // times line up.
          const double t0 = c.xs.front();
          for (double& v : c.xs) v -= t0;
        }
      } else {
        c.xs.assign(y->steps.begin(), y->steps.begin() + n);
      }
      c.smooth =
          DebiasedEma(std::span<const double>(y->values.data(), n), m.eval ? 0.0 : smoothing);
      c.extent = PlotBounds{};
      for (size_t i = 0; i < n; ++i) c.extent.Add(c.xs[i], c.smooth[i]);
      c.v_cols = 0;  // force a new downsample
    }
    x_extent.AddX(c.extent.x_lo);
    x_extent.AddX(c.extent.x_hi);
    shown.push_back({run, &c});
  }

  // Resolve x here (before the Plot) so y can auto-fit to what is visible.
  const float fh = ImGui::GetFontSize();
  const int cols = std::max(16, static_cast<int>(size.x - fh * 5.4f));
  AxisMap xa;
  if (x_state->auto_fit || !(x_state->hi > x_state->lo)) {
    xa = {x_extent.x_lo, x_extent.x_hi, log_x};
    if (log_x && !(xa.lo > 0)) xa.lo = std::max(1.0, xa.hi * 1e-4);
    PadRange(&xa.lo, &xa.hi, log_x, 0.0);
  } else {
    xa = {x_state->lo, x_state->hi, log_x};
  }
  PlotBounds fit;
  fit.AddX(xa.lo);
  fit.AddX(xa.hi);
  // Beyond a few runs the faint raw lines are a grey blur that doubles the drawing cost.
  const bool raw = settings_.show_raw && smoothing > 0 && !m.eval && shown.size() <= kMaxRawRuns;
  for (auto& s : shown) {
    CurveCache& c = *s.cache;
    const bool stale = c.v_cols != cols || c.v_lo != xa.lo || c.v_hi != xa.hi || c.v_log != log_x ||
                       c.v_raw != raw;
    // Over the frame's budget, keep drawing the previous downsample (right place, coarser
    // detail) and refine next frame: a zoom over 100 runs x 100k points never stalls a frame.
    if (stale && Clock::now() > downsample_deadline_ && !c.ds_x.empty()) {
      frame_settled_ = false;
    } else if (stale) {
      DownsampleM4(c.xs, c.smooth, xa, cols, &c.ds_x, &c.ds_y);
      if (raw) {
        DownsampleM4(c.xs, std::span<const double>(c.y_src->values.data(), c.xs.size()), xa, cols,
                     &c.raw_x, &c.raw_y);
      } else {
        c.raw_x.clear();
        c.raw_y.clear();
      }
      c.v_cols = cols;
      c.v_lo = xa.lo;
      c.v_hi = xa.hi;
      c.v_log = log_x;
      c.v_raw = raw;
      ++c.ds_gen;
    }
    for (size_t i = 0; i < c.ds_x.size(); ++i) {
      if (c.ds_x[i] >= xa.lo && c.ds_x[i] <= xa.hi && (!log_y || c.ds_y[i] > 0)) {
        fit.AddY(c.ds_y[i]);
      }
    }
  }

  Plot plot(id, size, x_state, y_state, fit, log_x, log_y, m.title, kXNames[xk]);
  if (shown.empty()) {
    const char* msg = runs.empty() ? "no runs" : "loading...";
    plot.draw_list()->AddText(plot.inner().GetCenter(), ImGui::GetColorU32(ImGuiCol_TextDisabled),
                              msg);
    return;
  }
  Signature ident, content;
  ident.Add(log_x).Add(log_y).Add(raw).Add(xk).Add(smoothing);
  for (auto& s : shown) {
    ident.Add(s.run).Add(colors_[s.run]);
    content.Add(s.cache).Add(s.cache->ds_gen);
  }
  LineCanvas& canvas = Canvas(id);
  if (canvas.Begin(plot, ident.h, content.h, Clock::now() > canvas_deadline_)) {
    for (auto& s : shown) {
      if (!s.cache->raw_x.empty()) {
        canvas.Line(plot, s.cache->raw_x, s.cache->raw_y,
                    (colors_[s.run] & 0x00FFFFFF) | 0x50000000, 1.0f);
      }
    }
    for (auto& s : shown) {
      canvas.Line(plot, s.cache->ds_x, s.cache->ds_y, colors_[s.run], m.eval ? 2.0f : 1.6f);
      // Evaluations are sparse: mark each point so a single evaluation is visible.
      if (m.eval && s.cache->ds_x.size() < 200) {
        for (size_t i = 0; i < s.cache->ds_x.size(); ++i) {
          canvas.Dot(plot, s.cache->ds_x[i], s.cache->ds_y[i], colors_[s.run], 2.6f);
        }
      }
    }
  }
  canvas.End(plot);
  if (canvas.deferred()) frame_settled_ = false;
  if (plot.hovered()) {
    // Readout of every visible run at the cursor, highest value first.
    struct Row {
      double value, x;
      int64_t run;
    };
    std::vector<Row> rows;
    for (auto& s : shown) {
      const int64_t i = NearestIndexAtOrBefore(s.cache->xs, plot.mouse_x());
      if (i < 0) continue;
      const double v = s.cache->smooth[i];
      rows.push_back({v, s.cache->xs[i], s.run});
      plot.Marker(s.cache->xs[i], v, colors_[s.run], 3.5f);
    }
    std::sort(rows.begin(), rows.end(),
              [](const Row& a, const Row& b) { return a.value > b.value; });
    ImGui::BeginTooltip();
    ImGui::Text("%s at %s = %s", m.title, kXNames[xk], FormatValue(plot.mouse_x()).c_str());
    ImGui::Separator();
    const size_t limit = 30;
    for (size_t i = 0; i < rows.size() && i < limit; ++i) {
      ImGui::ColorButton("##c", ImGui::ColorConvertU32ToFloat4(colors_[rows[i].run]),
                         ImGuiColorEditFlags_NoTooltip, ImVec2(10, 10));
      ImGui::SameLine();
      ImGui::Text("%-10s  %s", FormatValue(rows[i].value).c_str(), RunLabel(rows[i].run).c_str());
    }
    if (rows.size() > limit) ImGui::TextDisabled("... %zu more", rows.size() - limit);
    ImGui::EndTooltip();
  }
}

void App::CurvesView() {
  const RunsSnapshot& rs = *runs_;
  ImGui::SetNextItemWidth(130);
  ImGui::Combo("x", &settings_.x_axis, kXNames, 4);
  ImGui::SameLine();
  ImGui::Checkbox("log x", &settings_.log_x);
  ImGui::SameLine();
  ImGui::Checkbox("log y", &settings_.log_y);
  ImGui::SameLine();
  ImGui::SetNextItemWidth(120);
  ImGui::SliderFloat("smoothing", &settings_.smoothing, 0.0f, 0.99f, "%.2f");
  HelpMarker(
      "Exponential moving average with debiasing (TensorBoard's): early points are not "
      "pulled towards zero. Applied to the full series before downsampling, so the "
      "smoothed line does not change with zoom.");
  ImGui::SameLine();
  ImGui::Checkbox("raw", &settings_.show_raw);
  if (ImGui::IsItemHovered()) {
    ImGui::SetTooltip("Unsmoothed values drawn faintly behind the smoothed line (up to %zu runs).",
                      kMaxRawRuns);
  }
  ImGui::SameLine();
  ImGui::SetNextItemWidth(170);
  KeyCombo("colour by", &settings_.color_key, rs, "(one colour per run)");
  ImGui::SameLine();
  if (ImGui::Checkbox("follow live", &settings_.follow_live) && settings_.follow_live) {
    curve_x_.auto_fit = true;
    for (auto& y : curve_y_) y.auto_fit = true;
  }
  HelpMarker(
      "Follow live keeps every axis fitted to the data as it arrives. Mouse wheel zooms x "
      "(Shift+wheel: y), drag pans, double-click refits.");
  if (!curve_x_.auto_fit) settings_.follow_live = false;
  for (int i = 0; i < 5; ++i) {
    if (i > 0) ImGui::SameLine();
    bool on = settings_.panels[i] != 0;
    if (ImGui::Checkbox(kMetrics[i].title, &on)) settings_.panels[i] = on ? 1 : 0;
  }
  const std::vector<int64_t> runs = ShownRuns();
  AssignColors(runs);
  if (selection_.empty()) {
    ImGui::TextDisabled("Showing all %zu runs (select runs in the Runs view to narrow).",
                        runs.size());
  }
  Legend(runs);

  std::vector<int> panels;
  for (int i = 0; i < 5; ++i) {
    if (settings_.panels[i]) panels.push_back(i);
  }
  if (panels.empty()) return;
  const ImVec2 avail = ImGui::GetContentRegionAvail();
  const int ncol = panels.size() == 1 ? 1 : 2;
  const int nrow = (static_cast<int>(panels.size()) + ncol - 1) / ncol;
  const float sp = ImGui::GetStyle().ItemSpacing.x;
  const ImVec2 size(
      (avail.x - sp * (ncol - 1)) / ncol,
      std::max(120.0f, (avail.y - ImGui::GetStyle().ItemSpacing.y * (nrow - 1)) / nrow));
  for (size_t i = 0; i < panels.size(); ++i) {
    if (i % ncol != 0) ImGui::SameLine();
    CurvePanel(kMetrics[panels[i]].key, panels[i], runs, size, &curve_x_, &curve_y_[panels[i]]);
  }
}

// ---- Max logits -----------------------------------------------------------------------------

void App::LogitColumn(int column, int64_t run, double vmin, double vmax, float width) {
  ImGui::BeginGroup();
  ImGui::PushID(column);
  const RunEntry* entry = runs_->Find(run);
  auto data = store_->Logits(run);
  if (!data) frame_settled_ = false;
  // Run chooser.
  ImGui::SetNextItemWidth(width * 0.6f);
  if (ImGui::BeginCombo("run", RunLabel(run).c_str())) {
    for (const auto& r : runs_->runs) {
      if (r->row.shape.layers <= 0) continue;
      if (ImGui::Selectable(RunLabel(r->row.id).c_str(), r->row.id == run)) {
        logit_runs_[column] = r->row.id;
        logit_step_[column] = -1;
      }
    }
    ImGui::EndCombo();
  }
  const std::optional<double> tau = entry ? entry->tau : std::nullopt;
  // A plain copy: GCC 12 reports the optional as maybe-uninitialized when dereferenced here.
  const double tau_value = tau.value_or(0.0);
  ImGui::SameLine();
  if (tau) {
    ImGui::TextColored(ImGui::ColorConvertU32ToFloat4(kTauColor), "QK-Clip \xcf\x84 = %s",
                       FormatValue(tau_value).c_str());
  } else {
    ImGui::TextDisabled("QK-Clip off");
  }
  if (!data || data->steps.empty()) {
    ImGui::TextDisabled(data ? "no max-logit records for this run" : "loading...");
    ImGui::PopID();
    ImGui::EndGroup();
    return;
  }
  if (data->layers <= 0 || data->heads <= 0 ||
      data->values.size() != data->steps.size() * data->layers * data->heads) {
    ImGui::TextDisabled("max-logit records of this run have no usable shape");
    ImGui::PopID();
    ImGui::EndGroup();
    return;
  }
  auto& slot = logit_caches_[run];
  if (!slot) slot = std::make_unique<LogitCache>();
  LogitCache& c = *slot;
  const int L = data->layers, H = data->heads;
  const size_t n = data->steps.size();
  if (c.version != data->version) {
    c.version = data->version;
    c.layer_series.assign(L, std::vector<double>(n));
    for (size_t i = 0; i < n; ++i) {
      for (int l = 0; l < L; ++l) c.layer_series[l][i] = data->layer_max[i * L + l];
    }
    std::vector<int64_t> steps(n);
    for (size_t i = 0; i < n; ++i) steps[i] = static_cast<int64_t>(data->steps[i]);
    c.clip = ClipFraction(steps, data->clips, L, H);
    c.clip_steps.clear();
    for (const auto& e : data->clips) {
      if (c.clip_steps.empty() || c.clip_steps.back() != static_cast<double>(e.step)) {
        c.clip_steps.push_back(static_cast<double>(e.step));
      }
    }
    c.v_cols = 0;
  }

  // Step slider over the recorded steps.
  int& idx = logit_step_[column];
  int shown_idx = idx < 0 ? static_cast<int>(n) - 1 : std::min(idx, static_cast<int>(n) - 1);
  ImGui::SetNextItemWidth(width * 0.6f);
  char fmt[64];
  std::snprintf(fmt, sizeof(fmt), "step %lld", static_cast<long long>(data->steps[shown_idx]));
  if (ImGui::SliderInt("##step", &shown_idx, 0, static_cast<int>(n) - 1, fmt)) idx = shown_idx;
  ImGui::SameLine();
  bool latest = idx < 0;
  if (ImGui::Checkbox("latest", &latest)) idx = latest ? -1 : shown_idx;
  const double step = data->steps[shown_idx];

  // Heatmap: layers (rows) x heads (columns) with values when the cells are large enough.
  const float fh = ImGui::GetFontSize();
  const float label_w = fh * 2.5f;
  const float cell_w = std::max(4.0f, (width - label_w) / H);
  const float cell_h = std::clamp(cell_w * 0.6f, 6.0f, fh * 1.5f);
  ImDrawList* dl = ImGui::GetWindowDrawList();
  const ImVec2 origin = ImGui::GetCursorScreenPos();
  const float* mat = data->values.data() + static_cast<size_t>(shown_idx) * L * H;
  ImGui::TextDisabled("S_max per layer (rows) and head (columns)");
  const ImVec2 o(origin.x, origin.y + fh * 1.3f);
  int hovered_l = -1, hovered_h = -1;
  const ImVec2 mouse = ImGui::GetIO().MousePos;
  for (int l = 0; l < L; ++l) {
    char lbl[16];
    std::snprintf(lbl, sizeof(lbl), "L%d", l);
    dl->AddText(ImVec2(o.x, o.y + l * cell_h + (cell_h - fh) / 2),
                ImGui::GetColorU32(ImGuiCol_TextDisabled), lbl);
    for (int h = 0; h < H; ++h) {
      const float v = mat[l * H + h];
      const Rgba bg = HeatColor(v, vmin, vmax);
      const ImVec2 a(o.x + label_w + h * cell_w, o.y + l * cell_h);
      const ImVec2 b(a.x + cell_w - 1, a.y + cell_h - 1);
      dl->AddRectFilled(a, b, ToImU32(bg));
      if (tau && v > tau_value) dl->AddRect(a, b, kTauColor, 0, 0, 2.0f);
      if (cell_w >= fh * 2.4f && cell_h >= fh) {
        char txt[16];
        std::snprintf(txt, sizeof(txt), "%.0f", v);
        const float tw = ImGui::CalcTextSize(txt).x;
        dl->AddText(ImVec2(a.x + (cell_w - tw) / 2, a.y + (cell_h - fh) / 2),
                    ToImU32(ContrastText(bg)), txt);
      }
      if (mouse.x >= a.x && mouse.x < b.x + 1 && mouse.y >= a.y && mouse.y < b.y + 1) {
        hovered_l = l;
        hovered_h = h;
      }
    }
  }
  for (int h = 0; h < H; h += std::max(1, static_cast<int>(fh * 2 / cell_w))) {
    char lbl[16];
    std::snprintf(lbl, sizeof(lbl), "h%d", h);
    dl->AddText(ImVec2(o.x + label_w + h * cell_w + 1, o.y + L * cell_h + 1),
                ImGui::GetColorU32(ImGuiCol_TextDisabled), lbl);
  }
  ImGui::Dummy(ImVec2(width, fh * 1.3f + L * cell_h + fh * 1.2f));
  if (hovered_l >= 0 && ImGui::IsWindowHovered()) {
    ImGui::SetTooltip("layer %d, head %d at step %lld: S_max = %s", hovered_l, hovered_h,
                      static_cast<long long>(step),
                      FormatValue(mat[hovered_l * H + hovered_h]).c_str());
  }
  ColorBar(std::min(200.0f, width * 0.4f), fh, vmin, vmax);

  // Timeline: per layer max over heads, τ, clip events, the slider's step.
  const float plot_h = std::max(140.0f, (ImGui::GetContentRegionAvail().y - fh * 1.5f) * 0.62f);
  const int cols = std::max(16, static_cast<int>(width - fh * 5.4f));
  PlotBounds fit;
  fit.AddX(data->steps.front());
  fit.AddX(data->steps.back());
  for (const auto& s : c.layer_series) {
    for (double v : s) fit.AddY(v);
  }
  if (tau) fit.AddY(tau_value);
  {
    Plot plot("timeline", ImVec2(width, plot_h), &logit_x_, &logit_y_[column], fit, false, false,
              "max over heads per layer" + std::string(tau ? ", \xcf\x84 and clip events" : ""),
              "step");
    const AxisMap& xa = plot.x_axis();
    if (c.v_cols != cols || c.v_lo != xa.lo || c.v_hi != xa.hi) {
      c.ds_x.resize(L);
      c.ds_y.resize(L);
      for (int l = 0; l < L; ++l)
        DownsampleM4(data->steps, c.layer_series[l], xa, cols, &c.ds_x[l], &c.ds_y[l]);
      DownsampleM4(c.clip.steps, c.clip.fraction, xa, cols, &c.clip_ds_x, &c.clip_ds_y);
      c.v_cols = cols;
      c.v_lo = xa.lo;
      c.v_hi = xa.hi;
    }
    Signature sig;
    sig.Add(c.version).Add(c.v_cols);
    LineCanvas& canvas = Canvas("timeline" + std::to_string(column));
    if (canvas.Begin(plot, Signature().Add(run).h, sig.h)) {
      for (int l = 0; l < L; ++l)
        canvas.Line(plot, c.ds_x[l], c.ds_y[l], ToImU32(GroupColor(l, L, true)), 1.6f);
    }
    canvas.End(plot);
    if (tau) plot.HLine(tau_value, kTauColor, true, "\xcf\x84");
    float last_px = -1e9f;
    for (double s : c.clip_steps) {
      const float px = plot.ToPixel(s, 0).x;
      if (px - last_px < 1.0f) continue;  // one tick per pixel column
      last_px = px;
      plot.BottomTick(s, kTauColor, 8.0f);
    }
    plot.VLine(step, IM_COL32(255, 255, 255, 110));
    if (plot.hovered()) {
      const int64_t i = NearestIndexAtOrBefore(data->steps, plot.mouse_x());
      ImGui::BeginTooltip();
      ImGui::Text("step %lld", static_cast<long long>(data->steps[i]));
      for (int l = 0; l < L; ++l) {
        ImGui::TextColored(ImGui::ColorConvertU32ToFloat4(ToImU32(GroupColor(l, L, true))),
                           "layer %d: %s", l, FormatValue(c.layer_series[l][i]).c_str());
      }
      ImGui::EndTooltip();
    }
  }
  // Layer legend.
  for (int l = 0; l < L; ++l) {
    if (l > 0) ImGui::SameLine(0, 6);
    ImGui::TextColored(ImGui::ColorConvertU32ToFloat4(ToImU32(GroupColor(l, L, true))), "L%d", l);
  }
  PlotBounds cf;
  cf.AddX(data->steps.front());
  cf.AddX(data->steps.back());
  cf.AddY(0);
  for (double v : c.clip.fraction) cf.AddY(v);
  cf.AddY(std::max(cf.y_hi, 0.05));
  {
    Plot plot("clipfrac", ImVec2(width, -1), &logit_x_, &clip_y_[column], cf, false, false,
              "fraction of heads clipped", "step");
    Signature sig;
    sig.Add(c.version).Add(c.v_cols);
    LineCanvas& canvas = Canvas("clipfrac" + std::to_string(column));
    if (canvas.Begin(plot, Signature().Add(run).h, sig.h))
      canvas.Line(plot, c.clip_ds_x, c.clip_ds_y, kTauColor, 1.6f);
    canvas.End(plot);
    if (c.clip.steps.empty()) {
      plot.draw_list()->AddText(plot.inner().GetCenter(), ImGui::GetColorU32(ImGuiCol_TextDisabled),
                                "no clip events");
    }
  }
  ImGui::PopID();
  ImGui::EndGroup();
}

void App::LogitsView() {
  // Two runs side by side: the first two selected runs with max-logit records, else the first
  // two such runs. A column's combo overrides that.
  std::vector<int64_t> candidates;
  for (int64_t id : selection_) {
    const RunEntry* e = runs_->Find(id);
    if (e && e->row.shape.layers > 0) candidates.push_back(id);
  }
  for (const auto& r : runs_->runs) {
    if (r->row.shape.layers > 0 &&
        std::find(candidates.begin(), candidates.end(), r->row.id) == candidates.end()) {
      candidates.push_back(r->row.id);
    }
  }
  if (candidates.empty()) {
    ImGui::TextDisabled("No run records per-head max logits yet.");
    return;
  }
  int64_t shown[2];
  for (int c = 0; c < 2; ++c) {
    shown[c] = logit_runs_[c] >= 0 && runs_->Find(logit_runs_[c])
                   ? logit_runs_[c]
                   : candidates[std::min<size_t>(c, candidates.size() - 1)];
  }
  const int columns = candidates.size() > 1 || logit_runs_[1] >= 0 ? 2 : 1;
  // One colour scale for both runs, so equal colours mean equal logits.
  double vmin = INFINITY, vmax = -INFINITY;
  for (int c = 0; c < columns; ++c) {
    auto d = store_->Logits(shown[c]);
    if (!d) continue;
    auto& slot = logit_caches_[shown[c]];
    if (!slot) slot = std::make_unique<LogitCache>();
    if (slot->range_version != d->version) {
      // Scanning every matrix is O(steps × layers × heads): once per new snapshot only.
      slot->range_version = d->version;
      slot->vmin = INFINITY;
      slot->vmax = -INFINITY;
      for (float v : d->values) {
        if (std::isfinite(v)) {
          slot->vmin = std::min(slot->vmin, v);
          slot->vmax = std::max(slot->vmax, v);
        }
      }
    }
    vmin = std::min<double>(vmin, slot->vmin);
    vmax = std::max<double>(vmax, slot->vmax);
  }
  if (!std::isfinite(vmin)) vmin = vmax = 0;
  const float sp = ImGui::GetStyle().ItemSpacing.x * 2;
  const float width = (ImGui::GetContentRegionAvail().x - sp * (columns - 1)) / columns;
  for (int c = 0; c < columns; ++c) {
    if (c > 0) ImGui::SameLine(0, sp);
    LogitColumn(c, shown[c], vmin, vmax, width);
  }
}

// ---- Experts --------------------------------------------------------------------------------

void App::ExpertsView() {
  std::vector<int64_t> candidates;
  for (int64_t id : selection_) {
    const RunEntry* e = runs_->Find(id);
    if (e && e->row.shape.moe_layers > 0) candidates.push_back(id);
  }
  for (const auto& r : runs_->runs) {
    if (r->row.shape.moe_layers > 0 &&
        std::find(candidates.begin(), candidates.end(), r->row.id) == candidates.end()) {
      candidates.push_back(r->row.id);
    }
  }
  if (candidates.empty()) {
    ImGui::TextDisabled("No MoE run records expert loads yet.");
    return;
  }
  const int64_t run = expert_run_ >= 0 && runs_->Find(expert_run_) ? expert_run_ : candidates[0];
  ImGui::SetNextItemWidth(300);
  if (ImGui::BeginCombo("run", RunLabel(run).c_str())) {
    for (int64_t id : candidates) {
      if (ImGui::Selectable(RunLabel(id).c_str(), id == run)) expert_run_ = id;
    }
    ImGui::EndCombo();
  }
  auto data = store_->Experts(run);
  if (!data) {
    frame_settled_ = false;
    ImGui::TextDisabled("loading...");
    return;
  }
  if (data->steps.empty()) {
    ImGui::TextDisabled("no expert-load records for this run");
    return;
  }
  const int L = data->moe_layers, E = data->experts;
  const size_t n = data->steps.size();
  if (L <= 0 || E <= 0 || data->counts.size() != n * L * E) {
    ImGui::TextDisabled("expert-load records of this run have no usable shape");
    return;
  }
  auto& slot = expert_caches_[run];
  if (!slot) slot = std::make_unique<ExpertCache>();
  ExpertCache& c = *slot;
  if (c.version != data->version) {
    c.version = data->version;
    c.cv.assign(L, std::vector<double>(n));
    c.max_mean.assign(L, std::vector<double>(n));
    for (size_t i = 0; i < n; ++i) {
      for (int l = 0; l < L; ++l) {
        const Imbalance im = ExpertImbalance(std::span<const int64_t>(
            data->counts.data() + (i * L + l) * static_cast<size_t>(E), E));
        c.cv[l][i] = im.cv;
        c.max_mean[l][i] = im.max_over_mean;
      }
    }
  }
  ImGui::SameLine();
  ImGui::TextDisabled(
      "%d MoE layers x %d routed experts, %zu records. Heatmap: share of the "
      "layer's tokens per expert (1/E = %.3g is balanced).",
      L, E, n, 1.0 / E);

  const float fh = ImGui::GetFontSize();
  const ImVec2 avail = ImGui::GetContentRegionAvail();
  const float left_w = avail.x * 0.58f;
  const float right_w = avail.x - left_w - ImGui::GetStyle().ItemSpacing.x;

  // Left: one heatmap per MoE layer, time in pixel bins (mean share per bin) x experts.
  ImGui::BeginChild("heatmaps", ImVec2(left_w, avail.y), false);
  const float label_w = fh * 2.5f;
  const float hm_w = left_w - label_w - fh;
  const float strip_h = std::clamp((avail.y - fh) / L - fh * 1.6f, 24.0f, 240.0f);
  AxisMap xa{data->steps.front(), data->steps.back(), false};
  if (!expert_x_.auto_fit && expert_x_.hi > expert_x_.lo) xa = {expert_x_.lo, expert_x_.hi, false};
  if (!(xa.hi > xa.lo)) xa.hi = xa.lo + 1;
  const int bins = std::max(1, static_cast<int>(hm_w / 2));
  Signature hsig;
  hsig.Add(c.version).Add(xa.lo).Add(xa.hi).Add(bins);
  if (hsig.h != c.hm_sig) {
    // Mean share per (time bin, expert) per layer, as one texture per layer (bins x experts
    // pixels): a few thousand rects per layer would cost llvmpipe more than the whole frame.
    c.hm_sig = hsig.h;
    c.bins = bins;
    c.share.assign(L, std::vector<double>(static_cast<size_t>(bins) * E, 0.0));
    c.tex.resize(L);
    std::vector<int> cnt(bins);
    std::vector<uint32_t> pixels(static_cast<size_t>(bins) * E);
    const size_t i0 =
        std::lower_bound(data->steps.begin(), data->steps.end(), xa.lo) - data->steps.begin();
    const size_t i1 =
        std::upper_bound(data->steps.begin(), data->steps.end(), xa.hi) - data->steps.begin();
    for (int l = 0; l < L; ++l) {
      std::vector<double>& share = c.share[l];
      std::fill(cnt.begin(), cnt.end(), 0);
      for (size_t i = i0; i < i1; ++i) {
        const int b = std::clamp(static_cast<int>(xa.Forward(data->steps[i]) * bins), 0, bins - 1);
        const int64_t* row = data->counts.data() + (i * L + l) * static_cast<size_t>(E);
        double total = 0;
        for (int e = 0; e < E; ++e) total += static_cast<double>(row[e]);
        if (total <= 0) continue;
        for (int e = 0; e < E; ++e) share[static_cast<size_t>(b) * E + e] += row[e] / total;
        ++cnt[b];
      }
      double vmax = 0;
      int last = -1, first = -1;
      for (int b = 0; b < bins; ++b) {
        if (cnt[b] > 0 && first < 0) first = b;
        if (cnt[b] == 0) {
          // Records sparser than the bins: repeat the previous bin so the strip stays solid.
          if (last >= 0)
            std::copy_n(&share[static_cast<size_t>(last) * E], E,
                        &share[static_cast<size_t>(b) * E]);
          continue;
        }
        last = b;
        for (int e = 0; e < E; ++e) {
          share[static_cast<size_t>(b) * E + e] /= cnt[b];
          vmax = std::max(vmax, share[static_cast<size_t>(b) * E + e]);
        }
      }
      for (int e = 0; e < E; ++e) {
        for (int b = 0; b < bins; ++b) {
          const bool empty = first < 0 || b < first;
          pixels[static_cast<size_t>(e) * bins + b] =
              empty ? 0u : ToImU32(HeatColor(share[static_cast<size_t>(b) * E + e], 0, vmax));
        }
      }
      if (!c.tex[l]) c.tex[l] = std::make_unique<Texture>();
      c.tex[l]->Upload(bins, E, pixels.data());
    }
  }
  ImDrawList* dl = ImGui::GetWindowDrawList();
  for (int l = 0; l < L; ++l) {
    ImGui::Text("MoE layer %d", l);
    const ImVec2 o = ImGui::GetCursorScreenPos();
    const float cell_h = strip_h / E;
    dl->AddImage(c.tex[l]->id(), ImVec2(o.x + label_w, o.y),
                 ImVec2(o.x + label_w + hm_w, o.y + strip_h));
    dl->AddText(ImVec2(o.x, o.y), ImGui::GetColorU32(ImGuiCol_TextDisabled), "e0");
    char lbl[16];
    std::snprintf(lbl, sizeof(lbl), "e%d", E - 1);
    dl->AddText(ImVec2(o.x, o.y + strip_h - fh), ImGui::GetColorU32(ImGuiCol_TextDisabled), lbl);
    ImGui::Dummy(ImVec2(left_w - fh, strip_h));
    const ImVec2 hm_min(o.x + label_w, o.y), hm_max(o.x + label_w + hm_w, o.y + strip_h);
    if (ImGui::IsMouseHoveringRect(hm_min, hm_max) && ImGui::IsWindowHovered()) {
      const double t = (ImGui::GetIO().MousePos.x - hm_min.x) / hm_w;
      const int b = std::clamp(static_cast<int>(t * bins), 0, bins - 1);
      const int e =
          std::clamp(static_cast<int>((ImGui::GetIO().MousePos.y - o.y) / cell_h), 0, E - 1);
      ImGui::SetTooltip("layer %d, expert %d, steps ~%s: %.2f%% of tokens (balanced %.2f%%)", l, e,
                        FormatValue(xa.Inverse(t)).c_str(),
                        100 * c.share[l][static_cast<size_t>(b) * E + e], 100.0 / E);
    }
  }
  ImGui::EndChild();
  ImGui::SameLine();

  // Right: imbalance curves, one line per layer.
  ImGui::BeginChild("imbalance", ImVec2(right_w, avail.y), false);
  const int cols = std::max(16, static_cast<int>(right_w - fh * 5.4f));
  for (int which = 0; which < 2; ++which) {
    const auto& series = which == 0 ? c.cv : c.max_mean;
    PlotBounds fit;
    fit.AddX(data->steps.front());
    fit.AddX(data->steps.back());
    for (const auto& s : series) {
      for (double v : s) fit.AddY(v);
    }
    if (which == 1) fit.AddY(1.0);
    if (which == 0) fit.AddY(0.0);
    Plot plot(
        which == 0 ? "cv" : "maxmean", ImVec2(right_w, which == 0 ? avail.y * 0.5f - 4 : -1),
        &expert_x_, which == 0 ? &expert_cv_y_ : &expert_mm_y_, fit, false, false,
        which == 0 ? "load imbalance: coefficient of variation" : "load imbalance: max / mean",
        "step");
    Signature sig;
    sig.Add(c.version).Add(cols);
    LineCanvas& canvas = Canvas(which == 0 ? "cv" : "maxmean");
    if (canvas.Begin(plot, Signature().Add(run).h, sig.h)) {
      std::vector<double> dx, dy;
      for (int l = 0; l < L; ++l) {
        DownsampleM4(data->steps, series[l], plot.x_axis(), cols, &dx, &dy);
        canvas.Line(plot, dx, dy, ToImU32(GroupColor(l, L, true)), 1.6f);
      }
    }
    canvas.End(plot);
    if (which == 1) plot.HLine(1.0, IM_COL32(200, 200, 200, 120), true, "balanced");
    if (plot.hovered()) {
      const int64_t i = NearestIndexAtOrBefore(data->steps, plot.mouse_x());
      ImGui::BeginTooltip();
      ImGui::Text("step %lld", static_cast<long long>(data->steps[i]));
      for (int l = 0; l < L; ++l) {
        ImGui::TextColored(ImGui::ColorConvertU32ToFloat4(ToImU32(GroupColor(l, L, true))),
                           "MoE layer %d: %s", l, FormatValue(series[l][i]).c_str());
      }
      ImGui::EndTooltip();
    }
  }
  ImGui::EndChild();
}

// ---- Compare --------------------------------------------------------------------------------

void App::CompareView() {
  std::vector<int64_t> runs;
  for (int64_t id : selection_) {
    if (runs_->Find(id)) runs.push_back(id);
  }
  if (runs.size() < 2) {
    ImGui::TextWrapped(
        "Select two or more runs in the Runs view (Ctrl+click or Shift+click) to "
        "compare their configs, summaries and curves.");
    return;
  }
  AssignColors(runs);
  const ImVec2 avail = ImGui::GetContentRegionAvail();
  const float top_h = avail.y * 0.45f;
  const ImGuiTableFlags tflags = ImGuiTableFlags_RowBg | ImGuiTableFlags_BordersInnerV |
                                 ImGuiTableFlags_ScrollY | ImGuiTableFlags_ScrollX |
                                 ImGuiTableFlags_Resizable | ImGuiTableFlags_SizingFixedFit;
  const int ncols = std::min<int>(static_cast<int>(runs.size()) + 1, 63);
  std::vector<std::map<std::string, std::string>> configs;
  for (int64_t id : runs) configs.push_back(runs_->Find(id)->keys.config);
  std::vector<DiffRow> diff = ConfigDiff(configs);

  auto header = [&](const char* first) {
    ImGui::TableSetupScrollFreeze(1, 1);
    ImGui::TableSetupColumn(first);
    for (int i = 0; i + 1 < ncols; ++i) ImGui::TableSetupColumn(RunLabel(runs[i]).c_str());
    ImGui::TableNextRow(ImGuiTableRowFlags_Headers);
    for (int i = 0; i < ncols; ++i) {
      ImGui::TableSetColumnIndex(i);
      if (i > 0) {
        ImGui::ColorButton("##c", ImGui::ColorConvertU32ToFloat4(colors_[runs[i - 1]]),
                           ImGuiColorEditFlags_NoTooltip, ImVec2(10, 10));
        ImGui::SameLine();
      }
      ImGui::TableHeader(ImGui::TableGetColumnName(i));
    }
  };

  ImGui::BeginChild("top", ImVec2(0, top_h), false);
  const float half = ImGui::GetContentRegionAvail().x * 0.5f - 4;
  ImGui::BeginChild("diff", ImVec2(half, 0), false);
  ImGui::Text("Config fields that differ (%zu)", diff.size());
  if (ImGui::BeginTable("diff", ncols, tflags)) {
    header("field");
    for (const auto& row : diff) {
      ImGui::TableNextRow();
      ImGui::TableSetColumnIndex(0);
      ImGui::TextUnformatted(row.key.c_str());
      for (int i = 0; i + 1 < ncols; ++i) {
        ImGui::TableSetColumnIndex(i + 1);
        ImGui::TextUnformatted(row.values[i].c_str());
      }
    }
    ImGui::EndTable();
  }
  ImGui::EndChild();
  ImGui::SameLine();
  ImGui::BeginChild("summary", ImVec2(0, 0), false);
  ImGui::TextUnformatted("Summary");
  if (ImGui::BeginTable("summary", ncols, tflags)) {
    header("metric");
    auto row = [&](const char* name, auto fn) {
      ImGui::TableNextRow();
      ImGui::TableSetColumnIndex(0);
      ImGui::TextUnformatted(name);
      for (int i = 0; i + 1 < ncols; ++i) {
        ImGui::TableSetColumnIndex(i + 1);
        ImGui::TextUnformatted(fn(runs_->Find(runs[i])->row).c_str());
      }
    };
    row("status", [](const db::RunRow& r) { return r.effective_status; });
    row("steps", [](const db::RunRow& r) { return std::to_string(r.last_step); });
    row("last loss", [](const db::RunRow& r) { return Opt(r.last_loss); });
    row("best val loss", [](const db::RunRow& r) { return Opt(r.best_val_loss); });
    row("last val loss", [](const db::RunRow& r) { return Opt(r.last_val_loss); });
    row("tokens", [](const db::RunRow& r) { return FormatValue(static_cast<double>(r.tokens)); });
    row("training FLOPs", [](const db::RunRow& r) { return FormatValue(r.flops); });
    row("tokens/s", [](const db::RunRow& r) { return Opt(r.tokens_per_s); });
    row("params total",
        [](const db::RunRow& r) { return FormatValue(static_cast<double>(r.shape.params_total)); });
    row("params active", [](const db::RunRow& r) {
      return FormatValue(static_cast<double>(r.shape.params_active));
    });
    row("FLOPs / token", [](const db::RunRow& r) { return FormatValue(r.shape.flops_per_token); });
    ImGui::EndTable();
  }
  ImGui::EndChild();
  ImGui::EndChild();

  Legend(runs);
  const ImVec2 rest = ImGui::GetContentRegionAvail();
  const ImVec2 size((rest.x - ImGui::GetStyle().ItemSpacing.x) / 2, rest.y);
  CurvePanel("cmp_loss", 0, runs, size, &compare_x_, &compare_y_[0]);
  ImGui::SameLine();
  CurvePanel("cmp_val", 1, runs, size, &compare_x_, &compare_y_[1]);
}

// ---- Scaling laws ---------------------------------------------------------------------------

void App::ScalingView() {
#ifdef MOELAB_GUI_HAVE_FITS
  if (!fit_job_) fit_job_ = std::make_unique<FitJob>();
  const RunsSnapshot& rs = *runs_;
  // Scope: a sweep or every run.
  std::string sweep_label = "(all runs)";
  if (scaling_sweep_ >= 0) {
    auto it = rs.sweeps.find(scaling_sweep_);
    sweep_label = it != rs.sweeps.end() ? it->second : "#" + std::to_string(scaling_sweep_);
  }
  ImGui::SetNextItemWidth(180);
  if (ImGui::BeginCombo("sweep", sweep_label.c_str())) {
    if (ImGui::Selectable("(all runs)", scaling_sweep_ < 0)) scaling_sweep_ = -1;
    for (const auto& [id, name] : rs.sweeps) {
      if (ImGui::Selectable(name.c_str(), scaling_sweep_ == id)) scaling_sweep_ = id;
    }
    ImGui::EndCombo();
  }
  ImGui::SameLine();
  ImGui::SetNextItemWidth(200);
  KeyCombo("family", &settings_.family_key, rs, "(choose a key)");
  HelpMarker(
      "Runs are grouped into families by this sweep variable or config key. Each family's "
      "compute-optimal frontier (lower envelope of validation loss over training FLOPs) is "
      "fitted with L(C) = E + A·C^-α by analysis/ (Huber loss in log space, bootstrap over "
      "runs, 200 resamples here). Drag the dashed target line to move L*.");
  // A key this database does not have (say, last session's): fall back to its first sweep
  // variable rather than an empty view.
  const bool known =
      settings_.family_key.rfind("var:", 0) == 0
          ? std::binary_search(rs.var_keys.begin(), rs.var_keys.end(),
                               settings_.family_key.substr(4))
          : std::binary_search(rs.config_keys.begin(), rs.config_keys.end(), settings_.family_key);
  if (!known && !rs.var_keys.empty()) settings_.family_key = "var:" + rs.var_keys.front();
  if (settings_.family_key.empty()) {
    ImGui::TextDisabled("Choose the key that defines the families (e.g. var:sparsity).");
    return;
  }
  // Refit when the set of finished runs in scope changes.
  Signature data;
  for (const auto& r : rs.runs) {
    if (scaling_sweep_ >= 0 && r->row.sweep_id != scaling_sweep_) continue;
    if (r->row.effective_status != "done" && r->row.effective_status != "diverged") continue;
    data.Add(r->row.id).Add(r->row.updated_at.value_or(0));
  }
  FitRequest req;
  req.db_path = store_->path();
  if (scaling_sweep_ >= 0) req.sweep_id = scaling_sweep_;
  req.family_key = settings_.family_key.rfind("var:", 0) == 0 ? settings_.family_key.substr(4)
                                                              : settings_.family_key;
  req.heads_base = heads_base_;
  req.heads_treatment = heads_treatment_;
  req.data_version = data.h;
  fit_job_->Submit(req);
  auto res = fit_job_->Result();
  const bool busy = fit_job_->Busy();
  if (busy || !res || !(res->request == req)) frame_settled_ = false;
  if (busy) {
    ImGui::SameLine();
    ImGui::TextColored(ImVec4(0.9f, 0.8f, 0.3f, 1), "fitting...");
  }
  if (!res) return;
  if (res->request.family_key != req.family_key || res->request.sweep_id != req.sweep_id) {
    ImGui::TextDisabled("fitting %s ...", req.family_key.c_str());
    return;
  }
  ImGui::SameLine();
  ImGui::TextDisabled("%d runs, %zu points, %zu skipped, fitted in %.1f s",
                      res->observations.runs_used, res->observations.points.size(),
                      res->observations.skipped.size(), res->seconds);
  if (ImGui::IsItemHovered() && !res->observations.skipped.empty()) {
    ImGui::BeginTooltip();
    for (size_t i = 0; i < res->observations.skipped.size() && i < 30; ++i) {
      ImGui::TextUnformatted(res->observations.skipped[i].c_str());
    }
    ImGui::EndTooltip();
  }
  if (!res->error.empty() || !res->fits) {
    ImGui::PushStyleColor(ImGuiCol_Text, IM_COL32(240, 110, 100, 255));
    ImGui::TextWrapped("No fit: %s", res->error.c_str());
    ImGui::PopStyleColor();
    return;
  }
  const analysis::FamilyFits& fits = *res->fits;
  std::vector<std::string> families;
  for (const auto& f : fits.families) families.push_back(f.family);
  std::stable_sort(families.begin(), families.end(), ValueLess);
  bool ordered = true;
  for (const auto& f : families) ordered = ordered && IsNumber(f);
  std::map<std::string, ImU32> fam_color;
  for (size_t i = 0; i < families.size(); ++i) {
    fam_color[families[i]] =
        ToImU32(GroupColor(static_cast<int>(i), static_cast<int>(families.size()), ordered));
  }
  if (std::find(families.begin(), families.end(), fit_reference_) == families.end()) {
    fit_reference_ = families.back();  // the sparsest / largest value: the report's reference
  }
  // Default L*: inside every family's measured frontier loss range.
  double lo_all = -INFINITY, hi_all = INFINITY;
  for (const auto& f : fits.families) {
    lo_all = std::max(lo_all, f.min_loss);
    hi_all = std::min(hi_all, f.max_loss);
  }
  if (!(target_loss_ > 0) || target_family_key_ != req.family_key) {
    target_family_key_ = req.family_key;
    target_loss_ = hi_all > lo_all ? lo_all + 0.3 * (hi_all - lo_all) : lo_all;
  }

  const ImVec2 avail = ImGui::GetContentRegionAvail();
  const float plot_w = avail.x * 0.6f;
  ImGui::BeginGroup();
  PlotBounds fit;
  for (const auto& p : res->observations.points) {
    if (p.flops > 0 && p.loss > 0 && std::isfinite(p.loss)) fit.Add(p.flops, p.loss);
  }
  // Dragging the target line must not pan the plot.
  const ImVec2 mouse = ImGui::GetIO().MousePos;
  const bool near_target = std::abs(mouse.y - target_px_) < 6 && mouse.x > plot_rect_.Min.x &&
                           mouse.x < plot_rect_.Max.x;
  if (near_target && ImGui::IsMouseClicked(ImGuiMouseButton_Left)) dragging_target_ = true;
  if (!ImGui::IsMouseDown(ImGuiMouseButton_Left)) dragging_target_ = false;
  {
    Plot plot("scaling", ImVec2(plot_w, -ImGui::GetFrameHeightWithSpacing() * 1.5f), &scaling_x_,
              &scaling_y_, fit, true, true, "validation loss vs training FLOPs (log-log)",
              "training FLOPs", !dragging_target_ && !near_target);
    plot_rect_ = plot.inner();
    if (dragging_target_) target_loss_ = plot.mouse_y();
    Signature sig;
    sig.Add(res.get()).Add(ordered);
    LineCanvas& canvas = Canvas("scaling");
    if (canvas.Begin(plot, sig.h, sig.h)) {
      for (const auto& b : res->bands)
        canvas.FillBetween(plot, b.flops, b.lo, b.hi,
                           (fam_color[b.family] & 0x00FFFFFF) | 0x38000000);
      for (const auto& p : res->observations.points) {
        canvas.Dot(plot, p.flops, p.loss, (fam_color[p.family] & 0x00FFFFFF) | 0x60000000, 1.6f);
      }
      for (const auto& b : res->bands)
        canvas.Line(plot, b.flops, b.loss, fam_color[b.family], 1.6f);
      for (const auto& f : fits.families) {
        std::vector<double> fx, fy;
        for (const auto& p : f.frontier) {
          fx.push_back(p.flops);
          fy.push_back(p.loss);
          canvas.Dot(plot, p.flops, p.loss, fam_color[f.family], 3.2f);
        }
      }
    }
    canvas.End(plot);
    plot.HLine(target_loss_, IM_COL32(240, 240, 240, 200), true, nullptr);
    target_px_ = plot.ToPixel(plot.x_axis().lo, target_loss_).y;
    const std::string t = "L* = " + FormatValue(target_loss_) + " (drag)";
    plot.draw_list()->AddText(ImVec2(plot.inner().Min.x + 6, target_px_ - ImGui::GetFontSize() - 2),
                              IM_COL32(240, 240, 240, 230), t.c_str());
    if (near_target || dragging_target_) ImGui::SetMouseCursor(ImGuiMouseCursor_ResizeNS);
    if (plot.hovered() && !dragging_target_) {
      ImGui::BeginTooltip();
      ImGui::Text("C = %s FLOPs", FormatValue(plot.mouse_x()).c_str());
      for (const auto& f : fits.families) {
        ImGui::TextColored(ImGui::ColorConvertU32ToFloat4(fam_color[f.family]), "%s: L = %s",
                           f.family.c_str(), FormatValue(f.LossAtCompute(plot.mouse_x())).c_str());
      }
      ImGui::EndTooltip();
    }
  }
  // Family legend.
  for (size_t i = 0; i < families.size(); ++i) {
    if (i > 0) ImGui::SameLine();
    ImGui::TextColored(ImGui::ColorConvertU32ToFloat4(fam_color[families[i]]),
                       "\xe2\x96\xa0 %s = %s", req.family_key.c_str(), families[i].c_str());
  }
  ImGui::EndGroup();
  ImGui::SameLine();

  // Right: multiplier table, fit parameters, heads ablation.
  ImGui::BeginChild("fit tables", ImVec2(0, 0), false);
  ImGui::SetNextItemWidth(140);
  if (ImGui::BeginCombo("reference", fit_reference_.c_str())) {
    for (const auto& f : families) {
      if (ImGui::Selectable(f.c_str(), f == fit_reference_)) fit_reference_ = f;
    }
    ImGui::EndCombo();
  }
  ImGui::TextWrapped(
      "FLOPs to reach L* = %s relative to %s = %s (C_family / C_reference, 90%% "
      "bootstrap interval):",
      FormatValue(target_loss_).c_str(), req.family_key.c_str(), fit_reference_.c_str());
  const ImGuiTableFlags tflags =
      ImGuiTableFlags_RowBg | ImGuiTableFlags_BordersInnerV | ImGuiTableFlags_SizingFixedFit;
  try {
    analysis::MultiplierTable table =
        analysis::ComputeMultiplierTable(fits, fit_reference_, target_loss_);
    if (ImGui::BeginTable("multipliers", 3, tflags)) {
      ImGui::TableSetupColumn("family");
      ImGui::TableSetupColumn("multiplier");
      ImGui::TableSetupColumn("FLOPs to L*");
      ImGui::TableHeadersRow();
      std::stable_sort(table.rows.begin(), table.rows.end(),
                       [](const auto& a, const auto& b) { return ValueLess(a.family, b.family); });
      for (const auto& row : table.rows) {
        ImGui::TableNextRow();
        ImGui::TableSetColumnIndex(0);
        ImGui::TextColored(ImGui::ColorConvertU32ToFloat4(fam_color[row.family]), "%s",
                           row.family.c_str());
        ImGui::TableSetColumnIndex(1);
        if (row.ok) {
          ImGui::Text("%.2f\xc3\x97 [%.2f, %.2f]", row.multiplier.estimate, row.multiplier.lo,
                      row.multiplier.hi);
          ImGui::TableSetColumnIndex(2);
          ImGui::TextUnformatted(FormatValue(row.compute_family.estimate).c_str());
        } else {
          ImGui::TextDisabled("refused");
          if (ImGui::IsItemHovered()) ImGui::SetTooltip("%s", row.refusal.c_str());
          ImGui::TableSetColumnIndex(2);
          ImGui::TextDisabled("%s", row.refusal.substr(0, 40).c_str());
        }
      }
      ImGui::EndTable();
    }
  } catch (const std::exception& e) {
    ImGui::TextWrapped("%s", e.what());
  }
  ImGui::Spacing();
  ImGui::TextUnformatted("Fitted L(C) = E + A·(C/1e15)^-α per family:");
  if (ImGui::BeginTable("params", 4, tflags)) {
    ImGui::TableSetupColumn("family");
    ImGui::TableSetupColumn("E");
    ImGui::TableSetupColumn("α");
    ImGui::TableSetupColumn("runs / frontier");
    ImGui::TableHeadersRow();
    for (const auto& name : families) {
      const analysis::PowerLawFit& f = fits.Get(name);
      ImGui::TableNextRow();
      ImGui::TableSetColumnIndex(0);
      ImGui::TextColored(ImGui::ColorConvertU32ToFloat4(fam_color[name]), "%s", name.c_str());
      for (const auto& p : f.params) {
        const int col = p.name == "E" ? 1 : p.name == "alpha" ? 2 : -1;
        if (col < 0) continue;
        ImGui::TableSetColumnIndex(col);
        ImGui::Text("%s [%s, %s]%s", FormatValue(p.value.estimate).c_str(),
                    FormatValue(p.value.lo).c_str(), FormatValue(p.value.hi).c_str(),
                    p.at_bound ? " (bound)" : "");
      }
      ImGui::TableSetColumnIndex(3);
      ImGui::Text("%d / %zu", f.diagnostics.n_runs, f.frontier.size());
    }
    ImGui::EndTable();
  }
  for (const auto& w : fits.warnings) ImGui::TextDisabled("%s", w.c_str());

  ImGui::Spacing();
  ImGui::Separator();
  ImGui::TextUnformatted("Heads ablation (relative loss difference per budget)");
  auto fam_combo = [&](const char* label, std::string* value) {
    ImGui::SetNextItemWidth(110);
    if (ImGui::BeginCombo(label, value->empty() ? "(none)" : value->c_str())) {
      if (ImGui::Selectable("(none)", value->empty())) value->clear();
      for (const auto& f : families) {
        if (ImGui::Selectable(f.c_str(), f == *value)) *value = f;
      }
      ImGui::EndCombo();
    }
  };
  fam_combo("base", &heads_base_);
  ImGui::SameLine();
  fam_combo("treatment", &heads_treatment_);
  HelpMarker(
      "Choose the family key that holds the head count (e.g. model.heads or var:head_ratio), "
      "then the base and the treatment family: analysis::CompareHeads pairs their runs by "
      "token budget and reports (L_treatment - L_base) / L_base at equal tokens and at equal "
      "FLOPs.");
  if (res->heads) {
    const analysis::HeadsAblation& h = *res->heads;
    if (ImGui::BeginTable("heads", 3, tflags)) {
      ImGui::TableSetupColumn("tokens");
      ImGui::TableSetupColumn("\xce\x94 equal tokens");
      ImGui::TableSetupColumn("\xce\x94 equal FLOPs");
      ImGui::TableHeadersRow();
      auto pct = [](const analysis::Estimate& e) {
        char buf[64];
        std::snprintf(buf, sizeof(buf), "%+.2f%% [%+.2f, %+.2f]", 100 * e.estimate, 100 * e.lo,
                      100 * e.hi);
        return std::string(buf);
      };
      for (const auto& b : h.budgets) {
        ImGui::TableNextRow();
        ImGui::TableSetColumnIndex(0);
        ImGui::TextUnformatted(FormatValue(b.tokens).c_str());
        ImGui::TableSetColumnIndex(1);
        ImGui::TextUnformatted(pct(b.delta_equal_tokens).c_str());
        ImGui::TableSetColumnIndex(2);
        ImGui::TextUnformatted(pct(b.delta_equal_flops).c_str());
      }
      ImGui::TableNextRow();
      ImGui::TableSetColumnIndex(0);
      ImGui::TextUnformatted("mean");
      ImGui::TableSetColumnIndex(1);
      ImGui::TextUnformatted(pct(h.mean_delta_equal_tokens).c_str());
      ImGui::TableSetColumnIndex(2);
      ImGui::TextUnformatted(pct(h.mean_delta_equal_flops).c_str());
      ImGui::EndTable();
    }
    for (const auto& w : h.warnings) ImGui::TextDisabled("%s", w.c_str());
  } else if (!res->heads_error.empty()) {
    ImGui::TextWrapped("%s", res->heads_error.c_str());
  }
  ImGui::EndChild();
#endif
}

}  // namespace moelab::gui
