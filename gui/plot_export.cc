#include "gui/plot_export.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>

namespace moelab::gui {

namespace {

std::string Color(ImU32 c, const char* attr) {
  char buf[96];
  const unsigned r = c & 0xFF, g = (c >> 8) & 0xFF, b = (c >> 16) & 0xFF, a = c >> 24;
  if (a == 255) {
    std::snprintf(buf, sizeof buf, "%s=\"#%02x%02x%02x\"", attr, r, g, b);
  } else {
    std::snprintf(buf, sizeof buf, "%s=\"#%02x%02x%02x\" %s-opacity=\"%.3f\"", attr, r, g, b, attr,
                  a / 255.0);
  }
  return buf;
}

std::string Num(float v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f", v);
  std::string s = buf;
  while (!s.empty() && s.back() == '0') s.pop_back();
  if (!s.empty() && s.back() == '.') s.pop_back();
  return s;
}

std::string Escape(const std::string& text) {
  std::string out;
  for (char ch : text) {
    switch (ch) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += ch;
    }
  }
  return out;
}

}  // namespace

PlotRecording::PlotRecording(const ImRect& frame, const ImRect& inner)
    : frame_(frame), inner_(inner) {}

void PlotRecording::Rect(Layer layer, ImVec2 a, ImVec2 b, ImU32 fill, ImU32 stroke) {
  a = Local(a);
  b = Local(b);
  Out(layer) += "<rect x=\"" + Num(std::min(a.x, b.x)) + "\" y=\"" + Num(std::min(a.y, b.y)) +
                "\" width=\"" + Num(std::abs(b.x - a.x)) + "\" height=\"" +
                Num(std::abs(b.y - a.y)) + "\" " + (fill ? Color(fill, "fill") : "fill=\"none\"") +
                (stroke ? " " + Color(stroke, "stroke") : std::string()) + "/>\n";
}

void PlotRecording::Line(Layer layer, ImVec2 a, ImVec2 b, ImU32 color, float width, bool dashed) {
  a = Local(a);
  b = Local(b);
  Out(layer) += "<line x1=\"" + Num(a.x) + "\" y1=\"" + Num(a.y) + "\" x2=\"" + Num(b.x) +
                "\" y2=\"" + Num(b.y) + "\" " + Color(color, "stroke") + " stroke-width=\"" +
                Num(width) + "\"" + (dashed ? " stroke-dasharray=\"6 4\"" : "") + "/>\n";
}

void PlotRecording::Polyline(Layer layer, const std::vector<ImVec2>& points, ImU32 color,
                             float width) {
  if (points.size() < 2) {
    if (points.size() == 1) Circle(layer, points[0], width / 2 + 0.5f, color);
    return;
  }
  std::string& out = Out(layer);
  out += "<polyline fill=\"none\" " + Color(color, "stroke") + " stroke-width=\"" + Num(width) +
         "\" stroke-linejoin=\"round\" points=\"";
  for (const ImVec2& p : points) {
    const ImVec2 q = Local(p);
    out += Num(q.x) + "," + Num(q.y) + " ";
  }
  out += "\"/>\n";
}

void PlotRecording::Polygon(Layer layer, const std::vector<ImVec2>& points, ImU32 fill) {
  if (points.size() < 3) return;
  std::string& out = Out(layer);
  out += "<polygon " + Color(fill, "fill") + " points=\"";
  for (const ImVec2& p : points) {
    const ImVec2 q = Local(p);
    out += Num(q.x) + "," + Num(q.y) + " ";
  }
  out += "\"/>\n";
}

void PlotRecording::Circle(Layer layer, ImVec2 c, float r, ImU32 fill) {
  c = Local(c);
  Out(layer) += "<circle cx=\"" + Num(c.x) + "\" cy=\"" + Num(c.y) + "\" r=\"" + Num(r) + "\" " +
                Color(fill, "fill") + "/>\n";
}

void PlotRecording::Text(Layer layer, ImVec2 top_left, ImU32 color, const std::string& text) {
  const float fh = ImGui::GetFontSize();
  const ImVec2 p = Local(ImVec2(top_left.x, top_left.y + fh * 0.8f));  // the baseline
  Out(layer) += "<text x=\"" + Num(p.x) + "\" y=\"" + Num(p.y) + "\" font-size=\"" + Num(fh) +
                "\" " + Color(color, "fill") + ">" + Escape(text) + "</text>\n";
}

std::string PlotRecording::Svg() const {
  const float w = frame_.GetWidth(), h = frame_.GetHeight();
  const ImVec2 a = Local(inner_.Min), b = Local(inner_.Max);
  std::string out = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
  out += "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + Num(w) + "\" height=\"" + Num(h) +
         "\" viewBox=\"0 0 " + Num(w) + " " + Num(h) +
         "\" font-family=\"DejaVu Sans, sans-serif\">\n";
  out += "<defs><clipPath id=\"data\"><rect x=\"" + Num(a.x) + "\" y=\"" + Num(a.y) +
         "\" width=\"" + Num(b.x - a.x) + "\" height=\"" + Num(b.y - a.y) +
         "\"/></clipPath></defs>\n";
  out += "<rect width=\"100%\" height=\"100%\" " +
         Color(ImGui::GetColorU32(ImGuiCol_WindowBg) | 0xFF000000, "fill") + "/>\n";
  out += layers_[kBack];
  out += "<g clip-path=\"url(#data)\">\n" + layers_[kData] + "</g>\n";
  out += layers_[kFront];
  out += "</svg>\n";
  return out;
}

PlotExport& PlotExport::Get() {
  static PlotExport instance;
  return instance;
}

void PlotExport::BeginFrame() {
  current_.clear();
  recording_.reset();
  recorded_ = false;
}

PlotRecording* PlotExport::Register(const std::string& title, const ImRect& frame,
                                    const ImRect& inner) {
  std::string name = title;
  int same = 1;
  for (const Entry& e : current_) same += e.name == name || e.name.rfind(title + " (", 0) == 0;
  if (same > 1) name += " (" + std::to_string(same) + ")";
  current_.push_back({name, frame});
  if (request_name_.empty() || name != request_name_ || recorded_) return nullptr;
  recorded_ = true;
  recorded_frame_ = frame;
  if (request_path_.size() < 4 || request_path_.substr(request_path_.size() - 4) != ".svg")
    return nullptr;  // a PNG needs the rectangle only
  recording_ = std::make_unique<PlotRecording>(frame, inner);
  return recording_.get();
}

std::string PlotExport::NameOf(const ImRect& frame) const {
  for (const Entry& e : current_) {
    if (e.frame.Min.x == frame.Min.x && e.frame.Min.y == frame.Min.y &&
        e.frame.Max.x == frame.Max.x && e.frame.Max.y == frame.Max.y)
      return e.name;
  }
  return "";
}

void PlotExport::Request(const std::string& name, const std::string& path) {
  request_name_ = name;
  request_path_ = path;
}

int PlotExport::EndFrame(std::string* png_path, ImRect* png_rect, std::string* message) {
  last_ = current_;
  png_path->clear();
  if (request_name_.empty()) return 0;
  const std::string name = request_name_, path = request_path_;
  request_name_.clear();
  request_path_.clear();
  if (!recorded_) {
    *message = "the plot '" + name + "' is not shown: open its view first";
    return -1;
  }
  if (!recording_) {
    *png_path = path;
    *png_rect = recorded_frame_;
    *message = "saved '" + name + "' to " + path;
    return 1;
  }
  std::ofstream out(path);
  out << recording_->Svg();
  recording_.reset();
  if (!out) {
    *message = "cannot write " + path;
    return -1;
  }
  *message = "saved '" + name + "' to " + path;
  return 1;
}

}  // namespace moelab::gui
