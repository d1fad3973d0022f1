// The current time as an ISO 8601 UTC timestamp ("2026-11-26T18:14:38Z"): what corpus metadata
// (`created_at` in meta.json) records.
#pragma once

#include <ctime>
#include <string>

namespace moelab {

inline std::string UtcNowIso8601() {
  const std::time_t t = std::time(nullptr);
  std::tm tm;
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

}  // namespace moelab
