#!/usr/bin/env bash
# Lines of code per source folder and the largest files (tinygrad-style), with a soft cap:
# files over MOELAB_LINE_CAP lines (default 800) are listed as warnings, never failures.
# Usage: scripts/line-count.sh [top N files, default 15]
set -euo pipefail
cd "$(dirname "$0")/.."
cap=${MOELAB_LINE_CAP:-800}
top=${1:-15}
files=$(git ls-files '*.cc' '*.h' '*.cu' '*.cuh' '*.cpp' '*.hpp' 2>/dev/null || true)
if [ -z "$files" ]; then
  files=$(find . -path ./build -prune -o \( -name '*.cc' -o -name '*.h' -o -name '*.cu' \) -print |
          sed 's|^\./||')
fi
# shellcheck disable=SC2086
counts=$(wc -l $files | grep -v ' total$' | sort -rn)
echo "== lines of code per folder (source files: .cc .h .cu .cuh) =="
echo "$counts" | awk '{ n = split($2, p, "/"); d = (n > 1 ? p[1] : "."); if (n > 2) d = d "/" p[2];
  lines[d] += $1; files[d]++; total += $1 }
  END { for (d in lines) printf "%7d  %4d files  %s\n", lines[d], files[d], d | "sort -rn";
        close("sort -rn"); printf "%7d  total\n", total }'
echo "== largest files =="
# awk reads all of its input: `echo | head` could end echo with SIGPIPE, which pipefail reports.
awk -v top="$top" 'NR <= top { printf "%7d  %s\n", $1, $2 }' <<< "$counts"
over=$(echo "$counts" | awk -v cap="$cap" '$1 > cap { printf "%d %s\n", $1, $2 }')
if [ -n "$over" ]; then
  echo "== warning: over the soft cap of $cap lines per file (split by concept when touched) =="
  echo "$over" | awk '{ printf "warning: %s has %d lines\n", $2, $1 }'
fi
exit 0
