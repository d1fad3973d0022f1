#!/usr/bin/env bash
# QK-Clip self-deactivation and per-head vs global clipping (README, "Self-deactivation"):
# base.json (1200 steps WSD, no QK-norm) with Muon at lr 0.1 unclipped and clipped at τ = 300
# (≈ 0.6 × the unclipped peak), then at lr 0.03 unclipped and clipped at τ = 80 (≈ 0.6 × its
# peak), each with per-head and with global (per-layer) clipping, into runs/qk-clip.db.
# Run from the repository root after data/default exists (scripts/run-demo.sh prepares it).
# Resumable: finished runs are skipped. SEED=2 trains the same six runs with seed 2 (run names
# get a "-seed2" suffix; seed 1 keeps the original names).
set -euo pipefail
B=${MOELAB_BIN:-build/bin/moelab}
DB=${1:-runs/qk-clip.db}
CFG=experiments/qk-clip/base.json
TAU=${TAU:-300}
SEED=${SEED:-1}
SUFFIX=$([ "$SEED" = 1 ] || echo "-seed$SEED")
run() {
  local name=$2
  shift 2
  "$B" train "$CFG" --db "$DB" --resume --no-progress --name "$name$SUFFIX" \
    --set train.seed="$SEED" "$@"
}
# Arm A: Muon lr 0.1 (far above Muon's best lr here), τ = 300.
run --name muon-noclip &
run --name "muonclip-tau$TAU-per_head" --set optimizer.qk_clip_tau="$TAU" \
  --set optimizer.qk_clip_mode=per_head &
run --name "muonclip-tau$TAU-global" --set optimizer.qk_clip_tau="$TAU" \
  --set optimizer.qk_clip_mode=global
wait
# Arm B: Muon lr 0.03 (unclipped peak ≈ 130), τ = 80.
run --name muon-lr0.03-noclip --set optimizer.lr=0.03 &
run --name muon-lr0.03-tau80-per_head --set optimizer.lr=0.03 --set optimizer.qk_clip_tau=80 \
  --set optimizer.qk_clip_mode=per_head &
run --name muon-lr0.03-tau80-global --set optimizer.lr=0.03 --set optimizer.qk_clip_tau=80 \
  --set optimizer.qk_clip_mode=global
wait
python3 experiments/qk-clip/analyze.py "$DB" 100
