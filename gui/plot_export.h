// Saving one plot as an image (File > Save plot as, right-click on a plot, --script
// save-plot): every Plot registers itself each frame under its title; the one asked for
// records what it draws on the next frame. SVG is written from those records (axes, grid,
// labels, every line, band and dot as vector primitives, in pixel coordinates of the plot);
// PNG is the plot's rectangle read back from the rendered frame (stb_image_write).
#pragma once

#include <imgui.h>
#include <imgui_internal.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace moelab::gui {

// The SVG primitives of one plot, in frame pixels; recorded while a save is pending.
class PlotRecording {
 public:
  explicit PlotRecording(const ImRect& frame, const ImRect& inner);
  // Drawn before the data (background, grid, tick labels, title), clipped to the data area,
  // and on top (the frame border).
  enum Layer { kBack, kData, kFront };
  void Rect(Layer layer, ImVec2 a, ImVec2 b, ImU32 fill, ImU32 stroke = 0);
  void Line(Layer layer, ImVec2 a, ImVec2 b, ImU32 color, float width, bool dashed = false);
  // A polyline; `points` in screen pixels.
  void Polyline(Layer layer, const std::vector<ImVec2>& points, ImU32 color, float width);
  void Polygon(Layer layer, const std::vector<ImVec2>& points, ImU32 fill);
  void Circle(Layer layer, ImVec2 c, float r, ImU32 fill);
  // ImGui's text position: the top-left corner of the text.
  void Text(Layer layer, ImVec2 top_left, ImU32 color, const std::string& text);
  std::string Svg() const;

 private:
  std::string& Out(Layer layer) { return layers_[layer]; }
  ImVec2 Local(ImVec2 p) const { return ImVec2(p.x - frame_.Min.x, p.y - frame_.Min.y); }
  ImRect frame_, inner_;
  std::string layers_[3];
};

class PlotExport {
 public:
  static PlotExport& Get();
  struct Entry {
    std::string name;  // the plot's title, " (2)" ... when a frame shows it twice
    ImRect frame;      // the plot's rectangle, axes and labels included
  };
  // Called by App at the start of each frame: the registry then lists this frame's plots.
  void BeginFrame();
  // Plot's constructor: registers a plot and returns its recording when a save asked for it.
  PlotRecording* Register(const std::string& title, const ImRect& frame, const ImRect& inner);
  // The plots of the last finished frame.
  const std::vector<Entry>& plots() const { return last_; }
  // Asks to save the plot `name` (as listed) to `path`: .svg is written from the plot's draw
  // records, .png (anything else) read back from the frame buffer. Done during the next frame.
  void Request(const std::string& name, const std::string& path);
  bool pending() const { return !request_name_.empty(); }
  // The name a plot drawn this frame was registered under (by its rectangle).
  std::string NameOf(const ImRect& frame) const;
  // The plot's context menu asks for a path: App shows its save dialog for `name`.
  void AskPath(const std::string& name) { ask_name_ = name; }
  std::string TakeAskPath() { return std::exchange(ask_name_, std::string()); }
  // At the end of App's frame. Writes an SVG; for a PNG sets *png_path and *png_rect for the
  // caller to read back after rendering. Returns 0 when no save was asked for, 1 when it was
  // done (or, for a PNG, is the caller's to do), -1 when the plot was not drawn this frame or
  // the file could not be written; *message says which.
  int EndFrame(std::string* png_path, ImRect* png_rect, std::string* message);

 private:
  std::vector<Entry> current_, last_;
  std::string request_name_, request_path_, ask_name_;
  std::unique_ptr<PlotRecording> recording_;
  bool recorded_ = false;
  ImRect recorded_frame_;
};

}  // namespace moelab::gui
