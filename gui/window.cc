#include "gui/window.h"

#include <GLFW/glfw3.h>
#include <backends/imgui_impl_glfw.h>
#include <backends/imgui_impl_opengl3.h>
#include <imgui.h>
#include <stb_image_write.h>

#include <algorithm>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

namespace moelab::gui {

namespace {
std::string g_glfw_error;
void OnGlfwError(int code, const char* what) {
  g_glfw_error = "GLFW error " + std::to_string(code) + ": " + what;
}

void LoadFonts(float size) {
  ImGuiIO& io = ImGui::GetIO();
  // DejaVu reads much better than ImGui's 13 px bitmap font in screenshots; fall back to the
  // built-in font where the Debian fonts are not installed.
  const char* kFont = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf";
  if (FILE* f = std::fopen(kFont, "rb")) {
    std::fclose(f);
    ImFontConfig cfg;
    cfg.OversampleH = 2;
    // Latin-1, Greek (τ, α, Δ), dashes, math operators and the legend square.
    static const ImWchar kRanges[] = {0x0020, 0x00FF, 0x0370, 0x03FF, 0x2010, 0x2027,
                                      0x2200, 0x22FF, 0x25A0, 0x25A1, 0};
    if (io.Fonts->AddFontFromFileTTF(kFont, size, &cfg, kRanges)) return;
  }
  io.Fonts->AddFontDefault();
}
}  // namespace

Window::Window(const WindowOptions& options) : ini_path_(options.ini_path) {
  glfwSetErrorCallback(OnGlfwError);
  if (!glfwInit()) {
    throw std::runtime_error("cannot open a window (" + g_glfw_error +
                             "); without a display run under xvfb-run -a");
  }
  glfwWindowHint(GLFW_CONTEXT_VERSION_MAJOR, 3);
  glfwWindowHint(GLFW_CONTEXT_VERSION_MINOR, 0);
  if (options.headless) glfwWindowHint(GLFW_RESIZABLE, GLFW_FALSE);
  window_ =
      glfwCreateWindow(options.width, options.height, options.title.c_str(), nullptr, nullptr);
  if (!window_) {
    glfwTerminate();
    throw std::runtime_error("cannot create an OpenGL 3 window: " + g_glfw_error);
  }
  glfwMakeContextCurrent(window_);
  glfwSwapInterval(options.vsync ? 1 : 0);

  IMGUI_CHECKVERSION();
  ImGui::CreateContext();
  ImGuiIO& io = ImGui::GetIO();
  io.IniFilename = ini_path_.empty() ? nullptr : ini_path_.c_str();
  io.ConfigFlags |= ImGuiConfigFlags_NavEnableKeyboard;
  if (options.headless) io.ConfigFlags |= ImGuiConfigFlags_NoMouse;
  ImGui::StyleColorsDark();
  ImGuiStyle& style = ImGui::GetStyle();
  style.WindowRounding = 0;
  style.FrameRounding = 3;
  style.CellPadding = ImVec2(6, 3);
  LoadFonts(15.0f);
  ImGui_ImplGlfw_InitForOpenGL(window_, true);
  ImGui_ImplOpenGL3_Init("#version 130");
}

Window::~Window() {
  ImGui_ImplOpenGL3_Shutdown();
  ImGui_ImplGlfw_Shutdown();
  ImGui::DestroyContext();
  glfwDestroyWindow(window_);
  glfwTerminate();
}

bool Window::ShouldClose() const { return glfwWindowShouldClose(window_); }

void Window::BeginFrame(double timeout_s) {
  if (timeout_s > 0) {
    glfwWaitEventsTimeout(timeout_s);
  } else {
    glfwPollEvents();
  }
  ImGui_ImplOpenGL3_NewFrame();
  ImGui_ImplGlfw_NewFrame();
  ImGui::NewFrame();
}

void Window::EndFrame(bool swap) {
  ImGui::Render();
  int w = 0, h = 0;
  glfwGetFramebufferSize(window_, &w, &h);
  glViewport(0, 0, w, h);
  glClearColor(0.08f, 0.08f, 0.09f, 1.0f);
  glClear(GL_COLOR_BUFFER_BIT);
  ImGui_ImplOpenGL3_RenderDrawData(ImGui::GetDrawData());
  if (swap) Swap();
}

void Window::Swap() { glfwSwapBuffers(window_); }

void Window::Finish() const { glFinish(); }

bool Window::SavePng(const std::string& path) const {
  int w = 0, h = 0;
  glfwGetFramebufferSize(window_, &w, &h);
  return SavePng(path, 0, 0, w, h);
}

bool Window::SavePng(const std::string& path, int x0, int y0, int x1, int y1) const {
  int fw = 0, fh = 0;
  glfwGetFramebufferSize(window_, &fw, &fh);
  x0 = std::clamp(x0, 0, fw);
  x1 = std::clamp(x1, x0, fw);
  y0 = std::clamp(y0, 0, fh);
  y1 = std::clamp(y1, y0, fh);
  const int w = x1 - x0, h = y1 - y0;
  if (w <= 0 || h <= 0) return false;
  std::vector<unsigned char> pixels(static_cast<size_t>(w) * h * 4);
  glPixelStorei(GL_PACK_ALIGNMENT, 1);
  glReadBuffer(GL_BACK);
  // OpenGL's origin is bottom-left.
  glReadPixels(x0, fh - y1, w, h, GL_RGBA, GL_UNSIGNED_BYTE, pixels.data());
  // PNG rows go top-down.
  std::vector<unsigned char> flipped(pixels.size());
  const size_t row = static_cast<size_t>(w) * 4;
  for (int y = 0; y < h; ++y) {
    std::copy_n(pixels.data() + (h - 1 - y) * row, row, flipped.data() + y * row);
  }
  for (size_t i = 3; i < flipped.size(); i += 4) flipped[i] = 255;
  return stbi_write_png(path.c_str(), w, h, 4, flipped.data(), static_cast<int>(row)) != 0;
}

}  // namespace moelab::gui
