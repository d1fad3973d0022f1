#!/usr/bin/env bash
# The device side of the GPU check (scripts/gpu-check-device.sh, shipped as .gpu/run.sh) on fake
# payloads, in a few seconds and without a GPU:
#  1. a binary whose library is missing: run.sh stops at the ldd check, exit 3, naming it;
#  2. fake binaries and a fake venv python: every stage runs under its limit, the summary counts
#     and names the failed test, says the GPU was not used when a test skipped for "no CUDA
#     device", the opt-in group runs in its own process and its failures are rerun alone by
#     name, records the bench row, a bench shape that hangs times out, the stages after it are
#     skipped once the budget is spent, and every summary line is already in $OUT;
#  3. given time: the compare rows on --kernels, a loss off the default row's or NaN flagged,
#     the peer, and the stage order;
#  4. the peer skipped when its rows for the card exist;
#  5. with the built binaries (argument 1: their folder), scripts/gpu-check-groups.txt: every
#     group's filter names tests, and the default passes and the groups cover every test once.
# (scripts/gpu-check.sh --dry-run, which builds the real payload, takes minutes: docs/cuda.md.)
set -uo pipefail
SRC=$(cd "$(dirname "$0")/../.." && pwd)
BIN=${1:-}
T=$(mktemp -d)
trap "[ -n \"${KEEP:-}\" ] || rm -rf \"$T\"" EXIT
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
  printf '# fake group\nopt=in cuda_fake_test Fake.Opt*\n' >"$1/.gpu/groups.txt"
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
# Default pass (a negative filter): passes, fails, skips for want of a GPU, then crashes;
# Fake.Crashes and Fake.NeverRan pass alone. The opt-in group (Fake.Opt*): a fault fails the test
# after it too; alone, only the faulting one fails.
echo "$*" >>"$(dirname "$0")/../calls"
case "$*" in
  *--gtest_list_tests*-Fake.Opt*) printf 'Fake.\n  Passes\n  Fails\n  NeedsGpu\n  Crashes\n  NeverRan\n'; exit 0 ;;
  *--gtest_list_tests*Fake.Opt*) printf 'Fake.\n  OptFaults\n  OptAfter\n'; exit 0 ;;
  *--gtest_list_tests*) printf 'Fake.\n  Passes\n  Fails\n  NeedsGpu\n  Crashes\n  NeverRan\n  OptFaults\n  OptAfter\n'; exit 0 ;;
  "--gtest_filter=Fake.Fails "* | "--gtest_filter=Fake.OptFaults "*)
    echo "[  FAILED  ] ${1#--gtest_filter=} (1 ms)"; exit 1 ;;
  "--gtest_filter=-Fake.Opt*"*) ;;
  "--gtest_filter=Fake.Opt*"*)
    printf '[ RUN      ] Fake.OptFaults\n[  FAILED  ] Fake.OptFaults (1 ms)\n'
    printf '[ RUN      ] Fake.OptAfter\n[  FAILED  ] Fake.OptAfter (1 ms)\n'; exit 1 ;;
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
    # The loss columns: the default's last loss 9.9000; ffn=fused within 0.05, mma off by 0.4,
    # sort NaN.
    last=9.9000
    case "$*" in
      *--kernels*dispatch=sort*) last=NaN ;;
      *--kernels*attention_kernel=mma*) last=9.5000 ;;
      *--kernels*ffn=fused*) last=9.9100 ;;
    esac
    echo "gpu-dense  272000000  272000000  400.0  20.0  78000  120.0  15.2%  10.4000  $last" ;;
  *) echo "fake moelab: unexpected $*"; exit 9 ;;
esac
EOF
chmod +x "$B"/stage/bin/*
pack "$B"
venv "$B/venv"
start=$SECONDS
(cd "$B" && OUT="$B/out" MOELAB_GPU_VENV="$B/venv" MOELAB_GPU_DIR="$B/work" \
  MOELAB_GPU_BUDGET_S=30 FAKE_HANG=1 .gpu/run.sh >"$B/stdout" 2>&1)
rc=$?
took=$((SECONDS - start))
S=$B/out/summary.txt
check "stages: exit 0 (got $rc)" test "$rc" = 0
check "stages: within the budget (${took}s)" test "$took" -le 34
check "tests: counted" has "$S" \
  "test cuda_fake_test .*CRASH(139).*4 run, 1 passed, 1 failed, 1 skipped"
check "tests: the crash named" has "$S" "last started: Fake.Crashes"
check "tests: failure named" has "$S" "failed: Fake.Fails"
check "tests: no-GPU skip flagged" has "$S" "THE GPU WAS NOT USED"
check "tests: log in OUT" has "$B/out/tests.log" "Fake.NeedsGpu"
check "tests: xml tar in OUT" test -s "$B/out/tests-xml.tar"
check "groups: the opt-in group in its own process" has "$S" \
  "group \\[opt=in\\] cuda_fake_test .*FAIL(1).*2 run, 0 passed, 2 failed.*failed: Fake.OptAfter Fake.OptFaults"
check "alone: default failures rerun one per process" has "$S" \
  "alone cuda_fake_test .*FAIL.*2 of 3 pass when run alone; still failing: Fake.Fails(FAIL(1))"
check "alone: a group's failures rerun alone, named with the group" has "$S" \
  "alone cuda_fake_test \\[opt=in\\] .*FAIL.*1 of 2 pass when run alone; still failing: Fake.OptFaults(FAIL(1))"
check "bench: plan recorded" has "$S" "bench --plan .*ok.*gpu-dense runs at: micro-batch 8: 41.0 GiB"
check "bench: row recorded" has "$S" "bench gpu-dense .*ok.*gpu-dense 272000000 .*15.2%.*790.0 TFLOP/s"
check "bench: a hang times out" has "$S" "bench gpu-moe .*TIMEOUT"
check "budget: later stages skipped" has "$S" "bench gpu-dense-muonclip .*SKIP.*budget is spent"
check "budget: peer skipped" has "$S" "peer eager .*SKIP"
check "env: written" has "$B/out/env.txt" "library path for our binaries"
check "groups: the default pass leaves the group's tests out" has "$B/work/calls" \
  "^--gtest_filter=-Fake.Opt\\* --gtest_output"
check "table last on stdout" has <(tail -n 12 "$B/stdout") "^total "

# ---- 3. Given time: bench failures and losses, the peer, the stage order ------------------------
# Twice into one relative folder: the second run starts its files afresh.
for _ in 1 2; do
  (cd "$B" && OUT=out2 MOELAB_GPU_VENV="$B/venv" MOELAB_GPU_DIR="$B/work" MOELAB_GPU_CARD="Fake GPU" \
    .gpu/run.sh >"$B/stdout2" 2>&1)
done
S2=$B/out2/summary.txt
check "rerun: logs start afresh" test "$(grep -c '^=== test cuda_fake_test: limit' "$B/out2/tests.log")" = 1
check "rerun: xml tar with a relative OUT" test -s "$B/out2/tests-xml.tar"
check "bench: a failure shows its last words" has "$S2" \
  "bench gpu-moe .*FAIL(1).*no result row: fake: out of memory | GEMM 8192^3"
check "bench: an unknown case shows its last words" has "$S2" \
  "bench gpu-dense-muonclip .*FAIL(9).*fake moelab: unexpected bench"
check "bench: the default row with its losses" has "$S2" \
  "bench gpu-dense  .*ok.*15.2% 10.4000 9.9000"
check "compare: the choices go to --kernels" has "$B/out2/bench.log" \
  "=== bench gpu-dense \\[attention_kernel=mma,rope=fused,ffn=fused,experts=chunked,dispatch=sort,attention_acts=bf16\\]: limit"
check "compare: a NaN loss flagged" has "$S2" \
  "bench gpu-dense \\[attention_kernel=mma,rope.*LOSS .*loss NaN (first 10.4000, last NaN)"
check "compare: a loss off the default row's flagged" has "$S2" \
  "bench gpu-dense \\[attention_kernel=mma\\] *LOSS .*last loss 9.5000 is 0.4000 nats from the default row's 9.9000"
check "compare: a loss within the tolerance passes" has "$S2" \
  "bench gpu-dense \\[ffn=fused\\] *ok .*15.2% 10.4000 9.9100"
check "peer: eager row" has "$S2" "peer eager .*ok.*gpu-dense eager 32 32 100.0"
check "peer: compile row" has "$S2" "peer compile .*ok.*gpu-dense compile"
line_of() { grep -n -- "$1" "$S2" | head -1 | cut -d: -f1; }
in_order() {  # in_order PATTERN...: each pattern's first line after the one before
  local at=0 n p
  for p in "$@"; do
    n=$(line_of "$p")
    [ -n "$n" ] && ((n > at)) || return 1
    at=$n
  done
}
check "order: tests, groups, alone, bench, all together, peer, compile, each alone" in_order \
  "^test cuda_fake_test" "^group \\[opt=in\\]" "^alone cuda_fake_test " "^bench gpu-dense  " \
  "^bench gpu-moe \\[attention_kernel" "^peer eager" "^peer compile" "^bench gpu-dense \\[ffn=fused\\]"

# ---- 4. The peer's rows for this card exist: the peer is not rerun --------------------------------
mkdir -p "$B/rows"
echo "| gpu-dense | PyTorch eager | ... |" >"$B/rows/fake-gpu.txt"
(cd "$B" && OUT=out3 MOELAB_GPU_VENV="$B/venv" MOELAB_GPU_DIR="$B/work" MOELAB_GPU_CARD="Fake GPU" \
  MOELAB_GPU_PEER_ROWS="$B/rows" MOELAB_GPU_STAGES=peer,compile .gpu/run.sh >"$B/stdout3" 2>&1)
check "peer: skipped when its rows for the card exist" has "$B/out3/summary.txt" \
  "peer eager .*SKIP.*the peer's rows for Fake GPU are in .*rows/fake-gpu.txt"
check "peer: torch.compile skipped too" has "$B/out3/summary.txt" "peer compile .*SKIP"
check "peer: nothing ran" test ! -s "$B/out3/peer.log"
(cd "$B" && OUT=out4 MOELAB_GPU_VENV="$B/venv" MOELAB_GPU_DIR="$B/work" MOELAB_GPU_CARD="Fake GPU" \
  MOELAB_GPU_PEER_ROWS="$B/rows" MOELAB_GPU_PEER=always MOELAB_GPU_STAGES=peer .gpu/run.sh \
  >"$B/stdout4" 2>&1)
check "peer: MOELAB_GPU_PEER=always runs it" has "$B/out4/summary.txt" "peer eager .*ok"
check "peer: the dry run's plan says so" bash -c "cd '$B' && MOELAB_GPU_VENV='$B/venv' \
  MOELAB_GPU_DIR='$B/work5' OUT='$B/out5' MOELAB_GPU_CARD='Fake GPU' MOELAB_GPU_PEER_ROWS='$B/rows' \
  .gpu/run.sh --dry-run 2>&1 | grep -q 'peer     skipped: the peer.s rows for Fake GPU'"

# ---- 5. The real groups against the built test binaries -------------------------------------------
if [ -n "$BIN" ] && [ -x "$BIN/cuda_kernels_test" ] && [ -x "$BIN/cuda_model_test" ]; then
  G=$SRC/scripts/gpu-check-groups.txt
  list() { "$BIN/$1" --gtest_list_tests "${@:2}" | awk '/^[^ ]/ {s = $1; next} /^  [^ ]/ {print s $1}'; }
  for bin in cuda_kernels_test cuda_model_test; do
    negative=""
    : >"$T/covered"
    while read -r g b f; do
      [[ -z $g || $g == \#* || $b != "$bin" ]] && continue
      n=$(list "$bin" --gtest_filter="$f" | tee -a "$T/covered" | grep -c .)
      check "groups: [$g] $bin names tests ($n)" test "$n" -gt 0
      negative+="${negative:+:}$f"
    done <"$G"
    list "$bin" --gtest_filter="-$negative" >>"$T/covered"
    check "groups: $bin's default pass and groups run every test exactly once" \
      cmp -s <(sort "$T/covered") <(list "$bin" | sort)
  done
  for bin in moelab cuda_kernels_test cuda_model_test; do
    check "cuDNN is loaded at run time, not linked: $bin" \
      test "$(ldd "$BIN/$bin" | grep -c cudnn)" = 0
  done
else
  echo "skipped: the groups against the binaries (no built cuda_kernels_test/cuda_model_test given)"
fi

echo "$passes passed, $fails failed"
exit $((fails > 0))
