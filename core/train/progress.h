// A terminal progress line for long work: redraws in place on a TTY (at most ~10 times a
// second), prints a plain line every 10 % otherwise so logs stay readable.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace moelab {

class ProgressBar {
 public:
  ProgressBar(std::string label, int64_t total, bool enabled = true);
  // current: units done so far; info: extra text such as "loss 3.21 | 12.3k tok/s".
  void Update(int64_t current, const std::string& info);
  // The last line: the whole bar, or at `current` when the work stopped early (a stopped or
  // diverged run shows how far it got, never a full bar).
  void Finish(const std::string& info, int64_t current = -1);

  static std::string FormatDuration(double seconds);
  static std::string FormatCount(double value);  // 12345 -> "12.3k"

 private:
  void Draw(int64_t current, const std::string& info, bool final);

  std::string label_;
  int64_t total_;
  int64_t start_ = -1;
  bool enabled_;
  bool tty_;
  int last_decile_ = -1;
  std::chrono::steady_clock::time_point t0_, last_draw_;
};

}  // namespace moelab
