#!/usr/bin/env bash
# Reproduces the QK-Clip measurement in ../README.md: AdamW vs Muon vs MuonClip (τ = 15),
# seeds 1-3, 300 steps each, two runs at a time with one thread each, into runs/qk-clip.db.
# Run from the repository root after scripts/run-demo.sh has prepared data/default.
set -euo pipefail
B=${MOELAB_BIN:-build/bin/moelab}
DB=${1:-runs/qk-clip.db}
CFG=experiments/qk-clip/reproduce/base.json
lane() {
  for seed in "$@"; do
    "$B" train "$CFG" --db "$DB" --name "adamw-s$seed" --resume --no-progress \
      --set optimizer.name=adamw --set optimizer.lr=3e-3 --set train.seed="$seed" \
      --set train.steps=300 --set train.threads=1 --set eval.every=50
    "$B" train "$CFG" --db "$DB" --name "muon-s$seed" --resume --no-progress \
      --set optimizer.name=muon --set optimizer.lr=3e-2 --set train.seed="$seed" \
      --set train.steps=300 --set train.threads=1 --set eval.every=50
    "$B" train "$CFG" --db "$DB" --name "muonclip-s$seed" --resume --no-progress \
      --set optimizer.name=muonclip --set optimizer.lr=3e-2 --set optimizer.qk_clip_tau=15 \
      --set train.seed="$seed" --set train.steps=300 --set train.threads=1 --set eval.every=50
  done
}
lane 1 2 &
lane 3
wait
"$B" db runs --db "$DB"
