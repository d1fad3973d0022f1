#include "core/train/progress.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace moelab {

ProgressBar::ProgressBar(std::string label, int64_t total, bool enabled)
    : label_(std::move(label)),
      total_(std::max<int64_t>(1, total)),
      enabled_(enabled),
      tty_(isatty(fileno(stderr))),
      t0_(std::chrono::steady_clock::now()) {}

std::string ProgressBar::FormatDuration(double s) {
  if (!std::isfinite(s) || s < 0) return "--";
  const long t = std::lround(s);
  if (t >= 3600) return fmt::format("{}h{:02d}m", t / 3600, (t % 3600) / 60);
  if (t >= 60) return fmt::format("{}m{:02d}s", t / 60, t % 60);
  return fmt::format("{}s", t);
}

std::string ProgressBar::FormatCount(double v) {
  if (v >= 1e9) return fmt::format("{:.2f}G", v / 1e9);
  if (v >= 1e6) return fmt::format("{:.2f}M", v / 1e6);
  if (v >= 1e3) return fmt::format("{:.1f}k", v / 1e3);
  return fmt::format("{:.0f}", v);
}

void ProgressBar::Update(int64_t current, const std::string& info) {
  if (!enabled_) return;
  if (start_ < 0) start_ = current;
  const auto now = std::chrono::steady_clock::now();
  if (tty_) {
    if (now - last_draw_ < std::chrono::milliseconds(100) && current < total_) return;
  } else {
    if (current >= total_) return;  // Finish prints the last line
    const int decile = static_cast<int>(10 * current / total_);
    if (decile == last_decile_) return;
    last_decile_ = decile;
  }
  last_draw_ = now;
  Draw(current, info, false);
}

void ProgressBar::Finish(const std::string& info, int64_t current) {
  if (!enabled_) return;
  Draw(current < 0 ? total_ : std::min(current, total_), info, true);
}

void ProgressBar::Draw(int64_t current, const std::string& info, bool final) {
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
  const int64_t done = current - std::max<int64_t>(0, start_);
  const double rate = elapsed > 0 ? done / elapsed : 0;
  const double eta = rate > 0 ? (total_ - current) / rate : NAN;
  const double frac = std::clamp(static_cast<double>(current) / total_, 0.0, 1.0);
  constexpr int kWidth = 24;
  const int fill = static_cast<int>(frac * kWidth);
  std::string bar(fill, '=');
  if (fill < kWidth) bar += '>' + std::string(kWidth - fill - 1, ' ');
  const std::string line =
      fmt::format("{} {}/{} [{}] {:3.0f}% | {} | {} {}", label_, current, total_, bar, frac * 100,
                  info, final ? "took" : "ETA", FormatDuration(final ? elapsed : eta));
  if (tty_) {
    std::fprintf(stderr, "\r\033[K%s%s", line.c_str(), final ? "\n" : "");
  } else {
    std::fprintf(stderr, "%s\n", line.c_str());
  }
  std::fflush(stderr);
}

}  // namespace moelab
