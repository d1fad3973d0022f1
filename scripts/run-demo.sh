#!/usr/bin/env bash
# The main job on the embedded defaults: install, build, export the default English corpus from
# Debian packages, prepare tokenizer + shards, train a small MoE run into a SQLite file, and say
# how to look at it. Idempotent: finished steps are skipped on a second run.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh
BIN=${MOELAB_BUILD_DIR:-build}/bin
DB=${MOELAB_DB:-runs/demo.db}
mkdir -p runs

echo "== exporting the default corpus to data/corpus"
scripts/export-corpus.sh data/corpus
echo "== preparing the tokenizer and token shards in data/default"
"$BIN/moelab" data prepare --input data/corpus --out data/default --vocab 512
echo "== training a small MoE run into $DB"
"$BIN/moelab" train experiments/demo/base.json --db "$DB" --name demo-moe --resume
echo
"$BIN/moelab" db runs --db "$DB"
cat <<MSG

The run is recorded in $DB (SQLite, WAL). Look at it with:
  $BIN/moelab db runs --db $DB          # every run with status and summary
  $BIN/moelab db show 1 --db $DB        # loss curve, validation loss, per-head max logits
  sqlite3 $DB 'SELECT step, loss FROM steps ORDER BY step DESC LIMIT 5'
MSG
