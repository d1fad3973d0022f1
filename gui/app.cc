// App core: construction, the frame (menu, tabs, status line), the open dialog and what
// several views share (selection, colours, legend). Each view lives in gui/view_*.cc.
#include "gui/app.h"

#include <imgui.h>
#include <imgui_internal.h>
#include <imgui_stdlib.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <numeric>

#include "gui/app_internal.h"
#include "gui/fits.h"
#include "gui/full_runs_view.h"
#include "gui/plan_calibration.h"
#include "gui/plot_export.h"
#include "gui/promote_panel.h"
#include "gui/script.h"
#include "gui/sweep_control.h"
#include "gui/widgets.h"

namespace moelab::gui {

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
  if (!options_.script_path.empty()) script_ = std::make_unique<ScriptRunner>(options_.script_path);
}

int App::script_status() const { return script_ ? script_->status() : -1; }

std::string App::TakeScreenshotRequest() {
  std::string out;
  out.swap(screenshot_request_);
  return out;
}

bool App::TakePlotCapture(PlotCapture* out) {
  if (plot_capture_.path.empty()) return false;
  *out = plot_capture_;
  plot_capture_ = {};
  return true;
}

void App::PlotCaptureDone(bool ok, const std::string& path) {
  if (ok) return;
  plot_save_state_ = -1;
  plot_save_message_ = "cannot write " + path;
  plot_save_at_ = Clock::now();
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
    case View::kSweeps:
      return "sweeps";
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
      if (v == View::kScaling && !HasScalingView()) return false;
      *out = v;
      return true;
    }
  }
  return false;
}

bool App::HasScalingView() {
  return true;  // analysis/ is always built
}

void App::SetView(View v) {
  view_ = v;
  view_forced_ = true;
}

void App::OpenDatabase(const std::string& path) {
  store_.reset();  // joins the old poller before starting a new one
  store_ = std::make_unique<DataStore>(path);
  curves_view_.caches.clear();
  logits_.caches.clear();
  experts_.caches.clear();
  logits_.runs.clear();
  logits_.step.clear();
  experts_.run = -1;
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
  curves_view_.x = {false, lo, hi};
  settings_.follow_live = false;
}

bool App::Settled() const {
  // The tab bar shows the requested tab one frame after it is asked for: until the view was
  // drawn, its data was not even requested.
  if (!store_) return frame_view_ != View::kCount && !view_forced_;  // the welcome screen
  return store_->Settled() && frame_settled_ && frame_view_ == view_ && !view_forced_;
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
  // The script sees the last frame's state (wait-settled asks whether it was settled).
  if (script_) script_->Step(this);
  frame_settled_ = true;
  profile_ = {};
  PlotExport::Get().BeginFrame();
  frame_view_ = View::kCount;
  const double budget_ms =
      options_.refine_budget_ms >= 0 ? options_.refine_budget_ms : kRefineBudgetMs;
  const auto start = Clock::now();
  downsample_deadline_ = start + std::chrono::microseconds(static_cast<int64_t>(budget_ms * 500));
  canvas_deadline_ = start + std::chrono::microseconds(static_cast<int64_t>(budget_ms * 1000));
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
  const std::string text_dump = std::move(text_dump_path_);
  text_dump_path_.clear();
  if (!text_dump.empty()) ImGui::LogToFile(0, text_dump.c_str());  // 0: opens no tree node
  MenuBar();

  const std::string error = store_ ? store_->error() : "";
  if (!store_ && view_ != View::kSweeps) {
    WelcomeView();
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
      if (v == View::kScaling && !HasScalingView()) continue;
      static const char* kTitles[] = {"Runs",    "Curves", "Max logits", "Experts",  "Scaling laws",
                                      "Compare", "Sweeps", "Promote",    "Full runs"};
      ImGuiTabItemFlags flags = 0;
      if (view_forced_ && v == view_) flags |= ImGuiTabItemFlags_SetSelected;
      if (ImGui::BeginTabItem(kTitles[i], nullptr, flags)) {
        if (!view_forced_) view_ = v;
        frame_view_ = v;
        ImGui::BeginChild("view", ImVec2(0, -status_h), false);
        if (v == View::kSweeps) {
          SweepsView();  // also without a database: the editor checks specs
        } else if (store_ && error.empty()) {
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
            case View::kPromote:
              if (!promote_panel_) promote_panel_ = std::make_unique<PromotePanel>();
              promote_panel_->Draw(store_->path(), &frame_settled_);
              break;
            case View::kFullRuns:
              if (!full_runs_view_) full_runs_view_ = std::make_unique<FullRunsView>();
              full_runs_view_->Draw(store_->path(), &frame_settled_);
              break;
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
  if (!text_dump.empty()) {
    ImGui::LogFinish();
    std::FILE* f = std::fopen(text_dump.c_str(), "a");
    if (f) {
      for (const std::string& t : ClippedTables()) std::fprintf(f, "CLIPPED %s\n", t.c_str());
      std::fclose(f);
    }
  }
  ImGui::End();
  if (open_dialog_) OpenDialog();
  const std::string asked = PlotExport::Get().TakeAskPath();
  if (!asked.empty()) {
    save_plot_name_ = asked;
    save_plot_dialog_ = true;
  }
  if (save_plot_dialog_) SavePlotDialog();
  // A plot asked for this frame: SVG written now, PNG read back by main after rendering.
  std::string png;
  ImRect rect;
  std::string message;
  const int saved = PlotExport::Get().EndFrame(&png, &rect, &message);
  if (saved != 0) {
    plot_save_state_ = saved;
    plot_save_message_ = message;
    plot_save_at_ = Clock::now();
    if (!png.empty()) {
      plot_capture_ = {png, static_cast<int>(rect.Min.x), static_cast<int>(rect.Min.y),
                       static_cast<int>(rect.Max.x), static_cast<int>(rect.Max.y)};
    }
  }
}

void App::SavePlotDialog() {
  if (!ImGui::IsPopupOpen("Save plot")) {
    ImGui::OpenPopup("Save plot");
    if (save_plot_path_.empty() || save_plot_path_.find(".svg") == std::string::npos) {
      // <title>.png next to the database (or here), with a file-name-safe title.
      std::string base;
      for (char ch : save_plot_name_)
        base += std::isalnum(static_cast<unsigned char>(ch)) ? ch : '-';
      namespace fs = std::filesystem;
      const fs::path dir = store_ ? fs::path(store_->path()).parent_path() : fs::path();
      save_plot_path_ = (dir / (base + ".png")).string();
    }
  }
  ImGui::SetNextWindowSize(ImVec2(560, 0), ImGuiCond_Appearing);
  if (ImGui::BeginPopupModal("Save plot", &save_plot_dialog_)) {
    ImGui::Text("Save '%s' as", save_plot_name_.c_str());
    ImGui::SetNextItemWidth(-1);
    const bool enter =
        ImGui::InputText("##plot_path", &save_plot_path_, ImGuiInputTextFlags_EnterReturnsTrue);
    ImGui::TextDisabled(
        ".png: the plot as drawn on screen; .svg: vector lines, axes and labels (for papers)");
    if (ImGui::Button("Save") || enter) {
      PlotExport::Get().Request(save_plot_name_, save_plot_path_);
      save_plot_dialog_ = false;
      ImGui::CloseCurrentPopup();
    }
    ImGui::SameLine();
    if (ImGui::Button("Cancel")) {
      save_plot_dialog_ = false;
      ImGui::CloseCurrentPopup();
    }
    ImGui::EndPopup();
  }
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
    // Every plot of the view shown (also on right-click of a plot).
    const auto& plots = PlotExport::Get().plots();
    if (ImGui::BeginMenu("Save plot as PNG or SVG", !plots.empty())) {
      for (const auto& p : plots) {
        if (ImGui::MenuItem(p.name.c_str())) {
          save_plot_name_ = p.name;
          save_plot_dialog_ = true;
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
  for (const auto& r : runs_->runs)
    running += r->row.effective_status == RunStatus::kRunning ? 1 : 0;
  const int pending = store_->Pending();
  const std::string error = store_->error();
  ImGui::TextDisabled("%s  |  %d runs, %d running  |  %zu selected%s", store_->path().c_str(),
                      static_cast<int>(runs_->runs.size()), running, selection_.size(),
                      pending > 0 || !error.empty() ? "" : "  |  up to date");
  if (plot_save_state_ != 0 && Clock::now() - plot_save_at_ < std::chrono::seconds(8)) {
    ImGui::SameLine();
    ImGui::TextColored(
        plot_save_state_ > 0 ? ImVec4(0.67f, 0.78f, 0.67f, 1) : ImVec4(0.94f, 0.43f, 0.39f, 1),
        "|  %s", plot_save_message_.c_str());
  }
  if (!error.empty()) {
    // Never "up to date" for a file the poller cannot read (a read-only folder, another
    // schema, a missing file): what is shown is what was read before, if anything.
    ImGui::SameLine();
    ImGui::TextColored(ImVec4(0.94f, 0.43f, 0.39f, 1), "|  cannot read the database: %s",
                       error.c_str());
  } else if (pending > 0) {
    ImGui::SameLine();
    ImGui::TextColored(ImVec4(0.9f, 0.8f, 0.3f, 1), "|  loading %d series...", pending);
  }
}
}  // namespace moelab::gui
