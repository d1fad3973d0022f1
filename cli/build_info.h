// The source commit this binary was built from: `moelab --version`, and the `build.commit` run
// variable every `moelab train` records, so runs from different builds can be told apart (builds
// need not reproduce each other's losses bit for bit; one build does).
#pragma once

namespace moelab::cli {

// `git describe --always --dirty` of the source tree at build time ("unknown" outside git).
const char* BuildCommit();

}  // namespace moelab::cli
