#!/usr/bin/env bash
# The GPU check as it runs on the lent machine: scripts/gpu-check.sh copies this file to
# .gpu/run.sh beside payload.tar.xz (the binaries and the Debian libraries they need) and
# torch_peer.py. docs/cuda.md says how to run it. In the repo root of the device's copy:
#
#   .gpu/run.sh                 every stage (about 7 minutes at most: MOELAB_GPU_BUDGET_S=420)
#   .gpu/run.sh --dry-run       unpack, resolve and check libraries, print the plan; run nothing
#                               on a GPU (scripts/gpu-check.sh --dry-run runs it here)
#
# Stages, each under its own `timeout` and all inside the global budget, in this order:
#   env      nvidia-smi + env + the ldd check, which stops everything at once when a library is
#            missing (cuDNN is loaded at run time: its absence fails only the cuDNN choice);
#   tests    each CUDA test binary without its opt-in groups' tests (default kernels);
#   groups   each opt-in switch group of .gpu/groups.txt (scripts/gpu-check-groups.txt) in its
#            own process (a gtest filter), so a faulting opt-in kernel cannot fail other tests;
#            then every failed (or, after a crash, unfinished) test again alone, one per
#            process, reported by name with its group;
#   bench    `moelab bench --device cuda --plan`, one bench shape per process, then a shape again
#            per MOELAB_GPU_COMPARE word (train.kernels choices key=value[,key=value...][@shape],
#            passed as --kernels); every row carries its first and last loss, and a row whose loss
#            is NaN or more than 0.05 nats from the default row's is flagged LOSS;
#   peer     the PyTorch peer, eager, then (compile) under torch.compile: skipped when its rows
#            for this card exist (bench/peers/rows/<card>.txt; MOELAB_GPU_PEER=always runs it);
#   compare  the MOELAB_GPU_COMPARE_LATER words (each opt-in choice alone).
# MOELAB_GPU_STAGES (default env,tests,groups,bench,peer,compile,compare) picks a subset. Every
# stage appends its line to $OUT/summary.txt the moment it ends, and the logs grow in $OUT as they
# are written, so a time-out loses nothing already measured. Files in $OUT (the device tool
# returns at most 8): summary.txt, env.txt, tests.log, tests-xml.tar, bench.log, peer.log. The
# summary table is printed last.
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
STAGES=${MOELAB_GPU_STAGES:-env,tests,groups,bench,peer,compile,compare}
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
  # train.kernels.experts "cudnn" needs cuDNN 9.18 or later (loaded at run time): the wheel's
  # version, by its dist-info.
  wheel=$(cd "$VENV" 2>/dev/null && ls -d lib/python*/site-packages/nvidia_cudnn*.dist-info 2>/dev/null)
  echo "== cuDNN wheel: ${wheel:-no nvidia_cudnn*.dist-info in the venv}"
  # The attention kernels' SASS, disassembled where the payload was built (scripts/gpu-check.sh).
  sed -n '/^attention SASS/,$p' "$PACK/manifest.txt" 2>/dev/null
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
LOSS_TOLERANCE=0.05  # nats between a compare row's last loss and its shape's default row's
# Every opt-in choice together on both shapes first (what making them the defaults would give),
# then each alone on the shape it speeds up (which of them gives what). Words:
# key=value[,key=value...][@shape] of train.kernels (docs/cuda.md, Kernel choices).
ALL=attention_kernel=mma,rope=fused,ffn=fused,experts=chunked,dispatch=sort,attention_acts=bf16
COMPARE_DEFAULT="$ALL@gpu-dense $ALL@gpu-moe"
LATER_DEFAULT="attention_kernel=mma ffn=fused attention_kernel=mma,rope=fused attention_acts=bf16"
LATER_DEFAULT+=" experts=chunked@gpu-moe dispatch=sort@gpu-moe experts=cudnn@gpu-moe"
LATER_DEFAULT+=" experts=device@gpu-moe"  # the device-shaped grouped GEMM (issue 34, item 3)
read -ra COMPARE <<<"${MOELAB_GPU_COMPARE-$COMPARE_DEFAULT}"
read -ra LATER <<<"${MOELAB_GPU_COMPARE_LATER-$LATER_DEFAULT}"
# The opt-in switch groups: "group binary filter" lines (# comments), each one process.
GROUP_LINES=()
if [ -f "$PACK/groups.txt" ]; then
  while read -r g b f; do
    [[ -z $g || $g == \#* ]] && continue
    GROUP_LINES+=("$g $b $f")
  done <"$PACK/groups.txt"
fi
# default_filter BINARY: a negative gtest filter leaving out the binary's groups' tests.
default_filter() {
  local line g b f out=""
  for line in "${GROUP_LINES[@]}"; do
    read -r g b f <<<"$line"
    [ "$b" = "$1" ] && out+="${out:+:}$f"
  done
  [ -n "$out" ] && echo "--gtest_filter=-$out"
}
# The peer's rows for this card, when a lease has measured them (then the peer is not rerun).
CARD=${MOELAB_GPU_CARD:-}
if [ -z "$CARD" ] && ((!DRY)); then
  CARD=$(timeout 10 nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
fi
CARD_SLUG=$(tr 'A-Z' 'a-z' <<<"${CARD:-unknown}" | tr -cs 'a-z0-9' '-' | sed 's/^-*//; s/-*$//')
PEER_ROWS=${MOELAB_GPU_PEER_ROWS:-$REPO/bench/peers/rows}/$CARD_SLUG.txt
PEER_KNOWN=0
[ -f "$PEER_ROWS" ] && [ "${MOELAB_GPU_PEER:-}" != always ] && PEER_KNOWN=1
# torch.compile takes the rest of the budget, or 180 s when comparisons follow it.
COMPILE_LIMIT=600
((${#LATER[@]})) && COMPILE_LIMIT=180
# compare_shape WORD: the bench shape of a compare word key=value[@shape].
compare_shape() { if [[ $1 == *@* ]]; then echo "${1##*@}"; else echo gpu-dense; fi; }
{
  echo "== plan (budget ${BUDGET}s, stages: $STAGES)"
  for t in "${TESTS[@]}"; do
    echo "  tests    $(basename "$t") $(default_filter "$(basename "$t")") --gtest_output=xml  (limit $([[ $t == *kernels* ]] && echo 60 || echo 120)s)"
  done
  for line in "${GROUP_LINES[@]}"; do
    read -r g b f <<<"$line"
    echo "  groups   [$g] $b --gtest_filter=$f  (limit 60s)"
  done
  echo "  groups   then every failed test alone, one per process (limit 20s each, 60s per process)"
  echo "  bench    moelab bench --device cuda --plan  (limit 20s)"
  for s in "${BENCH_SHAPES[@]}"; do echo "  bench    moelab bench --device cuda --only $s ${BENCH_ARGS[*]}  (limit 75s)"; done
  for cmp in "${COMPARE[@]}"; do
    echo "  bench    moelab bench --device cuda --only $(compare_shape "$cmp") ${BENCH_ARGS[*]} --kernels ${cmp%@*}  (limit 75s; loss within ${LOSS_TOLERANCE} of the default row)"
  done
  if ((PEER_KNOWN)); then
    echo "  peer     skipped: the peer's rows for ${CARD} are in $PEER_ROWS"
  else
    echo "  peer     $PY torch_peer.py --mode eager --steps 5 --warmup 2  (limit 90s; card ${CARD:-unknown}: no $PEER_ROWS)"
    echo "  compile  $PY torch_peer.py --mode compile --steps 5 --warmup 2  (limit ${COMPILE_LIMIT}s or the rest of the budget)"
  fi
  for cmp in "${LATER[@]}"; do
    echo "  compare  moelab bench --device cuda --only $(compare_shape "$cmp") ${BENCH_ARGS[*]} --kernels ${cmp%@*}  (limit 75s)"
  done
} | tee -a "$ENVLOG" >&2
if ((DRY)); then
  # Each group's filter must name tests of its binary (a typo would silently test nothing).
  for line in "${GROUP_LINES[@]}"; do
    read -r g b f <<<"$line"
    n=0
    [ -x "$WORK/bin/$b" ] &&
      n=$("${RUN[@]}" "${LAUNCH[@]}" "$WORK/bin/$b" --gtest_list_tests --gtest_filter="$f" 2>>"$ENVLOG" | grep -c '^  ')
    record "group [$g] $b" "$([ "$n" -gt 0 ] && echo ok || echo FAIL)" 0 "$n tests listed"
  done
  # A dry run that found a problem says so in its exit status too.
  printf '%s\n' "${ROWS[@]}" | grep -qE ' FAIL(\([0-9]+\))? ' && finish 1
  finish 0
fi

# ---- Stage 2: CUDA tests ------------------------------------------------------------------------
TESTLOG=$OUTD/tests.log
# Tests to rerun one per process: the failed ones and, after a crash or a time-out, those that
# never finished, keyed by "binary|group" (group "default" for the default pass). A sticky CUDA
# error (a faulting kernel) fails every later test of its process; alone, each test says whether
# it fails by itself.
declare -A REDO=()
REDO_KEYS=()
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
# test_process NAME LIMIT BINARY GROUP FILTER-ARGS...: one test process as a stage, its summary
# line, and its failures (after a crash, its unfinished tests too) queued to rerun alone.
test_process() {
  local name=$1 limit=$2 t=$3 group=$4 seg finished
  shift 4
  local bin
  bin=$(basename "$t")
  stage "$name" "$limit" "$TESTLOG" "${RUN[@]}" "${LAUNCH[@]}" "$t" "$@" \
    --gtest_output="xml:$WORK/xml/$bin-${group//[^A-Za-z0-9_]/_}.xml" --gtest_color=no
  [ $STAGE_RC = 125 ] && return
  seg=$(segment "$name" "$TESTLOG")
  summarise_tests "$seg"
  if ((STAGE_RC != 0 && STAGE_RC != 1)); then
    detail="$detail; last started: $(grep '^\[ RUN      \]' <<<"$seg" | tail -1 | awk '{print $4}')"
    finished=$(grep -E '^\[ +(OK|SKIPPED|FAILED) +\] [A-Za-z]' <<<"$seg" | awk '{print $4}' | sort -u)
    failed=$(printf '%s\n%s\n' "$failed" \
      "$(comm -23 <(list_tests "$t" "$@" | sort -u) <(echo "$finished"))")
  fi
  failed=$(grep . <<<"$failed" | sort -u | head -40)
  if [ -n "$failed" ]; then
    REDO["$t|$group"]=$failed
    REDO_KEYS+=("$t|$group")
  fi
  record "$name" "$(status_of $STAGE_RC)" "$STAGE_S" "$detail"
}
# list_tests BINARY [FILTER-ARGS...]: every test's full name (under the filter).
list_tests() {
  "${RUN[@]}" "${LAUNCH[@]}" "$1" --gtest_list_tests "${@:2}" 2>/dev/null |
    awk '/^[^ ]/ {suite = $1; next} /^  [^ ]/ {print suite $1}'
}
# isolate: each queued test again alone, one process each (60 s per binary and group at most),
# reported by name with its group.
isolate() {
  local key t group name tn rc n pass t0
  local -a still
  for key in "${REDO_KEYS[@]}"; do
    t=${key%%|*} group=${key#*|}
    name="alone $(basename "$t")$([ "$group" = default ] || echo " [$group]")"
    n=0 pass=0 t0=$SECONDS still=()
    while read -r tn; do
      if (($(left) < 20 || SECONDS - t0 > 60)); then
        still+=("$tn(not rerun: no time)")
        continue
      fi
      n=$((n + 1))
      echo "=== alone $tn [$group]" >>"$TESTLOG"
      timeout -k 5 20 "${RUN[@]}" "${LAUNCH[@]}" "$t" --gtest_filter="$tn" --gtest_color=no \
        >>"$TESTLOG" 2>&1
      rc=$?
      echo "=== alone $tn [$group]: exit $rc" >>"$TESTLOG"
      if ((rc == 0)); then pass=$((pass + 1)); else still+=("$tn($(status_of $rc))"); fi
    done <<<"${REDO[$key]}"
    if ((n == 0)); then
      record "$name" SKIP 0 "no time left to rerun ${#still[@]} tests one per process"
    else
      record "$name" "$([ ${#still[@]} = 0 ] && echo ok || echo FAIL)" $((SECONDS - t0)) \
        "$pass of $n pass when run alone; still failing: ${still[*]:-none}"
    fi
  done
}
mkdir -p "$WORK/xml"
if want tests; then
  for t in "${TESTS[@]}"; do
    limit=120
    [[ $t == *kernels* ]] && limit=60
    read -ra filter <<<"$(default_filter "$(basename "$t")")"
    test_process "test $(basename "$t")" $limit "$t" default "${filter[@]}"
  done
fi
if want groups; then
  for line in "${GROUP_LINES[@]}"; do
    read -r g b f <<<"$line"
    if [ ! -x "$WORK/bin/$b" ]; then
      record "group [$g] $b" FAIL 0 "no binary $b in the payload"
      continue
    fi
    test_process "group [$g] $b" 60 "$WORK/bin/$b" "$g" --gtest_filter="$f"
  done
fi
(cd "$WORK" && tar -cf "$OUTD/tests-xml.tar" xml) 2>/dev/null
{ want tests || want groups; } && isolate

# ---- Stage 3: bench, one shape per process -----------------------------------------------------
BENCHLOG=$OUTD/bench.log
declare -A DEFAULT_LOSS=()  # shape -> the default row's last loss
# row_losses ROW: "first last" (the row's last two fields: bench --device cuda's loss columns).
row_losses() { awk '{print $(NF-1), $NF}' <<<"$1"; }
# loss_verdict SHAPE ROW: "" when the row's losses are finite and its last loss is within
# LOSS_TOLERANCE of the shape's default row (when that ran), else why not.
loss_verdict() {
  local first last ref
  read -r first last <<<"$(row_losses "$2")"
  if [[ $first == NaN || $last == NaN ]]; then
    echo "loss NaN (first $first, last $last)"
    return
  fi
  ref=${DEFAULT_LOSS[$1]:-}
  [ -z "$ref" ] && return
  awk -v a="$last" -v b="$ref" -v tol="$LOSS_TOLERANCE" 'BEGIN {
    d = a - b; if (d < 0) d = -d
    if (a != a + 0 || d > tol) printf "last loss %s is %.4f nats from the default row'"'"'s %s", a, d, b }'
}
# compare WORD...: a shape again on other kernels (train.kernels, --kernels), for an in-model
# comparison in the same lease: each word is key=value[,key=value...][@shape] (shape default
# gpu-dense). "" for none. The row's loss must match the default row's (loss_verdict).
compare() {
  local cmp setting shape name row why
  for cmp in "$@"; do
    setting=${cmp%@*} shape=$(compare_shape "$cmp")
    name="bench $shape [$setting]"
    stage "$name" 75 "$BENCHLOG" "${RUN[@]}" "${LAUNCH[@]}" "$WORK/bin/moelab" \
      bench --device cuda --only "$shape" "${BENCH_ARGS[@]}" --kernels "$setting"
    [ $STAGE_RC = 125 ] && continue
    row=$(segment "$name" "$BENCHLOG" | grep -E "^$shape " | tail -1 | tr -s ' ')
    why=""
    [ -n "$row" ] && ((STAGE_RC == 0)) && why=$(loss_verdict "$shape" "$row")
    record "$name" "$([ -n "$why" ] && echo LOSS || status_of $STAGE_RC)" "$STAGE_S" \
      "${why:+$why | }${row:-no result row: $(last_words "$name" "$BENCHLOG")}"
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
    why=""
    if [ -n "$row" ] && ((STAGE_RC == 0)); then
      why=$(loss_verdict "$s" "$row")
      [ -z "$why" ] && DEFAULT_LOSS[$s]=$(row_losses "$row" | awk '{print $2}')
    fi
    record "bench $s" "$([ -n "$why" ] && echo LOSS || status_of $STAGE_RC)" "$STAGE_S" \
      "${why:+$why | }${row:-no result row: $(last_words "bench $s" "$BENCHLOG")}${gemm:+ | $gemm}"
  done
  compare "${COMPARE[@]}"
fi

# ---- Stages 4 and 5: the PyTorch peer, eager then torch.compile ------------------------------
PEERLOG=$OUTD/peer.log
peer() {  # MODE LIMIT
  if ((PEER_KNOWN)); then
    record "peer $1" SKIP 0 "the peer's rows for $CARD are in ${PEER_ROWS#"$REPO"/} (MOELAB_GPU_PEER=always reruns it)"
    return
  fi
  stage "peer $1" "$2" "$PEERLOG" env PYTHONUNBUFFERED=1 "$PY" "$PACK/torch_peer.py" --mode "$1" \
    --steps 5 --warmup 2
  [ $STAGE_RC = 125 ] && return
  local rows
  rows=$(segment "peer $1" "$PEERLOG" | grep -E '^(gpu-|torch )' | tr -s ' ' | paste -sd'|' |
    head -c 500)
  record "peer $1" "$(status_of $STAGE_RC)" "$STAGE_S" \
    "${rows:-no result: $(last_words "peer $1" "$PEERLOG")}"
}

want peer && peer eager 90
want compile && peer compile "$COMPILE_LIMIT"
want compare && compare "${LATER[@]}"

finish 0
