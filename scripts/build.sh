#!/usr/bin/env bash
# Configures and builds moelab (Release) into build/. Idempotent and incremental.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${MOELAB_BUILD_DIR:-build}
if [ ! -f "$BUILD_DIR/CMakeCache.txt" ]; then
  cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release ${MOELAB_CMAKE_ARGS:-}
fi
cmake --build "$BUILD_DIR" -j"$(nproc)"
