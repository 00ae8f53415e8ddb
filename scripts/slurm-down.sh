#!/usr/bin/env bash
# Stop the private Slurm cluster that scripts/slurm-up.sh started in SLURM_DIR (or the directory
# of SLURM_CONF): cancel its jobs first (so no job process is orphaned), then stop its slurmctld
# and slurmds, all at once, then its munged. Only processes found through the PID files in that
# directory whose command line names it are signalled; the machine's own Slurm is never touched.
# SLURM_DOWN_PURGE=1 also deletes the directory. Idempotent.
set -euo pipefail

LOG_NAME=slurm-down
# shellcheck source=scripts/slurm-lib.sh
. "$(dirname "$0")/slurm-lib.sh"

[ "$(id -u)" -eq 0 ] || die "must run as root"
resolve_dir
[ -d "$DIR" ] || { log "nothing to stop ($DIR does not exist)"; exit 0; }

STOPPED=0
stop_slurm
stop_munge

if [ "${SLURM_DOWN_PURGE:-0}" = 1 ]; then
    [ ! -e "$CONF" ] || grep -qxF "$MARKER" "$CONF" || die "refusing to delete $DIR"
    rm -rf "$DIR"
    log "$DIR deleted"
fi
log "stopped $STOPPED slurm daemons in $DIR"
