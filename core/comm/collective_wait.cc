#include "core/comm/collective_wait.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <stdexcept>
#include <thread>

namespace moelab {

double CollectiveTimeoutSeconds() {
  const char* v = std::getenv("MOELAB_NCCL_TIMEOUT_S");
  if (v == nullptr || *v == '\0') return 1800;
  char* end = nullptr;
  const double s = std::strtod(v, &end);
  if (*end != '\0' || !std::isfinite(s) || s < 0) {
    throw std::invalid_argument(
        fmt::format("MOELAB_NCCL_TIMEOUT_S={}: not a number of seconds >= 0 (0: no limit)", v));
  }
  return s;
}

void WaitWatched(const std::function<CollectiveState(std::string* why)>& poll, double timeout_s,
                 const std::string& what) {
  using Clock = std::chrono::steady_clock;
  const Clock::time_point start = Clock::now();
  std::chrono::microseconds nap(0);
  for (;;) {
    std::string why;
    switch (poll(&why)) {
      case CollectiveState::kDone:
        return;
      case CollectiveState::kFailed:
        throw std::runtime_error(what + ": " + why);
      case CollectiveState::kPending:
        break;
    }
    const double waited = std::chrono::duration<double>(Clock::now() - start).count();
    if (timeout_s > 0 && waited > timeout_s) {
      throw std::runtime_error(
          fmt::format("{}: still pending after {:.0f} s (a peer stopped or the link broke; "
                      "MOELAB_NCCL_TIMEOUT_S sets the limit, 0 for none)",
                      what, waited));
    }
    if (nap.count() == 0) {
      std::this_thread::yield();
      if (waited > 1e-3) nap = std::chrono::microseconds(10);
    } else {
      std::this_thread::sleep_for(nap);
      nap = std::min(nap * 2, std::chrono::microseconds(200));
    }
  }
}

}  // namespace moelab
