// Shared pieces of the libFuzzer targets (fuzz/README.md): a scratch file for the readers that
// take a path, and the one way a target reports a finding.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>

namespace moelab::fuzz {

// A finding that is not a crash by itself (an unclear rejection, a broken round trip): abort so
// libFuzzer saves the input as a crash artifact.
[[noreturn]] inline void Finding(const std::string& what) {
  std::fprintf(stderr, "FUZZ FINDING: %s\n", what.c_str());
  std::abort();
}

// A rejection must explain itself in printable text: an empty message is a finding, and so is a
// control byte other than a line break or tab (a NUL from the input cuts what() short).
// MOELAB_FUZZ_PRINT=1 prints every rejection (to read them while replaying inputs).
inline void ExpectClear(const std::exception& e) {
  const std::string_view what = e.what();
  static const bool print = std::getenv("MOELAB_FUZZ_PRINT") != nullptr;
  if (print) std::fprintf(stderr, "rejected: %s\n", e.what());
  if (what.empty()) Finding("a rejection with an empty message");
  for (const char ch : what) {
    const auto byte = static_cast<unsigned char>(ch);
    if ((byte < 0x20 && ch != '\n' && ch != '\t') || byte == 0x7f) {
      Finding("a control byte in the message: " + std::string(what));
    }
  }
}

// A per-process scratch folder under $TMPDIR, removed at exit.
inline const std::filesystem::path& ScratchDir() {
  static const std::filesystem::path dir = [] {
    std::filesystem::path p =
        std::filesystem::temp_directory_path() / ("moelab_fuzz_" + std::to_string(::getpid()));
    std::filesystem::create_directories(p);
    std::atexit([] {
      std::error_code ec;
      std::filesystem::remove_all(ScratchDir(), ec);
    });
    return p;
  }();
  return dir;
}

// Writes bytes to <scratch>/<name> (replacing it) and returns the path.
inline std::string WriteScratch(const std::string& name, const uint8_t* data, size_t size) {
  const std::string path = (ScratchDir() / name).string();
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  out.close();
  if (!out) Finding("cannot write the scratch file " + path);
  return path;
}

}  // namespace moelab::fuzz
