#!/usr/bin/env bash
# A private single-node Slurm cluster on this machine, for tests and trying `moelab sweep slurm`
# against the real thing (Debian's slurm-wlm 22.05 and munge; scripts/install-deps.sh installs
# them). Everything lives under DIR: its own munged (own key and socket: the machine's
# /run/munge is not touched), slurmctld and slurmd on free loopback ports, state, spool, logs.
#
#   scripts/slurm-local.sh start DIR [CPUS]   # prints `export SLURM_CONF=DIR/slurm.conf`
#   scripts/slurm-local.sh stop DIR           # ends the daemons it started (by their pid files)
#
# start exits 0 once the node is idle, and 3 with the reason on stderr when the daemons cannot
# start here (not root, packages missing, a daemon that dies): callers skip on 3. The clients
# (sbatch, srun, squeue, scontrol, scancel) find the cluster through SLURM_CONF.
set -euo pipefail

usage() {
  echo "usage: $0 start DIR [CPUS] | stop DIR" >&2
  exit 2
}
cannot() {
  echo "slurm-local: cannot start Slurm here: $*" >&2
  exit 3
}

# A TCP port nobody listens on, from a range unlikely to be taken (16800-17799).
free_port() {
  local taken port
  taken=$(ss -Htln 2>/dev/null | awk '{print $4}' | sed 's/.*://' | sort -u)
  for _ in $(seq 200); do
    port=$((16800 + RANDOM % 1000))
    if ! grep -qx "$port" <<<"$taken" && [ "$port" != "${1:-}" ]; then
      echo "$port"
      return
    fi
  done
  cannot "no free port in 16800-17799"
}

# Kills the daemon whose pid file is $1 (if it is still running), waiting for it to go.
stop_daemon() {
  local pid
  [ -s "$1" ] || return 0
  pid=$(cat "$1")
  kill -TERM "$pid" 2>/dev/null || return 0
  for _ in $(seq 50); do
    kill -0 "$pid" 2>/dev/null || return 0
    sleep 0.1
  done
  kill -KILL "$pid" 2>/dev/null || true
}

# The processes left by this cluster's jobs: slurmstepd and the processes of the jobs, whose
# environments name its slurm.conf (the caller's shell names it too, but is no job: no
# SLURM_JOB_ID).
cluster_job_pids() {
  local env pid
  # One grep over every environment (NUL-separated records), then a look at the few that match.
  for env in $(grep -lzx "SLURM_CONF=$1/slurm.conf" /proc/[0-9]*/environ 2>/dev/null); do
    pid=${env#/proc/}
    pid=${pid%/environ}
    if [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = slurmstepd ] ||
      grep -qz '^SLURM_JOB_ID=' "$env" 2>/dev/null; then
      echo "$pid"
    fi
  done
  return 0
}

stop() {
  local dir=$1 jobs pids
  # Jobs first: slurmd does not end running steps when it stops.
  if [ -s "$dir/slurmctld.pid" ] && kill -0 "$(cat "$dir/slurmctld.pid")" 2>/dev/null; then
    jobs=$(SLURM_CONF=$dir/slurm.conf squeue -h -o %A 2>/dev/null | sort -u || true)
    if [ -n "$jobs" ]; then
      # shellcheck disable=SC2086
      SLURM_CONF=$dir/slurm.conf scancel $jobs 2>/dev/null || true
      for _ in $(seq 40); do
        [ -z "$(SLURM_CONF=$dir/slurm.conf squeue -h 2>/dev/null)" ] && break
        sleep 0.5
      done
    fi
  fi
  stop_daemon "$dir/slurmd.pid"
  stop_daemon "$dir/slurmctld.pid"
  stop_daemon "$dir/munged.pid"
  pids=$(cluster_job_pids "$dir")
  # shellcheck disable=SC2086
  [ -z "$pids" ] || kill -KILL $pids 2>/dev/null || true
}

start() {
  local dir cpus host ctld_port node_port
  dir=$(realpath -m "$1")
  cpus=${2:-2}
  [ "$(id -u)" -eq 0 ] || cannot "not root (slurmd runs jobs as their users; this needs root)"
  for tool in munged mungekey slurmctld slurmd sbatch srun scontrol squeue; do
    command -v "$tool" >/dev/null || cannot "$tool is not installed (apt-get install slurm-wlm munge)"
  done
  mkdir -p "$dir"/{state,spool,logs}
  chmod 0700 "$dir"
  host=$(hostname -s)
  ctld_port=$(free_port)
  node_port=$(free_port "$ctld_port")

  # munge: a key of our own and a socket under DIR.
  [ -s "$dir/munge.key" ] || mungekey --create --keyfile="$dir/munge.key" 2>"$dir/logs/mungekey.log" ||
    cannot "mungekey failed: $(cat "$dir/logs/mungekey.log")"
  chmod 0600 "$dir/munge.key"
  munged --force --socket="$dir/munge.sock" --key-file="$dir/munge.key" \
    --pid-file="$dir/munged.pid" --log-file="$dir/logs/munged.log" \
    --seed-file="$dir/munge.seed" 2>>"$dir/logs/munged.log" ||
    cannot "munged did not start: $(tail -3 "$dir/logs/munged.log")"

  cat >"$dir/slurm.conf" <<EOF
# Written by scripts/slurm-local.sh: a private single-node cluster under $dir.
ClusterName=moelab-local
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$node_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$dir/munge.sock
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool/%n
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/logs/slurmctld.log
SlurmdLogFile=$dir/logs/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
SlurmdParameters=config_overrides
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
MpiDefault=none
ReturnToService=2
JobRequeue=1
SchedulerParameters=sched_interval=1
MessageTimeout=20
KillWait=5
InactiveLimit=0
MinJobAge=300
NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus State=UNKNOWN
PartitionName=local Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
EOF
  export SLURM_CONF=$dir/slurm.conf
  slurmctld -i >>"$dir/logs/slurmctld.log" 2>&1 || cannot "slurmctld did not start: $(tail -5 "$dir/logs/slurmctld.log")"
  slurmd >>"$dir/logs/slurmd.log" 2>&1 || cannot "slurmd did not start: $(tail -5 "$dir/logs/slurmd.log")"
  # The node registers within a few seconds; until then sbatch would queue on a down node.
  local state=""
  for _ in $(seq 60); do
    state=$(sinfo -h -N -o %t 2>/dev/null | head -1 || true)
    [ "$state" = idle ] && break
    sleep 0.5
  done
  if [ "$state" != idle ]; then
    stop "$dir"
    cannot "node state '$state' after 30 s; slurmd.log: $(tail -5 "$dir/logs/slurmd.log")"
  fi
  echo "export SLURM_CONF=$dir/slurm.conf"
}

case "${1:-}" in
  start) [ $# -ge 2 ] || usage; start "$2" "${3:-}" ;;
  stop) [ $# -eq 2 ] || usage; stop "$(realpath -m "$2")" ;;
  *) usage ;;
esac
