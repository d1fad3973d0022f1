#!/usr/bin/env bash
# Builds the libFuzzer targets of fuzz/ (clang, AddressSanitizer, UndefinedBehaviorSanitizer)
# into build-fuzz/ and runs each for a bounded time. Fails on a crash, a hang (an input taking
# over 10 s), a sanitizer report or a target's own finding, printing the report and the saved
# input. Without clang++ or its libFuzzer runtime it says so and skips (exit 0).
#   scripts/fuzz.sh [SECONDS_PER_TARGET (default 20)] [TARGET ...]
# Targets: config sweep_spec documents checkpoint (fuzz/README.md). Environment:
#   MOELAB_FUZZ_BUILD_DIR (build-fuzz), MOELAB_FUZZ_CXX (clang++-14, else clang++),
#   MOELAB_FUZZ_JOBS (targets run at once; nproc).
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-20}
shift || true
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then targets=(config sweep_spec documents checkpoint); fi
build_dir=${MOELAB_FUZZ_BUILD_DIR:-build-fuzz}
jobs=${MOELAB_FUZZ_JOBS:-$(nproc)}

cxx=${MOELAB_FUZZ_CXX:-}
if [ -z "$cxx" ]; then
  for c in clang++-14 clang++; do
    if command -v "$c" >/dev/null; then cxx=$c; break; fi
  done
fi
if [ -z "$cxx" ] || ! command -v "$cxx" >/dev/null; then
  echo "fuzz: SKIPPED: no clang++ found (the fuzz targets need clang's libFuzzer;" \
    "scripts/install-deps.sh installs clang-14 and libclang-rt-14-dev)"
  exit 0
fi
runtime_dir=$("$cxx" --print-runtime-dir 2>/dev/null || true)
if ! ls "$runtime_dir"/libclang_rt.fuzzer*.a >/dev/null 2>&1; then
  echo "fuzz: SKIPPED: $cxx has no libFuzzer runtime in '${runtime_dir}'" \
    "(Debian: libclang-rt-14-dev; scripts/install-deps.sh installs it)"
  exit 0
fi

start=$(date +%s)
if [ ! -f "$build_dir/CMakeCache.txt" ]; then
  launcher=()
  if command -v ccache >/dev/null; then launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache); fi
  cmake -S fuzz -B "$build_dir" -DCMAKE_CXX_COMPILER="$cxx" "${launcher[@]}" >/dev/null
fi
cmake --build "$build_dir" -j"$(nproc)" -- --no-print-directory >/dev/null
echo "fuzz: built the targets with $cxx in $(($(date +%s) - start)) s; $seconds s each"

export ASAN_OPTIONS=${ASAN_OPTIONS:-abort_on_error=1:detect_leaks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
# One target: the committed seeds (fuzz/corpus/T, read only) plus what this machine found
# before (build-fuzz/corpus/T, where new inputs go). Leaves its exit status in logs/T.rc.
run_target() {
  local t=$1
  mkdir -p "$build_dir/corpus/$t" "$build_dir/artifacts/$t" "$build_dir/logs"
  local rc=0
  "$build_dir/bin/fuzz_$t" "$build_dir/corpus/$t" "fuzz/corpus/$t" -max_total_time="$seconds" \
    -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="$build_dir/artifacts/$t/" >"$build_dir/logs/$t.log" 2>&1 || rc=$?
  echo "$rc" >"$build_dir/logs/$t.rc"
}

running=0
for t in "${targets[@]}"; do
  if [ ! -x "$build_dir/bin/fuzz_$t" ]; then
    echo "fuzz: unknown target '$t' (config sweep_spec documents checkpoint)" >&2
    exit 2
  fi
  rm -f "$build_dir/logs/$t.rc"
  run_target "$t" &
  running=$((running + 1))
  if [ "$running" -ge "$jobs" ]; then
    wait -n || true
    running=$((running - 1))
  fi
done
wait

failed=0
for t in "${targets[@]}"; do
  log="$build_dir/logs/$t.log"
  rc=$(cat "$build_dir/logs/$t.rc" 2>/dev/null || echo 1)
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 || true)
  if [ "$rc" -eq 0 ]; then
    echo "fuzz: $t: ok, ${execs:-?} executions, ${cov:-cov: ?} edges"
  else
    failed=1
    echo "fuzz: $t: FAILED (exit $rc) after ${execs:-?} executions; the report:"
    grep -av "^#[0-9]\|^INFO:\|^stat::\|NEW_FUNC" "$log" | tail -60
    echo "fuzz: $t: the input is in $build_dir/artifacts/$t/ (replay: $build_dir/bin/fuzz_$t FILE)"
  fi
done
echo "fuzz: done in $(($(date +%s) - start)) s"
exit "$failed"
