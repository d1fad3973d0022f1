#!/usr/bin/env bash
# The main job on the embedded defaults: install, build, export the default English corpus from
# Debian packages, prepare tokenizer + shards, run the demo sparsity sweep into a SQLite file,
# fit the sparsity scaling law, and open the GUI when a display exists. Idempotent: finished
# steps (corpus, shards, done runs) are reused on a second run.
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
echo "== the demo sparsity sweep into $DB"
"$BIN/moelab" sweep run experiments/demo/sweep.json --db "$DB"
echo "== fitting L(C) = E + A·C^-alpha per sparsity"
"$BIN/moelab" fit --db "$DB" --sweep demo --by sparsity || \
  echo "(the fit needs at least 3 finished runs per sparsity; see docs/analysis.md)"
echo
"$BIN/moelab" db runs --db "$DB"
if [ -n "${DISPLAY:-}" ] && [ -x "$BIN/moelab-gui" ]; then
  echo "== opening moelab-gui on $DB"
  exec "$BIN/moelab-gui" --db "$DB"
fi
cat <<MSG

The runs are recorded in $DB (SQLite, WAL). Look at them with:
  $BIN/moelab-gui --db $DB             # the desktop app (needs a display)
  $BIN/moelab db runs --db $DB          # every run with status and summary
  $BIN/moelab db show 1 --db $DB        # one run's curve and per-head max logits
  $BIN/moelab fit --db $DB --sweep demo --by sparsity   # the fit again (stored in table fits)
MSG
