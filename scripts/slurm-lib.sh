# shellcheck shell=bash disable=SC2034  # sourced: the variables are the callers'
# Shared by scripts/slurm-up.sh and scripts/slurm-down.sh (sourced, not run).
#
# A private ("hermetic") Slurm cluster lives in one directory DIR: its own slurm.conf (clients get
# it through SLURM_CONF, daemons through -f), munged, ports, cluster name, state, spool, PID files
# and logs. Nothing here reads or writes /etc/slurm, /etc/munge, /run/slurm or /var/spool/slurm*,
# and only processes whose PID file is in DIR *and* whose command line names DIR are signalled, so a
# Slurm the machine already runs (its daemons, its jobs, its configuration) is never touched.
#
#   DIR/slurm.conf gres.conf job_submit.lua fake-gpu/   configuration (SLURM_CONF=DIR/slurm.conf)
#   DIR/munge/     (0700) munge.key, munged.seed, munged.log, munged.pid
#   DIR/run/       PID files, munge.sock, ports, cluster-name, conf.sha256
#   DIR/state/     StateSaveLocation     DIR/spool/<node>/  SlurmdSpoolDir
#   DIR/log/       slurmctld.log, slurmd-<node>.log, jobcomp.log

MARKER="# muster-hermetic-cluster"

log() { echo "${LOG_NAME:-slurm}: $*" >&2; }
die() { log "error: $*"; exit 1; }

# The cluster directory: SLURM_DIR, else the directory of SLURM_CONF (which must be DIR/slurm.conf).
# Refuses the machine's own configuration directories and any slurm.conf this script did not write.
resolve_dir() {
    local dir=${SLURM_DIR:-}
    if [ -z "$dir" ] && [ -n "${SLURM_CONF:-}" ]; then
        [ "$(basename "$SLURM_CONF")" = slurm.conf ] || die "SLURM_CONF must end in /slurm.conf (got $SLURM_CONF)"
        dir=$(dirname "$SLURM_CONF")
    fi
    [ -n "$dir" ] || die "set SLURM_DIR=<dir> (or SLURM_CONF=<dir>/slurm.conf): the private cluster lives there"
    DIR=$(realpath -m "$dir")
    case "$DIR" in
        / | /etc | /etc/* | /run/slurm* | /var/spool/slurm* | /var/lib/slurm* | /var/log/slurm* | /usr | /usr/*)
            die "refusing $DIR: the private cluster never uses the machine's own Slurm paths" ;;
    esac
    if [ -e "$DIR/slurm.conf" ] && ! grep -qxF "$MARKER" "$DIR/slurm.conf"; then
        die "refusing $DIR: its slurm.conf was not written by scripts/slurm-up.sh"
    fi
    CONF=$DIR/slurm.conf
    RUN=$DIR/run
    STATE=$DIR/state
    SPOOL=$DIR/spool
    LOGS=$DIR/log
    MUNGE=$DIR/munge
    MUNGE_SOCK=$RUN/munge.sock
    # Every client command below talks to this cluster only.
    export SLURM_CONF=$CONF
}

# A PID is alive when its process exists and is not a zombie (PID 1 here may not reap).
alive() {
    local pid=$1 state
    [ -n "$pid" ] && [ -r "/proc/$pid/stat" ] || return 1
    state=$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null) || return 1
    [ "$state" != Z ] && [ "$state" != X ]
}

# Alive and started by us: its command line names DIR (slurmctld/slurmd -f DIR/slurm.conf,
# munged -S DIR/run/munge.sock). A stale PID file whose PID now belongs to another process
# (the host's slurmctld, say) is never signalled.
ours() {
    local pid=$1
    alive "$pid" || return 1
    tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF " $DIR/"
}

pid_of() { [ -r "$1" ] && cat "$1" 2>/dev/null || true; }

# The daemons of this cluster that are running, as "pidfile pid" lines (slurmd first).
our_daemons() {
    local f pid
    for f in "$RUN"/slurmd-*.pid "$RUN"/slurmctld.pid; do
        [ -e "$f" ] || continue
        pid=$(pid_of "$f")
        if ours "$pid"; then echo "$f $pid"; fi
    done
}

# TERM the given PIDs at once, wait (bounded), then KILL what is left. Only PIDs that `ours` accepts.
stop_pids() {
    local pids=() pid left
    for pid in "$@"; do
        if ours "$pid"; then kill -TERM "$pid" 2>/dev/null || true; pids+=("$pid"); fi
    done
    ((${#pids[@]})) || return 0
    for _ in $(seq 1 100); do
        left=0
        for pid in "${pids[@]}"; do alive "$pid" && left=1; done
        ((left == 0)) && return 0
        sleep 0.1
    done
    for pid in "${pids[@]}"; do ours "$pid" && kill -KILL "$pid" 2>/dev/null || true; done
    return 0
}

# Job steps of this cluster that outlived their slurmd (the slurmstepd processes whose working
# directory is in DIR: slurmd starts them in its log directory), with every process under them.
our_steps() {
    local p cwd roots=()
    for p in /proc/[0-9]*; do
        [ "$(cat "$p/comm" 2>/dev/null)" = slurmstepd ] || continue
        cwd=$(readlink "$p/cwd" 2>/dev/null) || continue
        case "$cwd" in "$DIR"/*) roots+=("${p#/proc/}") ;; esac
    done
    ((${#roots[@]})) || return 0
    ps -eo pid=,ppid= | awk -v roots="${roots[*]}" '
        BEGIN { n = split(roots, r, " "); for (i = 1; i <= n; i++) keep[r[i]] = 1 }
        { parent[$1] = $2 }
        END {
            for (changed = 1; changed; ) {
                changed = 0
                for (p in parent) if (!(p in keep) && (parent[p] in keep)) { keep[p] = 1; changed = 1 }
            }
            for (p in keep) print p
        }'
}

# Cancel the jobs of this cluster (every job in it was submitted through it) and wait until its
# nodes have cleaned them up, then stop its slurmctld and slurmds, all at once (one by one, 64
# nodes took minutes). A job step still left (its slurmd went first) is killed with its processes.
stop_slurm() {
    local ctld lines pids=() f pid
    ctld=$(pid_of "$RUN/slurmctld.pid")
    if ours "$ctld" && command -v scancel >/dev/null; then
        local jobs=()
        read -r -a jobs <<<"$(squeue -h -t PENDING,RUNNING,SUSPENDED,CONFIGURING -o %i 2>/dev/null | paste -sd' ' -)"
        ((${#jobs[@]} == 0)) || scancel --quiet "${jobs[@]}" 2>/dev/null || true
        # Bounded: KillWait=5 s, then Slurm kills the job's processes itself.
        for _ in $(seq 1 150); do
            [ -z "$(squeue -h -t RUNNING,COMPLETING,CONFIGURING,SUSPENDED -o %i 2>/dev/null)" ] \
                && [ -z "$(sinfo -h -N -t alloc,mix,comp -o %N 2>/dev/null)" ] && break
            sleep 0.1
        done
    fi
    lines=$(our_daemons)
    while read -r f pid; do
        [ -n "${pid:-}" ] && pids+=("$pid")
    done <<<"$lines"
    stop_pids "${pids[@]}"
    rm -f "$RUN"/slurmd-*.pid "$RUN/slurmctld.pid" "$RUN/conf.sha256"
    STOPPED=${#pids[@]}
    local steps
    steps=$(our_steps | paste -sd' ' -)
    if [ -n "$steps" ]; then
        log "killing job processes left behind: $steps"
        # shellcheck disable=SC2086
        kill -KILL $steps 2>/dev/null || true
    fi
}

stop_munge() {
    local pid
    pid=$(pid_of "$MUNGE/munged.pid")
    stop_pids "$pid"
}

# The last lines of the given log files, for an error message: the reason a daemon did not start
# (e.g. "fatal: CLUSTER NAME MISMATCH") is there, not in our own output.
log_tails() {
    local f
    for f in "$@"; do
        [ -s "$f" ] || continue
        echo "---- last lines of $f ----"
        tail -n "${SLURM_LOG_LINES:-25}" "$f"
    done
}
