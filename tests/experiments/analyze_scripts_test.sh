#!/usr/bin/env bash
# Runs every experiments/*/analyze.py on the committed exports and checks that each prints the
# seed-level statement (t interval with its df, exact sign-flip p, seed range) of issue 35.
set -euo pipefail
PY=$1
SRC=$2
E=$SRC/experiments
fail() { echo "FAIL: $*" >&2; exit 1; }
out=$("$PY" "$E/muon-vs-adamw/analyze.py" "$E/muon-vs-adamw/export.csv")
grep -q '| 3.20 | 1.256 | 1.374 | 1.247 | 1.29 \[1.18, 1.41\] (2) | \[1.13, 1.48\] | 0.25 |' <<<"$out" \
  || fail "muon-vs-adamw: the L* = 3.20 row"
out=$("$PY" "$E/qk-clip/analyze.py" "$E/qk-clip")
grep -q 'one-sided 90 % upper bound on the cost of clipping: +0.0179 nats' <<<"$out" \
  || fail "qk-clip: the upper bound on the cost of clipping"
S=$E/sparsity-law
out=$("$PY" "$S/analyze.py" "$S/export.json" "$S/export-seed2.json" "$S/export-seed3.json" \
      "$S/export-seed4.json")
grep -q '| 3200 | 8 | +0.0481 | +0.0599 | +0.0596 | +0.0963 | +0.0660 | \[+0.0413, +0.0906\] (3) | 0.125 |' \
  <<<"$out" || fail "sparsity-law: the 3200-step S = 8 gap"
grep -q '12 degrees of freedom counted by seed' <<<"$out" || fail "sparsity-law: pooled SD dof"
out=$("$PY" "$S/analyze.py" --long "$S/export-long.json" "$S/export.json")
grep -q '| 12800 | 13.11 M |' <<<"$out" || fail "sparsity-law --long"
# --iso-token keeps each model size's FLOPs per token (the frontier pilot has three sizes; it once
# collapsed them onto one).
F=$E/sparsity-law-frontier
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
out=$("$PY" "$S/analyze.py" --iso-token "$F/pilot-export.json" "$tmp/pilot-iso.json")
grep -q '3 size(s): 325152, 528768, 1.07885e+06' <<<"$out" || fail "--iso-token: per model size"
out=$("$PY" "$S/analyze.py" --iso-token "$S/export.json" "$tmp/law-iso.json")
grep -q '(1 size(s)' <<<"$out" || fail "--iso-token: one size in the single-size design"
# The pre-registered estimand from fit's JSON (moelab built beside the tests).
BIN=${3:-}
if [ -n "$BIN" ] && [ -x "$BIN/moelab" ]; then
  out=$("$BIN/moelab" fit --inputs "$S/export.json" --inputs "$S/export-seed2.json" \
        --inputs "$S/export-seed3.json" --inputs "$S/export-seed4.json" --by sparsity \
        --reference 48 --target-loss 2.66 --target-loss 2.70 --target-loss 2.75 --json \
        --resamples 50 | "$PY" "$S/analyze.py" --ratios)
  grep -q '| 2.700 | +0.032 / +0.044 / +0.030 / +0.085 | +0.047 \[+0.017, +0.078\] (3) | 0.125 |' \
    <<<"$out" || fail "sparsity-law --ratios: beta at L* = 2.70"
  grep -q '| 2.700 | 8 | 1.086 / 1.119 / 1.117 / 1.314 | 1.155 \[1.043, 1.280\] (3) | 0.125 |' \
    <<<"$out" || fail "sparsity-law --ratios: S = 8 at L* = 2.70"
  # The frontier's targets come from this range of the committed pilot export (its README).
  out=$("$BIN/moelab" fit --inputs "$tmp/pilot-iso.json" --by sparsity --reference 48 --no-store         --resamples 50)
  grep -q 'loss range every (family, seed) covers: \[2.5962, 3.5461\]' <<<"$out"     || fail "sparsity-law-frontier: the pilot's loss range"
  grep -q 'estimand: frontier (compute-optimal): C_S read on each' <<<"$out"     || fail "sparsity-law-frontier: the slope block names the frontier estimand"
fi
echo "analyze scripts: OK"
