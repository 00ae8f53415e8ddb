#!/usr/bin/env bash
# Bring up a private local Slurm cluster of N emulated nodes (one real slurmd each, all on
# 127.0.0.1) with a DOWN `staging` partition (jobs wait there for Muster) and a `batch` run
# partition, entirely inside one directory (see scripts/slurm-lib.sh for the layout).
#
# Hermetic: its own slurm.conf (daemons get `-f`, clients SLURM_CONF), its own munged (own key and
# socket), cluster name, free ports, state, spool, PID and log files. It never writes /etc/slurm,
# never signals a daemon it did not start and never cancels a job of another cluster, so it can run
# beside the machine's own Slurm. Prints `export SLURM_CONF=DIR/slurm.conf` on stdout:
#
#   eval "$(SLURM_DIR=/tmp/muster-slurm scripts/slurm-up.sh)"    # then sbatch, squeue, ...
#
# Idempotent: restarts only what is missing, or the whole cluster when the configuration changed.
# When a daemon does not come up, the error shows the last lines of its own log.
#
# Environment:
#   SLURM_DIR=<dir>         the cluster's directory (required, or SLURM_CONF=<dir>/slurm.conf)
#   SLURM_NODES=16          emulated nodes n1..nN
#   SLURM_GPU_NODES=4       the first K nodes carry SLURM_NODE_GPUS fake GPUs (feature "gpu")
#   SLURM_NODE_CPUS=32      CPUs per node
#   SLURM_NODE_MEM_MB=256000 RealMemory per node (MB)
#   SLURM_NODE_GPUS=4       GPUs per GPU node
#   SLURMD_TIMEOUT=10       seconds before an unresponsive slurmd is marked down
#   SLURM_SCHED=backfill    sched/backfill or sched/builtin (Slurm's own scheduler, for the run partition)
#   SLURM_SKIP_INSTALL=1    never call apt-get (fail if slurm is not installed)
set -euo pipefail

LOG_NAME=slurm-up
# shellcheck source=scripts/slurm-lib.sh
. "$(dirname "$0")/slurm-lib.sh"

NODES=${SLURM_NODES:-16}
GPU_NODES=${SLURM_GPU_NODES:-4}
CPUS=${SLURM_NODE_CPUS:-32}
MEM_MB=${SLURM_NODE_MEM_MB:-256000}
GPUS=${SLURM_NODE_GPUS:-4}
SLURMD_TIMEOUT=${SLURMD_TIMEOUT:-10}
SCHED=${SLURM_SCHED:-backfill}

[ "$(id -u)" -eq 0 ] || die "must run as root (slurmd starts jobs as their users)"
((GPU_NODES <= NODES)) || GPU_NODES=$NODES
resolve_dir

install_packages() {
    if command -v sbatch >/dev/null && command -v munged >/dev/null \
        && { [ -x /usr/sbin/slurmctld-wlm ] || command -v slurmctld >/dev/null; } \
        && { [ -x /usr/sbin/slurmd-wlm ] || command -v slurmd >/dev/null; }; then
        return
    fi
    [ "${SLURM_SKIP_INSTALL:-0}" = 1 ] && die "slurm is not installed and SLURM_SKIP_INSTALL=1"
    bash "$(dirname "$0")/slurm-install.sh"
}

# The real multi-slurmd build, whatever the alternatives say: slurm-wlm-emulator points them at a
# front-end build (slurmctld: "fatal: No front end nodes defined"). The machine's alternatives are
# not changed; slurmstepd is started by slurmd through its fixed path, so that one must be right.
# The daemons are run with argv[0] = slurmctld / slurmd (`exec -a`): Slurm decides by its program
# name whether it runs inside a daemon, and started as `slurmctld-wlm` it sets up no GRES at all
# (every node `Gres=(null)`, `--gres=gpu:1` refused with "Requested node configuration is not
# available"; slurmd-wlm: "gres.conf ... has 4 more configured than expected in slurm.conf").
pick_binaries() {
    SLURMCTLD=/usr/sbin/slurmctld-wlm
    SLURMD=/usr/sbin/slurmd-wlm
    [ -x "$SLURMCTLD" ] || SLURMCTLD=$(command -v slurmctld) || die "slurmctld is not installed"
    [ -x "$SLURMD" ] || SLURMD=$(command -v slurmd) || die "slurmd is not installed"
    local stepd
    stepd=$(readlink -f /usr/sbin/slurmstepd 2>/dev/null || true)
    case "$stepd" in
        *emulator*) die "/usr/sbin/slurmstepd is the front-end build ($stepd, from slurm-wlm-emulator): run
  update-alternatives --set slurmd /usr/sbin/slurmd-wlm   (slurmstepd follows)" ;;
    esac
}

# Our own munged: own key (1 KiB of random, 0400 in a 0700 dir), own socket (in DIR/run, which
# every user can reach: jobs of other users submit through it), own PID, seed and log files.
start_munge() {
    if ours "$(pid_of "$MUNGE/munged.pid")" && munge -S "$MUNGE_SOCK" -n 2>/dev/null | unmunge -S "$MUNGE_SOCK" >/dev/null 2>&1; then
        return
    fi
    stop_munge
    if [ ! -s "$MUNGE/munge.key" ]; then
        dd if=/dev/urandom of="$MUNGE/munge.key" bs=1024 count=1 status=none
        chmod 0400 "$MUNGE/munge.key"
    fi
    rm -f "$MUNGE_SOCK" "$MUNGE_SOCK.lock"
    munged --force -S "$MUNGE_SOCK" --key-file="$MUNGE/munge.key" --pid-file="$MUNGE/munged.pid" \
        --log-file="$MUNGE/munged.log" --seed-file="$MUNGE/munged.seed" \
        || die "munged did not start
$(log_tails "$MUNGE/munged.log")"
    for _ in $(seq 1 50); do
        if munge -S "$MUNGE_SOCK" -n 2>/dev/null | unmunge -S "$MUNGE_SOCK" >/dev/null 2>&1; then return; fi
        sleep 0.1
    done
    die "munged does not answer on $MUNGE_SOCK
$(log_tails "$MUNGE/munged.log")"
}

# NODES + 2 distinct ports (slurmctld, SlurmdPort, one per node), free on every address right now,
# below the ephemeral range so client connections do not take them later.
pick_ports() {
    python3 - "$((NODES + 2))" <<'EOF'
import random, socket, sys
want, got, tries = int(sys.argv[1]), [], 0
held = []
while len(got) < want:
    tries += 1
    if tries > 20000:
        sys.exit("no free ports")
    port = random.randrange(20000, 32000)
    if port in got:
        continue
    s = socket.socket()
    try:
        s.bind(("0.0.0.0", port))
    except OSError:
        s.close()
        continue
    held.append(s)
    got.append(port)
print(" ".join(map(str, got)))
EOF
}

# A unique name: two clusters sharing a state directory would stop with CLUSTER NAME MISMATCH.
cluster_name() {
    if [ ! -s "$RUN/cluster-name" ]; then
        echo "muster$(od -An -N4 -tx1 /dev/urandom | tr -d ' \n')" >"$RUN/cluster-name"
    fi
    cat "$RUN/cluster-name"
}

node_lines() {
    local i gres feature
    for ((i = 1; i <= NODES; i++)); do
        if ((i <= GPU_NODES)); then gres=" Gres=gpu:fake:$GPUS"; feature=gpu; else gres=""; feature=cpu; fi
        echo "NodeName=n$i NodeHostname=localhost NodeAddr=127.0.0.1 Port=${NODE_PORTS[$((i - 1))]} CPUs=$CPUS Sockets=1 CoresPerSocket=$CPUS ThreadsPerCore=1 RealMemory=$MEM_MB$gres Feature=$feature State=UNKNOWN"
    done
}

gen_conf() {
    cat <<EOF
$MARKER
# Written by muster scripts/slurm-up.sh: a private cluster of $NODES emulated nodes on loopback,
# entirely in $DIR (clients: SLURM_CONF=$CONF; daemons: -f $CONF).
ClusterName=$(cluster_name)
# Must be \`hostname -s\`; the (addr) part avoids DNS.
SlurmctldHost=$(hostname -s)(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$MUNGE_SOCK
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$STATE
# %n: one spool dir, pid file and log per emulated node.
SlurmdSpoolDir=$SPOOL/%n
SlurmctldPidFile=$RUN/slurmctld.pid
SlurmdPidFile=$RUN/slurmd-%n.pid
SlurmctldLogFile=$LOGS/slurmctld.log
SlurmdLogFile=$LOGS/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
MailProg=/bin/true
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc=$LOGS/jobcomp.log
SchedulerType=sched/$SCHED
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
# Without it one job takes the whole RealMemory of each node.
DefMemPerCPU=1024
# Trust the declared CPUs/RAM: the host is much smaller than the emulated nodes.
SlurmdParameters=config_overrides
# 1: a node that stopped answering returns by itself; a manual DOWN stays down.
ReturnToService=1
SlurmdTimeout=$SLURMD_TIMEOUT
KillWait=5
MinJobAge=600
MaxJobCount=100000
SchedulerParameters=batch_sched_delay=0,sched_min_interval=0,default_queue_depth=10000,bf_interval=1
GresTypes=gpu
# job_submit.lua and gres.conf are read from the directory of this file.
JobSubmitPlugins=lua
$(node_lines)
PartitionName=batch Nodes=ALL Default=NO MaxTime=INFINITE State=UP
# DOWN: Slurm never starts a job from here; Muster moves it to batch with a node list.
PartitionName=staging Nodes=ALL Default=YES MaxTime=INFINITE State=DOWN
EOF
}

gen_gres() {
    echo "AutoDetect=off"
    if ((GPU_NODES > 0)); then
        # slurmd drops a GPU without File=, and File= must be a device: symlinks to /dev/null.
        echo "NodeName=n[1-$GPU_NODES] Name=gpu Type=fake File=$DIR/fake-gpu/nvidia[0-$((GPUS - 1))]"
    fi
}

gen_lua() {
    cat <<'EOF'
-- Written by muster scripts/slurm-up.sh. Every job of a non-root user waits in `staging`
-- until the external scheduler (root) moves it to the run partition with a node list;
-- users may not change the partition or node list themselves.
function slurm_job_submit(job_desc, part_list, submit_uid)
    if submit_uid ~= 0 then
        job_desc.partition = "staging"
    end
    return slurm.SUCCESS
end

function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
    if modify_uid ~= 0 and (job_desc.partition ~= nil or job_desc.req_nodes ~= nil
            or job_desc.exc_nodes ~= nil) then
        slurm.log_user("only the scheduler may change the partition or node list")
        return slurm.ERROR
    end
    return slurm.SUCCESS
end

return slurm.SUCCESS
EOF
}

write_conf() {
    printf '%s\n' "$(gen_conf)" >"$CONF.new" && mv "$CONF.new" "$CONF"
    printf '%s\n' "$(gen_gres)" >"$DIR/gres.conf"
    printf '%s\n' "$(gen_lua)" >"$DIR/job_submit.lua"
    chmod 0644 "$CONF" "$DIR/gres.conf" "$DIR/job_submit.lua"
}

conf_sum() { cat "$CONF" "$DIR/gres.conf" "$DIR/job_submit.lua" | sha256sum | cut -d' ' -f1; }

# Ports recorded for the running cluster, when there are enough for NODES.
load_ports() {
    local ports=()
    [ -s "$RUN/ports" ] || return 1
    read -r -a ports <"$RUN/ports"
    ((${#ports[@]} == NODES + 2)) || return 1
    CTLD_PORT=${ports[0]}
    SLURMD_PORT=${ports[1]}
    NODE_PORTS=("${ports[@]:2}")
}

new_ports() {
    pick_ports >"$RUN/ports" || die "could not find $((NODES + 2)) free ports"
    load_ports
}

start_slurmctld() {
    # -c: no old job state (every job of this directory's earlier runs is gone); -i: ignore
    # state-file errors. Its early errors (before it logs to its file) go to our stderr.
    (exec -a slurmctld "$SLURMCTLD" -f "$CONF" -c -i) || die "slurmctld -f $CONF exited with status $?
$(log_tails "$LOGS/slurmctld.log")"
    local n
    for n in $(seq 1 150); do
        scontrol ping >/dev/null 2>&1 && return
        # Gone (after its PID file had time to appear): no use waiting.
        ((n < 20)) || ours "$(pid_of "$RUN/slurmctld.pid")" || break
        sleep 0.1
    done
    scontrol ping >/dev/null 2>&1 && return
    die "slurmctld did not come up
$(log_tails "$LOGS/slurmctld.log")"
}

main() {
    install_packages
    pick_binaries
    mkdir -p "$DIR" "$DIR/fake-gpu" "$RUN" "$STATE" "$SPOOL" "$LOGS" "$MUNGE"
    # Readable by every user (jobs of other users read slurm.conf and reach the munge socket);
    # only the munge key's directory is private.
    chmod 0755 "$DIR" "$DIR/fake-gpu" "$RUN" "$STATE" "$SPOOL" "$LOGS"
    chmod 0700 "$MUNGE"
    local i
    for ((i = 0; i < GPUS; i++)); do ln -sfn /dev/null "$DIR/fake-gpu/nvidia$i"; done

    start_munge

    # Keep a running cluster when its configuration is the same; else start it over on new ports.
    local ctld_pid restart=1
    ctld_pid=$(pid_of "$RUN/slurmctld.pid")
    if ours "$ctld_pid" && load_ports; then
        write_conf
        [ "$(conf_sum)" = "$(cat "$RUN/conf.sha256" 2>/dev/null || true)" ] && restart=0
        ((restart)) && log "configuration changed: restarting the cluster"
    fi
    if ((restart)); then
        stop_slurm
        new_ports
        write_conf
        start_slurmctld
        conf_sum >"$RUN/conf.sha256"
    fi

    for ((i = 1; i <= NODES; i++)); do
        if ! ours "$(pid_of "$RUN/slurmd-n$i.pid")"; then
            mkdir -p "$SPOOL/n$i"
            (exec -a slurmd "$SLURMD" -f "$CONF" -N "n$i") || die "slurmd -N n$i exited with status $?
$(log_tails "$LOGS/slurmd-n$i.log")"
        fi
    done

    # Wait (bounded) until every node is up; a node left down by a killed slurmd is resumed.
    local deadline=$((SECONDS + 60)) up down missing
    while :; do
        up=$(sinfo -h -N -p batch -t idle,alloc,mix,comp -o %N 2>/dev/null | sort -u | wc -l)
        ((up >= NODES)) && break
        if ((SECONDS > deadline)); then
            missing=()
            for ((i = 1; i <= NODES; i++)); do
                sinfo -h -N -n "n$i" -t idle,alloc,mix,comp -o %N 2>/dev/null | grep -q . || missing+=("$LOGS/slurmd-n$i.log")
            done
            die "only $up/$NODES nodes up after 60 s
$(sinfo -N -p batch 2>&1 | head -20)
$(log_tails "$LOGS/slurmctld.log" "${missing[@]:0:3}")"
        fi
        down=$(sinfo -h -N -p batch -t down,drain -o %N 2>/dev/null | sort -u | paste -sd, -)
        [ -n "$down" ] && scontrol update NodeName="$down" State=RESUME >/dev/null 2>&1 || true
        sleep 0.2
    done
    log "up: $NODES nodes ($GPU_NODES with $GPUS GPUs), cluster $(cluster_name) on port $CTLD_PORT, in $DIR"
    echo "export SLURM_CONF=$CONF"
}

main "$@"
