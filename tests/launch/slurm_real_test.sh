#!/usr/bin/env bash
# `moelab sweep slurm --submit` against a real Slurm (Debian's slurm-wlm 22.05): a private
# single-node cluster (scripts/slurm-local.sh) trains a three-run sweep through real sbatch/srun.
# Mid-run, task 0 is requeued by `scontrol requeue` (what preemption does) and task 1 gets the
# time-limit warning (`scancel --batch --signal=USR1`, as --signal=B:USR1@120 sends it): each
# checkpoints, goes back to the queue and, started again, continues its own run (same uuid, no
# step recorded twice, from its checkpoint); both attempts stay in the task's log. `sweep status`
# follows the jobs through the real squeue, and `db merge` joins the three runs to the sweep.
# Exits 77 (skipped, CTest SKIP_RETURN_CODE) only when the cluster cannot start here.
set -euo pipefail

SRC=$(cd "$(dirname "$0")/../.." && pwd)
BIN=${MOELAB_BIN_DIR:-$SRC/build/bin}/moelab
STEPS=${MOELAB_SLURM_TEST_STEPS:-5000}
T0=$SECONDS
W=$(mktemp -d /tmp/moelab-slurm-real.XXXXXX)
ok=0
cleanup() {
  "$SRC/scripts/slurm-local.sh" stop "$W/cluster" || true
  if [ "$ok" = 1 ]; then rm -rf "$W"; else echo "slurm_real: kept $W for inspection"; fi
}
trap cleanup EXIT
fail() {
  echo "FAIL: $*"
  for f in "$W"/work/slurm/logs/*.log; do
    [ -e "$f" ] && { echo "--- $f"; tail -20 "$f"; }
  done
  echo "--- slurmctld.log"
  tail -15 "$W/cluster/logs/slurmctld.log" 2>/dev/null || true
  exit 1
}
# wait_for SECONDS DESCRIPTION COMMAND...: polls COMMAND every 0.2 s until it succeeds.
wait_for() {
  local limit=$1 what=$2 end=$((SECONDS + $1))
  shift 2
  until "$@"; do
    [ "$SECONDS" -lt "$end" ] || fail "no $what after ${limit} s"
    sleep 0.2
  done
}

[ -x "$BIN" ] || fail "$BIN is not built"
if ! started=$("$SRC/scripts/slurm-local.sh" start "$W/cluster" 2 2>&1); then
  echo "$started"
  if grep -q "cannot start Slurm here" <<<"$started"; then
    echo "SKIP: real Slurm cannot start on this machine (see above)"
    ok=1  # nothing to inspect
    exit 77
  fi
  fail "scripts/slurm-local.sh start"
fi
export SLURM_CONF=$W/cluster/slurm.conf
echo "cluster up after $((SECONDS - T0)) s"

mkdir -p "$W/work"
cd "$W/work"
cat >spec.json <<EOF
{"name": "law", "seeds": [1, 2, 3],
 "base": {
  "model": {"vocab_size": 32, "d_model": 16, "layers": 1, "heads": 2, "ffn_hidden": 32,
            "seq_len": 32},
  "moe": {"experts_total": 4, "experts_active": 2, "expert_hidden": 16},
  "data": {"source": "markov"},
  "train": {"batch_size": 8, "steps": $STEPS, "threads": 1},
  "schedule": {"warmup_steps": 2},
  "eval": {"every": 0, "batches": 1},
  "checkpoint": {"dir": "ckpt", "every": 1000}}}
EOF

"$BIN" sweep slurm spec.json --db "$W/work/law-{task}.db" --out slurm -t 1 --moelab "$BIN" \
  --local-db local.db --submit >submit.log 2>&1 || fail "sweep slurm --submit: $(cat submit.log)"
job=$(sed -n 's/.*as Slurm job \([0-9]*\).*/\1/p' submit.log | head -1)
[ -n "$job" ] || fail "no job id in: $(cat submit.log)"
echo "submitted job $job"

q() { sqlite3 -cmd '.timeout 5000' "$W/work/law-$1.db" "$2" 2>/dev/null; }
step_of() { q "$1" "SELECT COALESCE(MAX(step), 0) FROM steps"; }
state_of() { squeue -h -j "${job}_$1" -o %T 2>/dev/null; }
past_step() { [ "$(step_of "$1" || echo 0)" -ge "$2" ]; }
is_state() { [ "$(state_of "$1")" = "$2" ]; }

# Tasks 0 and 1 train (the node has 2 CPUs, a task takes 1); task 2 waits.
wait_for 60 "task 0 training" past_step 0 3
# Requeue task 0 (as preemption would), send task 1 the time-limit warning.
scontrol requeue "${job}_0" || fail "scontrol requeue ${job}_0"
wait_for 60 "task 1 training" past_step 1 3
scancel --batch --signal=USR1 "${job}_1" || fail "scancel --batch --signal=USR1 ${job}_1"
for t in 0 1; do
  wait_for 60 "task $t back in the queue" is_state "$t" PENDING
  [ "$(q "$t" "SELECT status FROM runs")" = stopped ] || fail "task $t's run is not 'stopped'"
done
ckpt0=$(q 0 "SELECT checkpoint_step FROM runs")
ckpt1=$(q 1 "SELECT checkpoint_step FROM runs")
[ "$ckpt0" -ge 3 ] && [ "$ckpt0" -lt "$STEPS" ] || fail "task 0 checkpointed at step '$ckpt0'"
[ "$ckpt1" -ge 3 ] && [ "$ckpt1" -lt "$STEPS" ] || fail "task 1 checkpointed at step '$ckpt1'"
echo "task 0 requeued at step $ckpt0, task 1 at step $ckpt1 ($((SECONDS - T0)) s)"
uuid0=$(q 0 "SELECT uuid FROM runs")
uuid1=$(q 1 "SELECT uuid FROM runs")
"$BIN" sweep status law --db local.db >status.log 2>&1 || fail "sweep status: $(cat status.log)"
grep -q "slurm job $job (law.sbatch, 3 task(s) x 1 rank(s)): 2 PENDING, 1 RUNNING" status.log ||
  fail "sweep status does not follow the job through squeue: $(cat status.log)"
# A requeued job is held two minutes (BeginTime); start them now.
for t in 0 1; do scontrol update JobId="${job}_$t" StartTime=now || fail "release task $t"; done

all_done() { [ -z "$(squeue -h -j "$job" 2>/dev/null)" ]; }
wait_for 240 "end of job $job" all_done
for t in 0 1 2; do
  state=$(scontrol show job "${job}_$t" | sed -n 's/.*JobState=\([A-Z]*\).*/\1/p')
  [ "$state" = COMPLETED ] || fail "task $t ended $state"
  [ "$(q "$t" "SELECT COUNT(*) || ' ' || MIN(status) FROM runs")" = "1 done" ] ||
    fail "task $t: not one run, done: $(q "$t" "SELECT id, status FROM runs")"
  [ "$(q "$t" "SELECT COUNT(*) || ' ' || COUNT(DISTINCT step) || ' ' || MAX(step) FROM steps")" = \
    "$STEPS $STEPS $STEPS" ] || fail "task $t: steps not recorded once each"
done
[ "$(q 0 "SELECT uuid FROM runs")" = "$uuid0" ] || fail "task 0 did not continue its own run"
[ "$(q 1 "SELECT uuid FROM runs")" = "$uuid1" ] || fail "task 1 did not continue its own run"
for t in 0 1; do
  restarts=$(scontrol show job "${job}_$t" | sed -n 's/.*Restarts=\([0-9]*\).*/\1/p')
  [ "$restarts" = 1 ] || fail "task $t restarted $restarts times"
done
# Both attempts are in each log: the first one's checkpoint, the second one continuing from it.
log0=$(ls slurm/logs/law_"${job}"_0.log)
log1=$(ls slurm/logs/law_"${job}"_1.log)
grep -q "run 1 'law" "$log0" || fail "task 0's log lost the first attempt"
grep -q "resuming run 1 '.*' from step $ckpt0 " "$log0" || fail "task 0 did not resume from $ckpt0"
grep -q "resuming run 1 '.*' from step $ckpt1 " "$log1" || fail "task 1 did not resume from $ckpt1"

# The results come back: every run done exactly once, joined to the sweep.
for t in 0 1 2; do
  "$BIN" db merge "law-$t.db" --db local.db >merge.log 2>&1 || fail "db merge: $(cat merge.log)"
  grep -q "joined sweep 'law'" merge.log || fail "task $t's run did not join: $(cat merge.log)"
done
L() { sqlite3 local.db "$1"; }
[ "$(L "SELECT COUNT(*), COUNT(DISTINCT config_hash), SUM(status = 'done') FROM runs")" = "3|3|3" ] ||
  fail "merged runs: $(L "SELECT id, name, status FROM runs")"
[ "$(L "SELECT COUNT(*) FROM sweep_runs")" = 3 ] || fail "sweep_runs: $(L "SELECT * FROM sweep_runs")"
[ "$(L "SELECT COUNT(*) FROM steps") $(L "SELECT COUNT(*) FROM (SELECT DISTINCT run_id, step FROM steps)")" = \
  "$((3 * STEPS)) $((3 * STEPS))" ] || fail "merged steps are not each recorded once"
"$BIN" sweep status law --db local.db >status.log 2>&1 || fail "sweep status: $(cat status.log)"
grep -q "3 runs: 3 done" status.log || fail "sweep status after merge: $(cat status.log)"
grep -q "slurm job $job (law.sbatch, 3 task(s) x 1 rank(s)): 3 COMPLETED" status.log ||
  fail "sweep status does not see the finished tasks: $(cat status.log)"

ok=1
echo "slurm_real: passed in $((SECONDS - T0)) s"
