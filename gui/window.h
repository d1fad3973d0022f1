// The GLFW window, the ImGui context with its GLFW + OpenGL3 backends, and PNG capture of the
// back buffer. Shared by moelab-gui and its frame-time benchmark.
#pragma once

#include <string>

struct GLFWwindow;

namespace moelab::gui {

struct WindowOptions {
  int width = 1280;
  int height = 800;
  std::string title = "moelab";
  bool vsync = true;
  bool headless = false;  // screenshot/bench: no mouse input, no ini file
  std::string ini_path;   // imgui.ini location; "" keeps ImGui from writing one
};

class Window {
 public:
  // Throws std::runtime_error when no display or no OpenGL 3 context is available.
  explicit Window(const WindowOptions& options);
  ~Window();
  Window(const Window&) = delete;
  Window& operator=(const Window&) = delete;

  bool ShouldClose() const;
  // Waits for input up to timeout_s (0: just poll), then starts an ImGui frame.
  void BeginFrame(double timeout_s);
  // Renders and (unless keep_back_buffer) swaps.
  void EndFrame(bool swap = true);
  // Reads the back buffer of the frame just rendered (call EndFrame(false) first) into a PNG.
  bool SavePng(const std::string& path) const;
  // The same for the rectangle [x0, x1) x [y0, y1) of the window (ImGui's coordinates).
  bool SavePng(const std::string& path, int x0, int y0, int x1, int y1) const;
  void Swap();
  // Blocks until the GPU (llvmpipe under Xvfb) finished the frame, so timings are honest.
  void Finish() const;

 private:
  GLFWwindow* window_ = nullptr;
  std::string ini_path_;
};

}  // namespace moelab::gui
