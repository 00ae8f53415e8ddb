#!/usr/bin/env bash
# Stop the local Slurm cluster started by scripts/slurm-up.sh: cancel every job first (so no
# job process is orphaned), then stop every daemon it started, found through its PID file, all
# at once. SLURM_DOWN_PURGE=1 also wipes Slurm's state and logs. Idempotent.
set -euo pipefail

RUN=/run/slurm

log() { echo "slurm-down: $*" >&2; }

alive() {
    local pid=$1 state
    [ -n "$pid" ] && [ -r "/proc/$pid/stat" ] || return 1
    state=$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null) || return 1
    [ "$state" != Z ] && [ "$state" != X ]
}

[ "$(id -u)" -eq 0 ] || { log "error: must run as root"; exit 1; }

if command -v scancel >/dev/null && scontrol ping >/dev/null 2>&1; then
    scancel --quiet -u root 2>/dev/null || true
    scancel --quiet --state=PENDING,RUNNING,SUSPENDED 2>/dev/null || true
    # Give the slurmds a moment to kill the job steps they own (bounded).
    for _ in $(seq 1 50); do
        [ -z "$(squeue -h -t RUNNING,COMPLETING -o %i 2>/dev/null)" ] && break
        sleep 0.1
    done
fi

pids=()
for f in "$RUN"/slurmd-*.pid "$RUN"/slurmctld.pid; do
    [ -e "$f" ] || continue
    pid=$(cat "$f" 2>/dev/null || true)
    if alive "$pid"; then kill -TERM "$pid" 2>/dev/null || true; pids+=("$pid"); fi
    rm -f "$f"
done
for _ in $(seq 1 100); do
    left=0
    for pid in "${pids[@]}"; do alive "$pid" && left=1; done
    ((left == 0)) && break
    sleep 0.1
done
for pid in "${pids[@]}"; do alive "$pid" && kill -KILL "$pid" 2>/dev/null || true; done

if [ "${SLURM_DOWN_PURGE:-0}" = 1 ]; then
    rm -rf /var/spool/slurmctld/* /var/spool/slurmd/* /var/log/slurm/*
    log "state and logs purged"
fi
log "stopped ${#pids[@]} daemons"
