#!/usr/bin/env bash
# Builds the GPU check's payload here, for one run on a lent GPU machine (docs/cuda.md):
#
#   scripts/gpu-check.sh            build build-gpu/ and pack .gpu/ (git-ignored)
#   scripts/gpu-check.sh --dry-run  the same, then check .gpu/ against a simulated device venv
#                                   and print the size and the planned stages
#   scripts/gpu-check.sh --rehearse the same, then every stage of run.sh here, on that venv (no
#                                   GPU: the GPU tests skip, the bench and the peer exit 2)
#
# Then the device tool: carry [".gpu"], command ".gpu/run.sh" (scripts/gpu-check-device.sh).
#
# The payload: only the GPU binaries (moelab and every cuda_*_test), built portably in build-gpu/
# (MOELAB_NATIVE=OFF: no -march=native; CUDA for sm_90, the lent H100; no MPI, so no NCCL: one
# GPU has nothing to all-reduce with), stripped, plus the Debian libraries they load, which the
# device lacks (openblas, sqlite, sentencepiece, fmt, ceres and its solvers, libgomp,
# libstdc++, ...), compressed with xz. Not carried: the CUDA libraries (cudart, cuBLAS, cuDNN,
# NCCL): the device's PyTorch venv has them in nvidia/{cu13,cudnn,nccl}/lib, where run.sh finds
# them. glibc travels only as a fallback (lib/glibc), used when the device's is older.
#
# Environment: MOELAB_GPU_BUILD_DIR (default build-gpu), MOELAB_GPU_ARCH (default 90),
# MOELAB_GPU_JOBS (default nproc), MOELAB_CMAKE_ARGS (default: ccache launchers when installed).
set -euo pipefail
cd "$(dirname "$0")/.."
MODE=${1:-}
case $MODE in
  "" | --dry-run | --rehearse) ;;
  *) echo "usage: scripts/gpu-check.sh [--dry-run | --rehearse]" >&2 && exit 2 ;;
esac
BUILD=${MOELAB_GPU_BUILD_DIR:-build-gpu}
ARCH=${MOELAB_GPU_ARCH:-90}
PACK=.gpu
LIMIT=$((64 * 1024 * 1024))
say() { echo "gpu-check: $*"; }
die() {
  echo "gpu-check: $*" >&2
  exit 1
}

[ -x /usr/local/cuda/bin/nvcc ] || command -v nvcc >/dev/null || die "no CUDA toolkit (nvcc) here"

# ---- Build -------------------------------------------------------------------------------------
# Reuse objects: through ccache when it is installed (the .cu objects, nvcc's slow part, are the
# same as a native build's: -march=native applies to C++ only), and build/ is never touched.
if [ -z "${MOELAB_CMAKE_ARGS:-}" ] && command -v ccache >/dev/null; then
  MOELAB_CMAKE_ARGS="-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache"
fi
if [ ! -f "$BUILD/CMakeCache.txt" ]; then
  # shellcheck disable=SC2086  # MOELAB_CMAKE_ARGS is a list of flags (ccache launchers)
  cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release ${MOELAB_CMAKE_ARGS:-} -DMOELAB_NATIVE=OFF \
    -DCMAKE_CUDA_ARCHITECTURES="$ARCH" -DMOELAB_WITH_MPI=OFF -DMOELAB_WITH_GUI=OFF \
    -DMOELAB_BUILD_BENCH=OFF -DCMAKE_SKIP_RPATH=ON >/dev/null
fi
grep -q '^MOELAB_NATIVE:BOOL=OFF' "$BUILD/CMakeCache.txt" || die "$BUILD is not a portable build"
# moelab and the CUDA test binaries; not cuda_kernels_emulation_test, the CPU emulation of the
# kernels (it runs in CI; on the device it would only spend the budget).
TARGETS=(moelab)
while read -r t; do TARGETS+=("$t"); done < <(cmake --build "$BUILD" --target help |
  sed -n 's/^\.\.\. \(cuda_[a-z_]*test\)$/\1/p' | grep -v emulation)
((${#TARGETS[@]} > 1)) || die "no cuda_*_test target in $BUILD (was CUDA found?)"
say "building ${TARGETS[*]} in $BUILD (sm_$ARCH, no -march=native)"
cmake --build "$BUILD" -j"${MOELAB_GPU_JOBS:-$(nproc)}" --target "${TARGETS[@]}"
for t in "${TARGETS[@]}"; do  # a binary without the CUDA runtime has nothing to do there
  # (grep without -q: quitting at the first match would end ldd with SIGPIPE, failing pipefail)
  ldd "$BUILD/bin/$t" | grep libcudart >/dev/null || die "$t does not load libcudart: not a GPU binary"
done
if grep -q 'march=native' "$BUILD/compile_commands.json"; then
  die "-march=native in $BUILD/compile_commands.json"
fi

# ---- The attention kernels' SASS ----------------------------------------------------------------
# Disassembled here (no GPU needed; cuobjdump ships with the toolkit): for every fused attention
# kernel (flash_*), its tensor-core instructions (HMMA: the wmma/mma tiles run on the tensor cores)
# and its local memory (register spills: LDL/STL, and -res-usage's LOCAL bytes). Written to
# $BUILD/attention-sass.txt (the whole listing) and the manifest (one line a kernel).
CUOBJDUMP=$(command -v cuobjdump || echo /usr/local/cuda/bin/cuobjdump)
SASS_SUMMARY="not checked: no cuobjdump"
if [ -x "$CUOBJDUMP" ]; then
  "$CUOBJDUMP" -sass "$BUILD/bin/moelab" >"$BUILD/attention-sass.txt.all" 2>/dev/null || true
  "$CUOBJDUMP" -res-usage "$BUILD/bin/moelab" >"$BUILD/attention-res.txt" 2>/dev/null || true
  # Per kernel whose (mangled) name holds "Flash": HMMA and LDL/STL counts, then its LOCAL bytes.
  SASS_SUMMARY=$(awk '
    /Function : / { f = $3; keep = (f ~ /Flash/); if (keep) order[++n] = f; next }
    keep && /HMMA/ { hmma[f]++ }
    keep && /(LDL|STL)/ { spill[f]++ }
    keep { print > "'"$BUILD"'/attention-sass.txt" }
    END { for (i = 1; i <= n; i++) { f = order[i]
            printf "%s HMMA %d LDL/STL %d\n", f, hmma[f], spill[f] } }' "$BUILD/attention-sass.txt.all")
  rm -f "$BUILD/attention-sass.txt.all"
  local_bytes() {  # the LOCAL bytes -res-usage gives a kernel
    awk -v f="$1" 'index($0, f) { getline; if (match($0, /LOCAL:[0-9]+/)) print substr($0, RSTART + 6, RLENGTH - 6); exit }' \
      "$BUILD/attention-res.txt"
  }
  SASS_REPORT=""
  bad=0 kernels=0
  while read -r f _ h _ sp; do
    [ -n "$f" ] || continue
    kernels=$((kernels + 1))
    lb=$(local_bytes "$f")
    verdict=ok
    if [ "${h:-0}" = 0 ] || [ "${sp:-0}" != 0 ] || [ "${lb:-0}" != 0 ]; then verdict=CHECK bad=$((bad + 1)); fi
    SASS_REPORT+="  $verdict $(c++filt "$f" | cut -c1-90): HMMA $h, LDL/STL $sp, local ${lb:-?} bytes"$'\n'
  done <<<"$SASS_SUMMARY"
  SASS_SUMMARY="$kernels flash kernels, $bad without HMMA or with local memory"$'\n'"$SASS_REPORT"
  ((kernels > 0)) || SASS_SUMMARY="no flash kernel found in the SASS of $BUILD/bin/moelab"
fi
say "attention SASS: $(head -1 <<<"$SASS_SUMMARY")"

# ---- Pack --------------------------------------------------------------------------------------
rm -rf "$PACK"
STAGE=$(mktemp -d)
trap 'rm -rf "$STAGE"' EXIT
mkdir -p "$STAGE/bin" "$STAGE/lib/glibc"
for t in "${TARGETS[@]}"; do
  cp "$BUILD/bin/$t" "$STAGE/bin/"
  strip --strip-unneeded "$STAGE/bin/$t"
done
# AVX-512 (zmm registers) in our own code would stop a host without it on an illegal
# instruction. (Debian's openblas picks its kernels at run time: not counted.)
ZMM=""
for t in "${TARGETS[@]}"; do
  n=$(objdump -d --no-show-raw-insn "$STAGE/bin/$t" | grep -c zmm || true)
  ZMM="$ZMM $t=$n"
  [ "$n" = 0 ] || die "$t has $n AVX-512 (zmm) instructions: not a portable build"
done
# Libraries: what ldd resolves, minus the kernel's vdso, the driver and everything the CUDA
# toolkit provides (the venv has those), with glibc set apart.
declare -A seen=()
CUDA_FROM_VENV=()
for t in "${TARGETS[@]}"; do
  while read -r name path; do
    [ -n "${seen[$name]:-}" ] && continue
    seen[$name]=1
    real=$(readlink -f "$path")
    case "$name:$real" in
      libcuda.so* | libnvidia*) ;;
      *:/usr/local/cuda*) CUDA_FROM_VENV+=("$name") ;;
      ld-linux* | libc.so* | libm.so* | libpthread.so* | libdl.so* | librt.so* | libresolv.so*)
        cp -L "$path" "$STAGE/lib/glibc/$name" ;;
      *) cp -L "$path" "$STAGE/lib/$name" ;;
    esac
  done < <(ldd "$BUILD/bin/$t" | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}
                                       $1 ~ /^\/.*ld-linux/ {n = $1; sub(/.*\//, "", n); print n, $1}')
done
loader=$(find "$STAGE/lib/glibc" -name 'ld-linux*' | head -1)
[ -n "$loader" ] && cp "$loader" "$STAGE/lib/glibc/ld.so"
chmod -R u+w "$STAGE/lib"
strip --strip-unneeded "$STAGE"/lib/*.so* 2>/dev/null || true
COMMIT="$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- . ':!.gpu' || echo '+changes') built $(date -u +%FT%TZ)"
echo "$COMMIT" >"$STAGE/commit"
mkdir -p "$PACK"
XZ_OPT=${XZ_OPT:--6 -T2} tar -C "$STAGE" -cJf "$PACK/payload.tar.xz" bin lib commit
cp scripts/gpu-check-device.sh "$PACK/run.sh"
cp scripts/gpu-check-groups.txt "$PACK/groups.txt"
cp bench/peers/torch_peer.py "$PACK/torch_peer.py"
chmod +x "$PACK/run.sh"
{
  echo "commit: $COMMIT"
  echo "binaries (stripped bytes):"
  for t in "${TARGETS[@]}"; do echo "  $t $(stat -c %s "$STAGE/bin/$t")"; done
  echo "AVX-512 (zmm) instructions:$ZMM"
  echo "libraries carried: $(find "$STAGE/lib" -maxdepth 1 -name '*.so*' -printf '%f ' | sort)"
  echo "glibc fallback: $(find "$STAGE/lib/glibc" -name '*.so*' -printf '%f ')"
  echo "from the device venv: ${CUDA_FROM_VENV[*]}"
  echo "unpacked: $(du -sb "$STAGE" | cut -f1) bytes"
  echo "attention SASS (HMMA present, no local memory): $SASS_SUMMARY"
} >"$PACK/manifest.txt"
cat "$PACK/manifest.txt"

size=$(du -sb "$PACK" | cut -f1)
tree=$(git ls-files -z | du --files0-from=- -cb 2>/dev/null | tail -1 | cut -f1)
say "payload $PACK: $((size / 1024 / 1024)) MiB ($size bytes); tracked files $((tree / 1024 / 1024)) MiB; \
together $(((size + tree) / 1024 / 1024)) MiB of the 64 MiB that travel"
((size + tree < LIMIT)) || die "over the 64 MiB that can travel"

if [ -n "$MODE" ]; then
  # A device venv as the wheels lay it out (the RECORDs of this machine's CUDA wheels, whose
  # files /usr/local/cuda/lib holds): nvidia/cu13/lib, nvidia/cudnn/lib, nvidia/nccl/lib.
  SIM=$(mktemp -d)
  trap 'rm -rf "$STAGE" "$SIM"' EXIT
  site=$SIM/lib/python3.12/site-packages
  for rec in /usr/local/cuda/dist-info/*/RECORD; do
    while IFS=, read -r rel _; do
      src=/usr/local/cuda/lib/$(basename "$rel")
      [ -e "$src" ] || continue
      mkdir -p "$site/$(dirname "$rel")"
      ln -sf "$src" "$site/$rel"
    done < <(grep -E '^nvidia/[^/]+/lib/[^/]+\.so' "$rec")
  done
  mkdir -p "$SIM/bin"
  ln -s "$(command -v python3)" "$SIM/bin/python"
  say "simulated venv: $(cd "$site" && find nvidia -maxdepth 2 -name lib | sort | tr '\n' ' ')"
  python3 -m py_compile "$PACK/torch_peer.py" && say "torch_peer.py compiles"
  rm -rf "$PACK/__pycache__"
  # run.sh itself, in its dry-run mode, on that layout; LD_LIBRARY_PATH cleared so nothing of
  # this machine's own setup helps it.
  if [ "$MODE" = --rehearse ]; then
    mkdir -p "$BUILD/rehearsal"
    say "rehearsal: run.sh's files go to $BUILD/rehearsal"
  fi
  env -u LD_LIBRARY_PATH MOELAB_GPU_VENV="$SIM" MOELAB_GPU_STRICT=1 MOELAB_GPU_DIR="$SIM/unpacked" \
    OUT="$([ "$MODE" = --rehearse ] && echo "$BUILD/rehearsal" || echo "$SIM/out")" \
    "$PACK/run.sh" "$([ "$MODE" = --dry-run ] && echo --dry-run)"
fi
say "ready: device tool with carry [\".gpu\"] and command \".gpu/run.sh\""
