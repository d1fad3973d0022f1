#!/usr/bin/env bash
# Packs what a GPU session needs to run the CUDA suite without building: the test binaries,
# `moelab`, and the shared libraries they load that the device image lacks (Debian's openblas,
# sqlite, sentencepiece, gtest, fmt, ceres, ...), into .gpu/ with a run.sh. The device image has
# a CUDA toolkit and PyTorch but not Debian's libraries.
#
#   tests/cuda_kernels/package_for_device.sh [build-dir]      (default: build)
#
# Then, in a GPU session: run tool with carry [".gpu"] and command ".gpu/run.sh" (it writes
# its logs to $OUT when set). The whole folder must stay under 64 MiB (the carry limit).
#
# Not copied: the CUDA libraries (libcudart, libcublas, libcublasLt are ~600 MiB): run.sh finds
# them on the device (its CUDA toolkit, or the nvidia-* wheels next to PyTorch). They must be
# major version 13, the toolkit these binaries were linked against.
# glibc is copied together with its loader: run.sh starts the binaries through the bundled
# ld-linux when the device's own glibc is older than this machine's.
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${1:-build}
OUT_DIR=.gpu
BINS=()
for b in cuda_kernels_test moelab; do
  [ -x "$BUILD/bin/$b" ] && BINS+=("$BUILD/bin/$b")
done
# Any other test binary that links the CUDA kernels (e.g. a device model test).
for b in "$BUILD"/bin/*_test; do
  case " ${BINS[*]} " in *" $b "*) continue ;; esac
  if ldd "$b" 2>/dev/null | grep -q 'libcublas'; then BINS+=("$b"); fi
done
if [ ${#BINS[@]} -eq 0 ]; then
  echo "package_for_device: nothing built in $BUILD/bin (build cuda_kernels_test first)" >&2
  exit 1
fi

rm -rf "$OUT_DIR"
mkdir -p "$OUT_DIR/bin" "$OUT_DIR/lib/glibc"
for b in "${BINS[@]}"; do cp "$b" "$OUT_DIR/bin/"; done

# Libraries: everything ldd resolves except the kernel's vdso and the CUDA libraries.
declare -A seen=()
for b in "${BINS[@]}"; do
  while read -r path; do
    [ -n "$path" ] || continue
    name=$(basename "$path")
    case "$name" in
      libcuda.so* | libcudart.so* | libcublas.so* | libcublasLt.so* | libnvidia* ) continue ;;
    esac
    [ -n "${seen[$name]:-}" ] && continue
    seen[$name]=1
    case "$name" in
      # glibc only works with its own loader: kept apart, used only through lib/glibc/ld.so.
      ld-linux* | libc.so* | libm.so* | libpthread.so* | libdl.so* | librt.so* | libresolv.so*)
        cp -L "$path" "$OUT_DIR/lib/glibc/$name" ;;
      *) cp -L "$path" "$OUT_DIR/lib/$name" ;;
    esac
  done < <(ldd "$b" | awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\/.*ld-linux/ {print $1}')
done
# The loader under a fixed name for run.sh.
loader=$(ls "$OUT_DIR"/lib/glibc/ld-linux-*.so.* 2>/dev/null | head -1 || true)
[ -n "$loader" ] && cp "$loader" "$OUT_DIR/lib/glibc/ld.so"
strip --strip-unneeded "$OUT_DIR"/bin/* 2>/dev/null || true

# Data the tests read at run time (small): none for cuda_kernels_test; moelab's demo configs.
mkdir -p "$OUT_DIR/experiments"
if [ -d experiments ]; then
  find experiments -maxdepth 2 -name '*.json' -size -64k -exec cp --parents {} "$OUT_DIR/" \;
fi

# Compressed (openblas alone is 36 MiB raw): bin/, lib/ and experiments/ go into one tar.xz
# that run.sh unpacks on the device.
XZ_OPT=${XZ_OPT:--6 -T2} tar -C "$OUT_DIR" -cJf "$OUT_DIR/payload.tar.xz" bin lib experiments
rm -rf "$OUT_DIR/bin" "$OUT_DIR/lib" "$OUT_DIR/experiments"

cat > "$OUT_DIR/run.sh" <<'RUN'
#!/usr/bin/env bash
# Runs the packed CUDA suite on the device; logs go to $OUT (the run tool's folder) or .gpu/out.
set -uo pipefail
PACK=$(cd "$(dirname "$0")" && pwd)
LOG=${OUT:-$PACK/out}
mkdir -p "$LOG"
HERE=${MOELAB_GPU_DIR:-/tmp/moelab-gpu}
rm -rf "$HERE" && mkdir -p "$HERE" && tar -C "$HERE" -xJf "$PACK/payload.tar.xz" || exit 3
# CUDA 13 libraries: the toolkit first, then PyTorch's nvidia wheels.
CUDA_DIRS=""
for d in /usr/local/cuda/lib64 /usr/local/cuda-13*/lib64 /usr/lib/x86_64-linux-gnu \
         $(python3 -c 'import site,glob;print(" ".join(glob.glob(site.getsitepackages()[0]+"/nvidia/*/lib")))' 2>/dev/null); do
  [ -e "$d/libcublas.so.13" ] || [ -e "$d/libcudart.so.13" ] && CUDA_DIRS="$CUDA_DIRS:$d"
done
export LD_LIBRARY_PATH="$HERE/lib${CUDA_DIRS}:${LD_LIBRARY_PATH:-}"
export MOELAB_BIN_DIR="$HERE/bin"
{
  echo "== device"; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1
  echo "== CUDA library dirs: ${CUDA_DIRS:-none found (need libcublas.so.13)}"
} | tee "$LOG/env.txt"
# Start through the bundled loader when the system one cannot run the binaries (older glibc).
LAUNCH=()
if ! "$HERE/bin/cuda_kernels_test" --gtest_list_tests >/dev/null 2>&1; then
  LAUNCH=("$HERE/lib/glibc/ld.so" --library-path "$HERE/lib/glibc:$LD_LIBRARY_PATH")
  echo "== using the bundled loader" | tee -a "$LOG/env.txt"
fi
status=0
for t in "$HERE"/bin/*_test; do
  name=$(basename "$t")
  echo "== $name" | tee -a "$LOG/summary.txt"
  "${LAUNCH[@]}" "$t" --gtest_output="xml:$LOG/$name.xml" >"$LOG/$name.log" 2>&1 || status=1
  tail -n 30 "$LOG/$name.log" | tee -a "$LOG/summary.txt"
done
if [ -x "$HERE/bin/moelab" ] && "${LAUNCH[@]}" "$HERE/bin/moelab" bench --help 2>/dev/null | grep -q -- --device; then
  echo "== moelab bench --device cuda" | tee -a "$LOG/summary.txt"
  "${LAUNCH[@]}" "$HERE/bin/moelab" bench --device cuda >"$LOG/bench.log" 2>&1 || status=1
  tail -n 40 "$LOG/bench.log" | tee -a "$LOG/summary.txt"
fi
exit $status
RUN
chmod +x "$OUT_DIR/run.sh"

size=$(du -sb "$OUT_DIR" | cut -f1)
echo "package_for_device: ${#BINS[@]} binaries, ${#seen[@]} libraries, $((size / 1024 / 1024)) MiB in $OUT_DIR"
if [ "$size" -ge $((64 * 1024 * 1024)) ]; then
  echo "package_for_device: over the 64 MiB carry limit" >&2
  exit 2
fi
