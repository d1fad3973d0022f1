#!/usr/bin/env bash
# QK-Clip self-deactivation and per-head vs global clipping (README, "Self-deactivation"):
# base.json (Muon lr 0.1, 1200 steps WSD, no QK-norm) unclipped, then MuonClip at τ = 300
# (≈ 0.6 × the unclipped run's peak max logit) with per-head and with global (per-layer)
# clipping, into runs/qk-clip.db. Run from the repository root after data/default exists
# (scripts/run-demo.sh prepares it). Resumable: finished runs are skipped.
set -euo pipefail
B=${MOELAB_BIN:-build/bin/moelab}
DB=${1:-runs/qk-clip.db}
CFG=experiments/qk-clip/base.json
TAU=${TAU:-300}
run() { "$B" train "$CFG" --db "$DB" --resume --no-progress "$@"; }
run --name muon-noclip &
run --name "muonclip-tau$TAU-per_head" --set optimizer.qk_clip_tau="$TAU" \
  --set optimizer.qk_clip_mode=per_head &
run --name "muonclip-tau$TAU-global" --set optimizer.qk_clip_tau="$TAU" \
  --set optimizer.qk_clip_mode=global
wait
python3 experiments/qk-clip/analyze.py "$DB" 100
