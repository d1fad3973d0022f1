#!/usr/bin/env bash
# Writes a small copy of a run database that a sweep resumes from on another machine: the done
# runs with their summaries, variables and sweep links, without the per-step tables (steps,
# max_logits, expert_counts) and without runs that are not done (their checkpoints stay behind
# on the old machine, so the sweep trains them again). `moelab db export` gives the same final
# points from it as from the full database; curves (`db show`) are not in it.
#   scripts/slim-db.sh runs/frontier.db experiments/sparsity-law-frontier/done-runs.db
# The source may be in use by a running sweep: it is read in one transaction (VACUUM INTO, a
# consistent snapshot). The shell's `.backup` restarts whenever the sweep writes, and under a
# busy sweep it never finishes.
set -euo pipefail
if [[ $# -ne 2 ]]; then
  echo "usage: $0 SOURCE.db DEST.db" >&2
  exit 2
fi
src="$1"
dst="$2"
tmp="$dst.tmp.$$"
trap 'rm -f "$tmp"' EXIT
rm -f "$tmp"
sqlite3 "$src" "VACUUM INTO '$tmp'"
sqlite3 "$tmp" "PRAGMA foreign_keys = ON;
  DELETE FROM expert_counts; DELETE FROM max_logits; DELETE FROM steps;
  DELETE FROM runs WHERE status != 'done';
  VACUUM;"
mv "$tmp" "$dst"
echo "slim-db: $(sqlite3 "$dst" "SELECT count(*) FROM runs") done runs -> $dst ($(du -h "$dst" | cut -f1))"
