#include "tests/gui/harness.h"

#include <stb_image.h>
#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "tests/common/test_util.h"

namespace moelab::gui::testing {

bool HaveXvfb() { return std::system("command -v xvfb-run > /dev/null 2>&1") == 0; }

int RunGuiScript(const std::string& db, const std::string& script, const std::string& log,
                 const std::string& extra, const std::string& size) {
  std::ofstream(log + ".script") << script;
  // The app's own exit status goes to a file, since xvfb-run's can differ from it: 1 when Xvfb
  // fails to start (two parallel tests racing for a display with -a), 5 when removing its
  // temporary directory fails after the app has exited. Only a start that never ran the app is
  // retried.
  const std::string status = log + ".status";
  const std::string db_arg = db.empty() ? "" : " --db '" + db + "'";
  std::ofstream(log + ".sh") << "timeout 300 '" << test::BinPath("moelab-gui") << "'" << db_arg
                             << " --size " << size << " " << extra << " --script '" << log
                             << ".script' > '" << log << "' 2>&1\necho $? > '" << status << "'\n";
  const std::string cmd = "xvfb-run -a -s \"-screen 0 " + size + "x24\" sh '" + log + ".sh'";
  int rc = -1;
  for (int attempt = 0; attempt < 3; ++attempt) {
    std::filesystem::remove(status);
    rc = std::system(cmd.c_str());
    std::ifstream in(status);
    int app = -1;
    if (in >> app) return app;
  }
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : 128 + WTERMSIG(rc);
}

std::string ViewText(const std::string& db, const std::string& args, const std::string& log,
                     const std::string& size) {
  const std::string out = log + ".txt";
  std::filesystem::remove(out);
  if (RunGuiScript(db, "wait-settled 120\ndump-text " + out + "\nquit\n", log, args, size) != 0)
    return "";
  return test::Slurp(out);
}

Image LoadPng(const std::string& path) {
  Image img;
  int n = 0;
  unsigned char* data = stbi_load(path.c_str(), &img.w, &img.h, &n, 3);
  if (!data) return Image{};
  img.px.assign(data, data + static_cast<size_t>(img.w) * img.h * 3);
  stbi_image_free(data);
  return img;
}

int CountNear(const Image& img, int r, int g, int b, int tol, int x0, int y0, int x1, int y1) {
  if (x1 < 0) x1 = img.w;
  if (y1 < 0) y1 = img.h;
  int n = 0;
  for (int y = y0; y < y1; ++y) {
    for (int x = x0; x < x1; ++x) {
      const unsigned char* p = img.at(x, y);
      n += std::abs(p[0] - r) <= tol && std::abs(p[1] - g) <= tol && std::abs(p[2] - b) <= tol;
    }
  }
  return n;
}

void CopyToDocs(const std::string& png, const std::string& name) {
  if (const char* docs = std::getenv("MOELAB_GUI_DOCS_DIR")) {
    std::error_code ec;
    std::filesystem::copy_file(png, std::string(docs) + "/gui-" + name,
                               std::filesystem::copy_options::overwrite_existing, ec);
  }
}

namespace {

// The value of attribute `name` inside one tag ("" when absent).
std::string Attr(const std::string& tag, const std::string& name) {
  const std::string key = " " + name + "=\"";
  const size_t at = tag.find(key);
  if (at == std::string::npos) return "";
  const size_t start = at + key.size();
  return tag.substr(start, tag.find('"', start) - start);
}

float Float(const std::string& tag, const std::string& name) {
  const std::string v = Attr(tag, name);
  return v.empty() ? NAN : std::strtof(v.c_str(), nullptr);
}

uint32_t Hex(const std::string& v) {
  return v.size() == 7 && v[0] == '#'
             ? static_cast<uint32_t>(std::strtoul(v.c_str() + 1, nullptr, 16))
             : 0;
}

// Every tag <name ...> of the document, as text.
std::vector<std::string> Tags(const std::string& doc, const std::string& name) {
  std::vector<std::string> out;
  const std::string open = "<" + name + " ";
  for (size_t at = doc.find(open); at != std::string::npos; at = doc.find(open, at + 1)) {
    out.push_back(doc.substr(at, doc.find('>', at) - at + 1));
  }
  return out;
}

}  // namespace

std::vector<const SvgPlot::Polyline*> SvgPlot::Lines(uint32_t rgb) const {
  std::vector<const Polyline*> out;
  for (const auto& p : polylines) {
    if (p.rgb == rgb) out.push_back(&p);
  }
  return out;
}

SvgPlot LoadSvg(const std::string& path) {
  SvgPlot svg;
  std::ifstream in(path);
  if (!in) return svg;
  const std::string doc((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto head = Tags(doc, "svg");
  if (head.empty()) return svg;
  svg.width = Float(head[0], "width");
  svg.height = Float(head[0], "height");
  const size_t clip = doc.find("<clipPath");
  if (clip != std::string::npos) {
    const std::string rect = doc.substr(doc.find("<rect ", clip), 200);
    svg.clip_x0 = Float(rect, "x");
    svg.clip_y0 = Float(rect, "y");
    svg.clip_x1 = svg.clip_x0 + Float(rect, "width");
    svg.clip_y1 = svg.clip_y0 + Float(rect, "height");
  }
  for (const std::string& t : Tags(doc, "line")) {
    if (Float(t, "x1") == Float(t, "x2") && Float(t, "y2") - Float(t, "y1") > 20)
      svg.vertical_grid.push_back(Float(t, "x1"));
  }
  for (const std::string& t : Tags(doc, "polyline")) {
    SvgPlot::Polyline p;
    p.rgb = Hex(Attr(t, "stroke"));
    const std::string op = Attr(t, "stroke-opacity");
    p.opacity = op.empty() ? 1.0f : std::strtof(op.c_str(), nullptr);
    const std::string pts = Attr(t, "points");
    const char* s = pts.c_str();
    char* end = nullptr;
    for (;;) {
      const float x = std::strtof(s, &end);
      if (end == s || *end != ',') break;
      s = end + 1;
      const float y = std::strtof(s, &end);
      if (end == s) break;
      p.points.push_back({x, y});
      s = end;
    }
    svg.polylines.push_back(std::move(p));
  }
  for (const std::string& t : Tags(doc, "circle")) {
    svg.circles.push_back({Hex(Attr(t, "fill")), Float(t, "cx"), Float(t, "cy"), Float(t, "r")});
  }
  for (size_t at = doc.find("<text "); at != std::string::npos; at = doc.find("<text ", at + 1)) {
    const size_t start = doc.find('>', at) + 1;
    svg.texts.push_back(doc.substr(start, doc.find("</text>", start) - start));
  }
  return svg;
}

uint32_t Rgb(float r, float g, float b) {
  auto c = [](float v) {
    return static_cast<uint32_t>(std::lround(std::clamp(v, 0.0f, 1.0f) * 255));
  };
  return c(r) << 16 | c(g) << 8 | c(b);
}

}  // namespace moelab::gui::testing
