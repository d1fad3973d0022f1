#!/usr/bin/env bash
# The device side of the GPU check (scripts/gpu-check-device.sh, shipped as .gpu/run.sh) on fake
# payloads, in a few seconds and without a GPU:
#  1. a binary whose library is missing: run.sh stops at the ldd check, exit 3, naming it;
#  2. fake binaries and a fake venv python: every stage runs under its limit, the summary counts
#     and names the failed test, says the GPU was not used when a test skipped for "no CUDA
#     device", records the bench row, a bench shape that hangs times out, the stages after it
#     are skipped once the budget is spent, and every summary line is already in $OUT.
# (scripts/gpu-check.sh --dry-run, which builds the real payload, takes minutes: docs/cuda.md.)
set -uo pipefail
SRC=$(cd "$(dirname "$0")/../.." && pwd)
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fails=0 passes=0
check() {  # check DESCRIPTION COMMAND...
  if "${@:2}"; then
    echo "ok: $1"
    passes=$((passes + 1))
  else
    echo "FAILED: $1"
    fails=$((fails + 1))
  fi
}
# shellcheck disable=SC2317  # called through check
has() { grep -q -- "$2" "$1"; }

pack() {  # pack DIR: DIR/stage/{bin,lib} -> DIR/.gpu with run.sh
  mkdir -p "$1/.gpu" "$1/stage/lib"
  echo "fake-commit" >"$1/stage/commit"
  tar -C "$1/stage" -cJf "$1/.gpu/payload.tar.xz" bin lib commit
  cp "$SRC/scripts/gpu-check-device.sh" "$1/.gpu/run.sh"
  echo "# fake peer" >"$1/.gpu/torch_peer.py"
}
venv() {  # venv DIR: a python that prints peer rows
  mkdir -p "$1/bin" "$1/lib/python3.12/site-packages/nvidia/cu13/lib"
  cat >"$1/bin/python" <<'EOF'
#!/usr/bin/env bash
[ "${1:-}" = --version ] && { echo "Python 3.12.3"; exit 0; }
mode=$(sed -n 's/.*--mode \([a-z]*\).*/\1/p' <<<"$*")
echo "torch 2.11.0, fake; bf16 GEMM 8192^3: 790.0 TFLOP/s"
echo "gpu-dense  $mode   32  32  100.0  327680  500.0  63.3%  40.0  1.0  10.400"
EOF
  chmod +x "$1/bin/python"
}

# ---- 1. A missing library stops everything at the ldd check ----------------------------------
A=$T/missing
mkdir -p "$A/stage/bin" "$A/build"
echo 'int moelab_fake(void) { return 0; }' >"$A/build/fake.c"
echo 'int moelab_fake(void); int main(void) { return moelab_fake(); }' >"$A/build/main.c"
if ! cc -shared -fPIC -o "$A/build/libmoelabfake.so" "$A/build/fake.c" ||
  ! cc -o "$A/stage/bin/cuda_needs_test" "$A/build/main.c" -L"$A/build" -lmoelabfake; then
  echo "FAILED: cannot build the fake binary"
  exit 1
fi
pack "$A"
venv "$A/venv"
(cd "$A" && OUT="$A/out" MOELAB_GPU_VENV="$A/venv" MOELAB_GPU_DIR="$A/work" .gpu/run.sh \
  >"$A/stdout" 2>&1)
rc=$?
check "missing library: exit 3 (got $rc)" test "$rc" = 3
check "missing library: named in the summary" has "$A/out/summary.txt" \
  "ldd .*FAIL.*cuda_needs_test: libmoelabfake.so not found"
check "missing library: no test ran" test ! -e "$A/out/tests.log"
check "missing library: the table is printed last" has "$A/stdout" "^total "

# ---- 2. Every stage, with limits and the budget -------------------------------------------------
B=$T/stages
mkdir -p "$B/stage/bin"
cat >"$B/stage/bin/cuda_fake_test" <<'EOF'
#!/usr/bin/env bash
# Passes, fails, skips for want of a GPU, then crashes: Fake.Crashes and Fake.NeverRan pass alone.
case "${1:-}" in
  --gtest_list_tests) printf 'Fake.\n  Passes\n  Fails\n  NeedsGpu\n  Crashes\n  NeverRan\n'; exit 0 ;;
  --gtest_filter=Fake.Fails) echo "[  FAILED  ] Fake.Fails (1 ms)"; exit 1 ;;
  --gtest_filter=*) echo "[       OK ] ${1#--gtest_filter=} (1 ms)"; exit 0 ;;
esac
cat <<'OUT'
[==========] Running 5 tests from 1 test suite.
[ RUN      ] Fake.Passes
[       OK ] Fake.Passes (1 ms)
[ RUN      ] Fake.Fails
fake_test.cc:1: Failure
[  FAILED  ] Fake.Fails (2 ms)
[ RUN      ] Fake.NeedsGpu
fake_test.cc:2: Skipped
CUDA test skipped: no CUDA device: cudaErrorInsufficientDriver
[  SKIPPED ] Fake.NeedsGpu (0 ms)
[ RUN      ] Fake.Crashes
OUT
kill -SEGV $$
EOF
cat >"$B/stage/bin/moelab" <<'EOF'
#!/usr/bin/env bash
case "$*" in
  *--plan*) echo "Device memory plan per case (budget 75 GiB)"
    echo "gpu-dense            unsplit (micro-batch 32): 81.0 GiB"
    echo "                     runs at: micro-batch 8: 41.0 GiB" ;;
  *"--only gpu-moe"*) echo "cuBLAS bf16 GEMM 8192^3: 790.0 TFLOP/s"
    [ -n "${FAKE_HANG:-}" ] && exec sleep 60
    echo "fake: out of memory"; exit 1 ;;
  *"--only gpu-dense "*) echo "cuBLAS bf16 GEMM 8192^3: 790.0 TFLOP/s"
    echo "gpu-dense  272000000  272000000  400.0  20.0  78000  120.0  15.2% ${MOELAB_FLASH_KERNEL:-} ${MOELAB_FFN:-}" ;;
  *) echo "fake moelab: unexpected $*"; exit 9 ;;
esac
EOF
chmod +x "$B"/stage/bin/*
pack "$B"
venv "$B/venv"
start=$SECONDS
(cd "$B" && OUT="$B/out" MOELAB_GPU_VENV="$B/venv" MOELAB_GPU_DIR="$B/work" \
  MOELAB_GPU_BUDGET_S=12 FAKE_HANG=1 .gpu/run.sh >"$B/stdout" 2>&1)
rc=$?
took=$((SECONDS - start))
S=$B/out/summary.txt
check "stages: exit 0 (got $rc)" test "$rc" = 0
check "stages: within the budget (${took}s)" test "$took" -le 16
check "tests: counted" has "$S" \
  "test cuda_fake_test .*CRASH(139).*4 run, 1 passed, 1 failed, 1 skipped"
check "tests: the crash named" has "$S" "last started: Fake.Crashes"
check "tests: failure named" has "$S" "failed: Fake.Fails"
check "tests: no-GPU skip flagged" has "$S" "THE GPU WAS NOT USED"
check "tests: log in OUT" has "$B/out/tests.log" "Fake.NeedsGpu"
check "tests: xml tar in OUT" test -s "$B/out/tests-xml.tar"
check "tests: again with the opt-in paths" has "$S" \
  "test cuda_fake_test \\[MOELAB_FLASH_KERNEL=mma MOELAB_FLASH_ROPE=fused MOELAB_FFN=fused MOELAB_MOE_EXPERTS=chunked MOELAB_MOE_DISPATCH=sort MOELAB_ATTENTION_ACTS=bf16\\] .*4 run, 1 passed"
check "bench: plan recorded" has "$S" "bench --plan .*ok.*gpu-dense runs at: micro-batch 8: 41.0 GiB"
check "bench: row recorded" has "$S" "bench gpu-dense .*ok.*gpu-dense 272000000 .*15.2%.*790.0 TFLOP/s"
check "bench: a hang times out" has "$S" "bench gpu-moe .*TIMEOUT"
check "budget: later stages skipped" has "$S" "bench gpu-dense-muonclip .*SKIP.*budget is spent"
check "budget: peer skipped" has "$S" "peer eager .*SKIP"
check "budget: no reruns" has "$S" "alone cuda_fake_test .*SKIP.*no time left to rerun 3 tests"
check "env: written" has "$B/out/env.txt" "library path for our binaries"
check "table last on stdout" has <(tail -n 12 "$B/stdout") "^total "

# ---- 3. Given time: bench failures, the peer, the failed tests alone -----------------------------
# Twice into one relative folder: the second run starts its files afresh.
for _ in 1 2; do
  (cd "$B" && OUT=out2 MOELAB_GPU_VENV="$B/venv" MOELAB_GPU_DIR="$B/work" \
    MOELAB_GPU_STAGES=tests,bench,peer,compile .gpu/run.sh >"$B/stdout2" 2>&1)
done
check "rerun: logs start afresh" test "$(grep -c '^=== test cuda_fake_test: limit' "$B/out2/tests.log")" = 1
check "rerun: xml tar with a relative OUT" test -s "$B/out2/tests-xml.tar"
check "bench: a failure shows its last words" has "$B/out2/summary.txt" \
  "bench gpu-moe .*FAIL(1).*no result row: fake: out of memory | GEMM 8192^3"
check "bench: an unknown case shows its last words" has "$B/out2/summary.txt" \
  "bench gpu-dense-muonclip .*FAIL(9).*fake moelab: unexpected bench"
check "compare: every setting of a word in the environment" has "$B/out2/summary.txt" \
  "bench gpu-dense \\[MOELAB_FLASH_KERNEL=mma MOELAB_FLASH_ROPE=fused MOELAB_FFN=fused .*\\] .*ok.*15.2% mma fused"
check "compare: one setting alone" has "$B/out2/summary.txt" \
  "bench gpu-dense \\[MOELAB_FFN=fused\\] .*ok.*15.2% fused"
check "peer: eager row" has "$B/out2/summary.txt" "peer eager .*ok.*gpu-dense eager 32 32 100.0"
check "peer: compile row" has "$B/out2/summary.txt" "peer compile .*ok.*gpu-dense compile"
check "alone: failed and unfinished tests rerun one per process" has "$B/out2/summary.txt" \
  "alone cuda_fake_test .*FAIL.*2 of 3 pass when run alone; still failing: Fake.Fails(FAIL(1))"
check "alone: after the eager peer, before compile" has \
  <(cut -c1-22 "$B/out2/summary.txt" | sed 's/ *$//' | paste -sd,) \
  "peer eager,alone cuda_fake_test,peer compile"
check "compare: all together before the peer, each alone after torch.compile" has \
  <(cut -c1-22 "$B/out2/summary.txt" | sed 's/ *$//' | paste -sd,) \
  "bench gpu-moe \\[MOELAB_,peer eager,alone cuda_fake_test,peer compile,bench gpu-dense \\[MOELA"

echo "$passes passed, $fails failed"
exit $((fails > 0))
