#!/usr/bin/env bash
# The GPU check as it runs on the lent machine: scripts/gpu-check.sh copies this file to
# .gpu/run.sh beside payload.tar.xz (the binaries and the Debian libraries they need) and
# torch_peer.py. docs/cuda.md says how to run it. In the repo root of the device's copy:
#
#   .gpu/run.sh                 every stage (about 7 minutes at most: MOELAB_GPU_BUDGET_S=420)
#   .gpu/run.sh --dry-run       unpack, resolve and check libraries, print the plan; run nothing
#                               on a GPU (scripts/gpu-check.sh --dry-run runs it here)
#
# Stages, each under its own `timeout` and all inside the global budget: (1) nvidia-smi + env +
# the ldd check, which stops everything at once when a library is missing; (2) the CUDA test
# binaries; (3) `moelab bench --device cuda --plan`, then one bench shape per process, and
# a shape again under each MOELAB_GPU_COMPARE setting (VAR=value[,VAR=value...][@shape]); (4) the
# PyTorch peer, eager; then the failed (or, after a crash, unfinished) tests again, one per
# process; (5) the peer under torch.compile; (6) the MOELAB_GPU_COMPARE_LATER settings. Every stage appends its line to
# $OUT/summary.txt the moment it ends, and the logs grow in $OUT as they are written, so a
# time-out loses nothing already measured. Files in $OUT (the device tool returns at most 8):
# summary.txt, env.txt, tests.log, tests-xml.tar, bench.log, peer.log. The summary table is
# printed last.
#
# Environment: our binaries get LD_LIBRARY_PATH = the payload's lib/ + the venv's nvidia/*/lib
# (cuBLAS/cudart in cu13/lib, NCCL, cuDNN) + the driver's folder, passed per command (never
# exported: python and the system tools keep the machine's own libraries). The peer runs with
# the venv's python, named explicitly.
set -uo pipefail

PACK=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$PACK/.." && pwd)
DRY=0
[ "${1:-}" = "--dry-run" ] && DRY=1
OUTD=${OUT:-$PACK/out}
mkdir -p "$OUTD" && OUTD=$(cd "$OUTD" && pwd) || exit 3
BUDGET=${MOELAB_GPU_BUDGET_S:-420}
STAGES=${MOELAB_GPU_STAGES:-env,tests,bench,peer,compile}
VENV=${MOELAB_GPU_VENV:-/opt/torch/.venv}
PY=$VENV/bin/python
[ -x "$PY" ] || PY=$VENV/bin/python3
WORK=${MOELAB_GPU_DIR:-/tmp/moelab-gpu}
T0=$SECONDS
SUMMARY=$OUTD/summary.txt
ENVLOG=$OUTD/env.txt
# Fresh files (the device empties $OUT; a rehearsal here reuses its folder).
rm -f "$OUTD"/{summary.txt,env.txt,tests.log,tests-xml.tar,bench.log,peer.log}
ROWS=()

want() { [[ ",$STAGES," == *",$1,"* ]]; }
left() { echo $((BUDGET - (SECONDS - T0))); }
# record STAGE STATUS SECONDS DETAIL: one summary line, written at once.
record() {
  local line
  line=$(printf '%-28s %-10s %5ss  %s' "$1" "$2" "$3" "$4")
  echo "$line" >>"$SUMMARY"
  ROWS+=("$line")
}
# stage NAME LIMIT LOG CMD...: runs CMD under timeout min(LIMIT, budget left), appending its
# output to LOG. Sets STAGE_RC (124: timed out, 125: not started).
stage() {
  local name=$1 limit=$2 log=$3
  shift 3
  local rem=$(($(left) - 3))
  STAGE_RC=125
  if ((rem < 5)); then
    record "$name" SKIP 0 "the ${BUDGET}s budget is spent"
    return
  fi
  ((limit > rem)) && limit=$rem
  echo "=== $name: limit ${limit}s, $(date -u +%FT%TZ), budget left $(left)s" >>"$log"
  echo "=== $name (limit ${limit}s)" >&2
  local t=$SECONDS
  timeout -k 5 "$limit" "$@" >>"$log" 2>&1
  STAGE_RC=$?
  STAGE_S=$((SECONDS - t))
  echo "=== $name: exit $STAGE_RC after ${STAGE_S}s" >>"$log"
}
# segment NAME LOG: what stage NAME wrote to LOG (between its === lines).
segment() {
  awk -v h="=== $1: limit" -v e="=== $1: exit" 'index($0, h) == 1 {p = 1; next}
    index($0, e) == 1 {p = 0} p' "$2"
}
# last_words NAME LOG: the stage's last line of output, for a summary without a result.
last_words() { segment "$1" "$2" | grep -v '^[[:space:]]*$' | tail -1 | tr -s ' ' | head -c 200; }
status_of() {
  case $1 in
    0) echo ok ;;
    124 | 137) echo TIMEOUT ;;
    1[3-9][0-9]) echo "CRASH($1)" ;;
    *) echo "FAIL($1)" ;;
  esac
}
finish() {
  record total "" $((SECONDS - T0)) "budget ${BUDGET}s; files in ${OUT:-$OUTD}"
  echo
  echo "== moelab GPU check, $(date -u +%FT%TZ), $(cat "$WORK/commit" 2>/dev/null)"
  printf '%s\n' "${ROWS[@]}"
  exit "$1"
}

# ---- Unpack ------------------------------------------------------------------------------
rm -rf "$WORK" && mkdir -p "$WORK" || exit 3
# tar needs the xz program, which a minimal image may lack; Python's tarfile has lzma built in.
if ! { command -v xz >/dev/null && tar -C "$WORK" -xJf "$PACK/payload.tar.xz"; } &&
  ! "$PY" -c 'import sys, tarfile
with tarfile.open(sys.argv[1]) as t:
    try:
        t.extractall(sys.argv[2], filter="tar")
    except TypeError:  # Python before 3.11.4: no filter argument
        t.extractall(sys.argv[2])' \
    "$PACK/payload.tar.xz" "$WORK"; then
  record unpack FAIL 0 "cannot unpack $PACK/payload.tar.xz (no xz, and $PY failed)"
  finish 3
fi
BINS=()
for b in "$WORK"/bin/*; do BINS+=("$b"); done
TESTS=()
for b in "$WORK"/bin/*_test; do [ -x "$b" ] && TESTS+=("$b"); done

# ---- Library folders for our binaries ----------------------------------------------------
LIBDIRS=("$WORK/lib")
for d in "$VENV"/lib/python3*/site-packages/nvidia/*/lib; do
  [ -d "$d" ] && LIBDIRS+=("$d")
done
# The driver's libcuda.so.1 (cudart loads it at run time; ldd does not list it).
DRIVER=""
if ldconfig -p 2>/dev/null | grep -q 'libcuda\.so\.1 '; then
  DRIVER="in the loader cache"
else
  IFS=: read -ra inherited <<<"${LD_LIBRARY_PATH:-}"
  for d in "${inherited[@]}"; do
    [ -n "$d" ] && [ -e "$d/libcuda.so.1" ] && DRIVER="$d (inherited LD_LIBRARY_PATH)" && break
  done
fi
if [ -z "$DRIVER" ]; then
  for d in /usr/local/nvidia/lib64 /usr/local/nvidia/lib /usr/lib/x86_64-linux-gnu /usr/lib64 \
    /usr/local/cuda/compat /usr/local/cuda/lib64; do
    if [ -e "$d/libcuda.so.1" ]; then
      DRIVER=$d
      LIBDIRS+=("$d")
      break
    fi
  done
fi
LIBPATH=$(
  IFS=:
  echo "${LIBDIRS[*]}"
)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
RUN=(env LD_LIBRARY_PATH="$LIBPATH" MOELAB_BIN_DIR="$WORK/bin" MOELAB_SOURCE_DIR="$REPO"
  OMP_NUM_THREADS=8)

# ---- Stage 1: device, environment, ldd -------------------------------------------------------
{
  echo "== $(date -u +%FT%TZ) payload $(cat "$WORK/commit" 2>/dev/null)"
  echo "== host: $(uname -srm); $(ldd --version 2>&1 | head -1)"
  if ((DRY)); then
    echo "== dry run: nvidia-smi not called"
  else
    timeout 20 nvidia-smi 2>&1
    timeout 10 nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used,clocks.sm,clocks.max.sm \
      --format=csv 2>&1
  fi
  echo "== python: $PY ($("$PY" --version 2>&1))"
  echo "== library path for our binaries (not exported):"
  printf '   %s\n' "${LIBDIRS[@]}"
  echo "== libcuda.so.1: ${DRIVER:-NOT FOUND (cudart will report an insufficient driver)}"
  # MOELAB_MOE_EXPERTS=cudnn needs cuDNN 9.18 or later: the wheel's version, by its dist-info.
  wheel=$(cd "$VENV" 2>/dev/null && ls -d lib/python*/site-packages/nvidia_cudnn*.dist-info 2>/dev/null)
  echo "== cuDNN wheel: ${wheel:-no nvidia_cudnn*.dist-info in the venv}"
} >"$ENVLOG" 2>&1
cat "$ENVLOG" >&2
if ((DRY)); then
  record env ok 0 "dry run: no GPU asked for; python $("$PY" --version 2>&1)"
else
  gpu=$(timeout 10 nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | head -1)
  record env "$([ -n "$DRIVER" ] && echo ok || echo WARN)" 0 \
    "${gpu:-no nvidia-smi}; libcuda.so.1: ${DRIVER:-NOT FOUND}; $("$PY" --version 2>&1)"
fi

# Every binary's libraries must resolve. In the strict mode of the dry run each must also come
# from the payload, the venv or glibc: a Debian library found on this machine would be missing
# on the device.
LDD_BAD=()
GLIBC_TOO_OLD=0
for b in "${BINS[@]}"; do
  out=$(env LD_LIBRARY_PATH="$LIBPATH" ldd "$b" 2>&1)
  echo "== ldd $(basename "$b")" >>"$ENVLOG"
  echo "$out" >>"$ENVLOG"
  while read -r lib; do LDD_BAD+=("$(basename "$b"): $lib not found"); done \
    < <(awk '/not found/ && $2 == "=>" {print $1}' <<<"$out")
  grep -q "version \`GLIBC_" <<<"$out" && GLIBC_TOO_OLD=1
  while read -r v; do LDD_BAD+=("$(basename "$b"): $v"); done \
    < <(grep -o "version \`GLIBCXX[^']*' not found[^)]*" <<<"$out" | sort -u)
  if [ "${MOELAB_GPU_STRICT:-0}" = 1 ]; then
    while read -r path; do
      case $path in
        "$WORK"/lib/* | "$VENV"/*) ;;
        */ld-linux* | */libc.so.* | */libm.so.* | */libpthread.so.* | */libdl.so.* | */librt.so.* | \
          */libresolv.so.*) ;;
        *) LDD_BAD+=("$(basename "$b"): $(basename "$path") resolved outside payload/venv: $path") ;;
      esac
    done < <(awk '$2 == "=>" && $3 ~ /^\// {print $3}' <<<"$out")
  fi
done
# A host glibc older than this build's: start our binaries through the payload's own loader.
LAUNCH=()
if ((GLIBC_TOO_OLD)); then
  LAUNCH=("$WORK/lib/glibc/ld.so" --library-path "$WORK/lib/glibc:$LIBPATH")
  echo "== host glibc too old: using the payload's loader" | tee -a "$ENVLOG" >&2
  for b in "${BINS[@]}"; do
    "${LAUNCH[@]}" --list "$b" 2>&1 | awk -v b="$(basename "$b")" '/not found/ {print b ": " $1 " not found"}' \
      >>"$WORK/ldd-missing"
  done
  while read -r l; do LDD_BAD+=("$l"); done <"$WORK/ldd-missing" 2>/dev/null
fi
if ((${#LDD_BAD[@]})); then
  printf 'ldd: %s\n' "${LDD_BAD[@]}" | sort -u | tee -a "$ENVLOG" >&2
  record ldd FAIL 0 "$(printf '%s; ' "${LDD_BAD[@]}" | head -c 600)"
  finish 3
fi
record ldd ok 0 "${#BINS[@]} binaries resolve (payload lib/ + ${#LIBDIRS[@]} folders)${LAUNCH:+, payload loader}"
# Unresolved symbols (an older cuBLAS than the one linked here, say): reported, not fatal.
for b in "${BINS[@]}"; do
  n=$(env LD_LIBRARY_PATH="$LIBPATH" ldd -r "$b" 2>&1 | grep -c 'undefined symbol')
  ((n > 0)) && record "ldd -r $(basename "$b")" WARN 0 "$n undefined symbols (see env.txt)" &&
    env LD_LIBRARY_PATH="$LIBPATH" ldd -r "$b" 2>&1 | grep 'undefined symbol' | head -20 >>"$ENVLOG"
done

if ((DRY)); then
  # The binaries start with the payload's libraries (no GPU here: the bench refuses with exit 2).
  for t in "${TESTS[@]}"; do
    n=$("${RUN[@]}" "${LAUNCH[@]}" "$t" --gtest_list_tests 2>>"$ENVLOG" | grep -c '^  ')
    record "start $(basename "$t")" "$([ "$n" -gt 0 ] && echo ok || echo FAIL)" 0 "$n tests listed"
  done
  out=$("${RUN[@]}" "${LAUNCH[@]}" "$WORK/bin/moelab" bench --device cuda --only gpu-dense 2>&1)
  rc=$?
  record "start moelab" "$([ $rc = 2 ] && echo ok || echo "FAIL($rc)")" 0 "bench --device cuda: exit $rc: ${out:0:120}"
fi

# ---- The plan ---------------------------------------------------------------------------------
BENCH_SHAPES=(gpu-dense gpu-moe gpu-dense-muonclip)
BENCH_ARGS=(--steps 5 --warmup 2)
# Every opt-in path together on both shapes first (what making them the defaults would give),
# then each alone on the shape it speeds up (which of them gives what).
OPT_IN_DEFAULT="MOELAB_FLASH_KERNEL=mma MOELAB_FLASH_ROPE=fused MOELAB_FFN=fused MOELAB_MOE_EXPERTS=chunked MOELAB_MOE_DISPATCH=sort MOELAB_ATTENTION_ACTS=bf16"
ALL=${OPT_IN_DEFAULT// /,}
# All together right after the default shapes; each alone after the PyTorch peer, so that the
# peer's rows (the targets are ratios to them) come before the budget can run out.
COMPARE_DEFAULT="$ALL@gpu-dense $ALL@gpu-moe"
LATER_DEFAULT="MOELAB_FLASH_KERNEL=mma MOELAB_FFN=fused"
LATER_DEFAULT+=" MOELAB_FLASH_KERNEL=mma,MOELAB_FLASH_ROPE=fused MOELAB_ATTENTION_ACTS=bf16"
LATER_DEFAULT+=" MOELAB_MOE_EXPERTS=chunked@gpu-moe"
LATER_DEFAULT+=" MOELAB_MOE_DISPATCH=sort@gpu-moe MOELAB_MOE_EXPERTS=cudnn@gpu-moe"
read -ra OPT_IN <<<"${MOELAB_GPU_OPT_IN-$OPT_IN_DEFAULT}"
read -ra COMPARE <<<"${MOELAB_GPU_COMPARE-$COMPARE_DEFAULT}"
read -ra LATER <<<"${MOELAB_GPU_COMPARE_LATER-$LATER_DEFAULT}"
# torch.compile takes the rest of the budget, or 180 s when comparisons follow it.
COMPILE_LIMIT=600
((${#LATER[@]})) && COMPILE_LIMIT=180
# compare_shape WORD: the bench shape of a MOELAB_GPU_COMPARE word VAR=value[@shape].
compare_shape() { if [[ $1 == *@* ]]; then echo "${1##*@}"; else echo gpu-dense; fi; }
{
  echo "== plan (budget ${BUDGET}s, stages: $STAGES)"
  for t in "${TESTS[@]}"; do echo "  tests    $(basename "$t") --gtest_output=xml  (limit $([[ $t == *kernels* ]] && echo 60 || echo 120)s)"; done
  ((${#OPT_IN[@]})) && echo "  tests    every test binary again with ${OPT_IN[*]}"
  echo "  bench    moelab bench --device cuda --plan  (limit 20s)"
  for s in "${BENCH_SHAPES[@]}"; do echo "  bench    moelab bench --device cuda --only $s ${BENCH_ARGS[*]}  (limit 75s)"; done
  for cmp in "${COMPARE[@]}"; do
    echo "  bench    ${cmp%@*} moelab bench --device cuda --only $(compare_shape "$cmp") ${BENCH_ARGS[*]}  (limit 75s)" | tr , ' '
  done
  echo "  peer     $PY torch_peer.py --mode eager --steps 5 --warmup 2  (limit 90s)"
  echo "  compile  $PY torch_peer.py --mode compile --steps 5 --warmup 2  (limit ${COMPILE_LIMIT}s or the rest of the budget)"
  for cmp in "${LATER[@]}"; do
    echo "  bench    ${cmp%@*} moelab bench --device cuda --only $(compare_shape "$cmp") ${BENCH_ARGS[*]}  (limit 75s)" | tr , ' '
  done
} | tee -a "$ENVLOG" >&2
if ((DRY)); then finish 0; fi

# ---- Stage 2: CUDA tests ------------------------------------------------------------------------
TESTLOG=$OUTD/tests.log
# list_tests BINARY: every test's full name.
list_tests() {
  "${RUN[@]}" "${LAUNCH[@]}" "$1" --gtest_list_tests 2>/dev/null |
    awk '/^[^ ]/ {suite = $1; next} /^  [^ ]/ {print suite $1}'
}
# Tests to rerun one per process (isolate, after the peer): the failed ones and, after a crash
# or a time-out, those that never finished. A sticky CUDA error (a faulting kernel) fails every
# later test of its process; alone, each test says whether it fails by itself.
declare -A REDO=()
# summarise_tests SEGMENT: sets `failed` (the failed tests' names) and `detail` (the counts).
summarise_tests() {
  local run ok skipped nogpu
  run=$(grep -c '^\[ RUN      \]' <<<"$1")
  ok=$(grep -c '^\[       OK \]' <<<"$1")
  failed=$(grep '^\[  FAILED  \] [A-Za-z]' <<<"$1" | grep -v ' tests\?, listed below' | awk '{print $4}' | sort -u)
  skipped=$(grep '^\[  SKIPPED \] [A-Za-z]' <<<"$1" | awk '{print $4}' | sort -u | grep -c .)
  nogpu=$(grep -c 'no CUDA device' <<<"$1")
  detail="$run run, $ok passed, $(grep -c . <<<"$failed") failed, $skipped skipped"
  ((nogpu)) && detail="$detail; $nogpu lines say 'no CUDA device': THE GPU WAS NOT USED"
  [ -n "$failed" ] && detail="$detail; failed: $(tr '\n' ' ' <<<"$failed" | head -c 400)"
}
if want tests; then
  mkdir -p "$WORK/xml"
  for t in "${TESTS[@]}"; do
    name=$(basename "$t")
    limit=120
    [[ $name == *kernels* ]] && limit=60
    stage "test $name" $limit "$TESTLOG" "${RUN[@]}" "${LAUNCH[@]}" "$t" \
      --gtest_output="xml:$WORK/xml/$name.xml" --gtest_color=no
    [ $STAGE_RC = 125 ] && continue
    seg=$(segment "test $name" "$TESTLOG")
    summarise_tests "$seg"
    if ((STAGE_RC != 0 && STAGE_RC != 1)); then
      detail="$detail; last started: $(grep '^\[ RUN      \]' <<<"$seg" | tail -1 | awk '{print $4}')"
      finished=$(grep -E '^\[ +(OK|SKIPPED|FAILED) +\] [A-Za-z]' <<<"$seg" | awk '{print $4}' | sort -u)
      failed=$(printf '%s\n%s\n' "$failed" "$(comm -23 <(list_tests "$t" | sort -u) <(echo "$finished"))")
    fi
    REDO[$t]=$(grep . <<<"$failed" | sort -u | head -40)
    record "test $name" "$(status_of $STAGE_RC)" "$STAGE_S" "$detail"
  done
  (cd "$WORK" && tar -cf "$OUTD/tests-xml.tar" xml) 2>/dev/null
  # The opt-in GPU paths that have not yet run on a GPU (docs/cuda.md): every test binary once
  # more with them switched on. MOELAB_GPU_OPT_IN: VAR=value words ("" for none).
  if ((${#OPT_IN[@]})); then
    for t in "${TESTS[@]}"; do
      name="test $(basename "$t") [${OPT_IN[*]}]"
      limit=120
      [[ $t == *kernels* ]] && limit=60
      stage "$name" $limit "$TESTLOG" "${RUN[@]}" "${OPT_IN[@]}" "${LAUNCH[@]}" "$t" --gtest_color=no
      [ $STAGE_RC = 125 ] && continue
      summarise_tests "$(segment "$name" "$TESTLOG")"
      record "$name" "$(status_of $STAGE_RC)" "$STAGE_S" "$detail"
    done
  fi
fi

# ---- Stage 3: bench, one shape per process -----------------------------------------------------
BENCHLOG=$OUTD/bench.log
# compare WORD...: a shape again under other settings, for an in-model comparison in the same
# lease: each word (MOELAB_GPU_COMPARE, then MOELAB_GPU_COMPARE_LATER after the peer) is
# VAR=value[,VAR=value...][@shape] (shape default gpu-dense); default: the opt-in paths not yet
# run on a GPU, all together, then each alone, against the default runs. "" for none.
compare() {
  local cmp setting shape name row
  local -a settings
  for cmp in "$@"; do
    setting=${cmp%@*} shape=$(compare_shape "$cmp")
    IFS=, read -ra settings <<<"$setting"
    name="bench $shape [${settings[*]}]"
    stage "$name" 75 "$BENCHLOG" "${RUN[@]}" "${settings[@]}" "${LAUNCH[@]}" "$WORK/bin/moelab" \
      bench --device cuda --only "$shape" "${BENCH_ARGS[@]}"
    [ $STAGE_RC = 125 ] && continue
    row=$(segment "$name" "$BENCHLOG" | grep -E "^$shape " | tail -1 | tr -s ' ')
    record "$name" "$(status_of $STAGE_RC)" "$STAGE_S" \
      "${row:-no result row: $(last_words "$name" "$BENCHLOG")}"
  done
}
if want bench; then
  stage "bench --plan" 20 "$BENCHLOG" "${RUN[@]}" "${LAUNCH[@]}" "$WORK/bin/moelab" bench --device cuda --plan
  if [ $STAGE_RC != 125 ]; then
    plan=$(segment "bench --plan" "$BENCHLOG" | awk '/unsplit/ {n = $1} /runs at:/ {sub(/^ */, "");
      printf "%s %s; ", n, $0}' | tr -s ' ' | head -c 600)
    record "bench --plan" "$(status_of $STAGE_RC)" "$STAGE_S" \
      "${plan:-$(last_words "bench --plan" "$BENCHLOG")}"
  fi
  for s in "${BENCH_SHAPES[@]}"; do
    limit=75
    stage "bench $s" $limit "$BENCHLOG" "${RUN[@]}" "${LAUNCH[@]}" "$WORK/bin/moelab" bench --device cuda \
      --only "$s" "${BENCH_ARGS[@]}"
    [ $STAGE_RC = 125 ] && continue
    row=$(segment "bench $s" "$BENCHLOG" | grep -E "^$s " | tail -1 | tr -s ' ')
    gemm=$(segment "bench $s" "$BENCHLOG" | grep -o 'GEMM [0-9]*^3: [0-9.]* TFLOP/s' | tail -1)
    record "bench $s" "$(status_of $STAGE_RC)" "$STAGE_S" \
      "${row:-no result row: $(last_words "bench $s" "$BENCHLOG")}${gemm:+ | $gemm}"
  done
  compare "${COMPARE[@]}"
fi

# ---- Stages 4 and 5: the PyTorch peer, eager then torch.compile ------------------------------
PEERLOG=$OUTD/peer.log
peer() {  # MODE LIMIT
  stage "peer $1" "$2" "$PEERLOG" env PYTHONUNBUFFERED=1 "$PY" "$PACK/torch_peer.py" --mode "$1" \
    --steps 5 --warmup 2
  [ $STAGE_RC = 125 ] && return
  local rows
  rows=$(segment "peer $1" "$PEERLOG" | grep -E '^(gpu-|torch )' | tr -s ' ' | paste -sd'|' |
    head -c 500)
  record "peer $1" "$(status_of $STAGE_RC)" "$STAGE_S" \
    "${rows:-no result: $(last_words "peer $1" "$PEERLOG")}"
}
isolate() {
  local t name tn rc n pass t0
  local -a still
  for t in "${TESTS[@]}"; do
    [ -n "${REDO[$t]:-}" ] || continue
    name=$(basename "$t") n=0 pass=0 t0=$SECONDS still=()
    while read -r tn; do
      if (($(left) < 20 || SECONDS - t0 > 60)); then
        still+=("$tn(not rerun: no time)")
        continue
      fi
      n=$((n + 1))
      echo "=== alone $tn" >>"$TESTLOG"
      timeout -k 5 20 "${RUN[@]}" "${LAUNCH[@]}" "$t" --gtest_filter="$tn" --gtest_color=no \
        >>"$TESTLOG" 2>&1
      rc=$?
      echo "=== alone $tn: exit $rc" >>"$TESTLOG"
      if ((rc == 0)); then pass=$((pass + 1)); else still+=("$tn($(status_of $rc))"); fi
    done <<<"${REDO[$t]}"
    if ((n == 0)); then
      record "alone $name" SKIP 0 "no time left to rerun ${#still[@]} tests one per process"
    else
      record "alone $name" "$([ ${#still[@]} = 0 ] && echo ok || echo FAIL)" $((SECONDS - t0)) \
        "$pass of $n pass when run alone; still failing: ${still[*]:-none}"
    fi
  done
}

want peer && peer eager 90
want tests && isolate
want compile && peer compile "$COMPILE_LIMIT"
want bench && compare "${LATER[@]}"

finish 0
