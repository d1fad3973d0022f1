// Text read from an input (a JSON key or string, a name stored in a checkpoint) made safe to put
// into an error message: a NUL would end what()'s C string and cut the message short, other
// control bytes would garble the terminal (found by fuzzing, fuzz/README.md).
#pragma once

#include <fmt/format.h>

#include <string>
#include <string_view>

namespace moelab {

// Control bytes become \u00XX (as JSON writes them); with keep_line_breaks, '\n' and '\t' stay
// (for messages that list several problems, one per line).
inline std::string PrintableText(std::string_view s, bool keep_line_breaks = false) {
  std::string out;
  out.reserve(s.size());
  for (const char ch : s) {
    const auto byte = static_cast<unsigned char>(ch);
    if ((byte < 0x20 || byte == 0x7f) && !(keep_line_breaks && (ch == '\n' || ch == '\t'))) {
      out += fmt::format("\\u{:04x}", byte);
    } else {
      out += ch;
    }
  }
  return out;
}

}  // namespace moelab
