#!/usr/bin/env bash
# Bring up a local Slurm cluster of N emulated nodes (one real slurmd each, all on 127.0.0.1)
# with a DOWN `staging` partition (jobs wait there for Muster) and a `batch` run partition.
#
# Idempotent: installs Debian's slurm + munge when missing, rewrites the configuration, and
# restarts the daemons only when the configuration changed or a daemon is missing.
#
# Environment (all optional):
#   SLURM_NODES=16          emulated nodes n1..nN
#   SLURM_GPU_NODES=4       the first K nodes carry SLURM_NODE_GPUS fake GPUs (feature "gpu")
#   SLURM_NODE_CPUS=32      CPUs per node
#   SLURM_NODE_MEM_MB=256000 RealMemory per node (MB)
#   SLURM_NODE_GPUS=4       GPUs per GPU node
#   SLURMD_TIMEOUT=10       seconds before an unresponsive slurmd is marked down
#   SLURM_SCHED=backfill    sched/backfill or sched/builtin (Slurm's own scheduler, for the run partition)
#   SLURM_SKIP_INSTALL=1    never call apt-get (fail if slurm is not installed)
set -euo pipefail

NODES=${SLURM_NODES:-16}
GPU_NODES=${SLURM_GPU_NODES:-4}
CPUS=${SLURM_NODE_CPUS:-32}
MEM_MB=${SLURM_NODE_MEM_MB:-256000}
GPUS=${SLURM_NODE_GPUS:-4}
SLURMD_TIMEOUT=${SLURMD_TIMEOUT:-10}
SCHED=${SLURM_SCHED:-backfill}
BASE_PORT=17000

ETC=/etc/slurm
RUN=/run/slurm
SPOOL_CTLD=/var/spool/slurmctld
SPOOL_D=/var/spool/slurmd
LOGS=/var/log/slurm

log() { echo "slurm-up: $*" >&2; }
die() { log "error: $*"; exit 1; }

[ "$(id -u)" -eq 0 ] || die "must run as root"
((GPU_NODES <= NODES)) || GPU_NODES=$NODES

# A PID is alive when its process exists and is not a zombie (PID 1 here may not reap).
alive() {
    local pid=$1 state
    [ -n "$pid" ] && [ -r "/proc/$pid/stat" ] || return 1
    state=$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null) || return 1
    [ "$state" != Z ] && [ "$state" != X ]
}
pid_of() { [ -r "$1" ] && cat "$1" 2>/dev/null || true; }

install_packages() {
    if command -v slurmctld >/dev/null && command -v slurmd >/dev/null \
        && command -v sbatch >/dev/null && command -v munged >/dev/null; then
        return
    fi
    [ "${SLURM_SKIP_INSTALL:-0}" = 1 ] && die "slurm is not installed and SLURM_SKIP_INSTALL=1"
    command -v apt-get >/dev/null || die "slurm is not installed and apt-get is not available"
    log "installing slurmctld slurmd slurm-client munge (apt)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null
    # --no-install-recommends keeps slurm-wlm-emulator (front-end build) out.
    apt-get install -y -qq --no-install-recommends slurmctld slurmd slurm-client munge >/dev/null
}

# slurm-wlm-emulator flips the alternatives to a front-end build that cannot run many slurmd.
fix_alternatives() {
    local name
    for name in slurmctld slurmd; do
        if [ -x "/usr/sbin/$name-wlm" ] && [ "$(readlink -f "/usr/sbin/$name")" != "/usr/sbin/$name-wlm" ]; then
            update-alternatives --set "$name" "/usr/sbin/$name-wlm" >/dev/null 2>&1 || true
        fi
    done
}

start_munge() {
    if munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then return; fi
    if [ ! -s /etc/munge/munge.key ]; then
        mkdir -p /etc/munge
        if command -v mungekey >/dev/null; then mungekey --create --force >/dev/null 2>&1 || true; fi
        [ -s /etc/munge/munge.key ] || dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
        chown munge:munge /etc/munge/munge.key
        chmod 0400 /etc/munge/munge.key
    fi
    mkdir -p /run/munge /var/log/munge /var/lib/munge
    chown munge:munge /run/munge /var/log/munge /var/lib/munge
    runuser -u munge -- /usr/sbin/munged --force
    for _ in $(seq 1 50); do
        if munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then return; fi
        sleep 0.1
    done
    die "munged does not answer (munge -n | unmunge)"
}

node_lines() {
    local first_cpu=$((GPU_NODES + 1)) common
    common="NodeHostname=localhost NodeAddr=127.0.0.1 CPUs=$CPUS Sockets=1 CoresPerSocket=$CPUS ThreadsPerCore=1 RealMemory=$MEM_MB"
    if ((GPU_NODES > 0)); then
        echo "NodeName=n[1-$GPU_NODES] Port=[$((BASE_PORT + 1))-$((BASE_PORT + GPU_NODES))] $common Gres=gpu:fake:$GPUS Feature=gpu State=UNKNOWN"
    fi
    if ((first_cpu <= NODES)); then
        echo "NodeName=n[$first_cpu-$NODES] Port=[$((BASE_PORT + first_cpu))-$((BASE_PORT + NODES))] $common Feature=cpu State=UNKNOWN"
    fi
}

gen_conf() {
    cat <<EOF
# Written by muster scripts/slurm-up.sh: $NODES emulated nodes on loopback.
ClusterName=muster
# Must be \`hostname -s\`; the (addr) part avoids DNS.
SlurmctldHost=$(hostname -s)(127.0.0.1)
SlurmctldPort=6817
SlurmdPort=6818
AuthType=auth/munge
CredType=cred/munge
SlurmUser=slurm
SlurmdUser=root
StateSaveLocation=$SPOOL_CTLD
# %n: one spool dir, pid file and log per emulated node.
SlurmdSpoolDir=$SPOOL_D/%n
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
        echo "NodeName=n[1-$GPU_NODES] Name=gpu Type=fake File=$ETC/fake-gpu/nvidia[0-$((GPUS - 1))]"
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

write_if_changed() {  # path content -> returns 0 when the file changed
    local path=$1 content=$2
    if [ -f "$path" ] && [ "$(cat "$path")" = "$content" ]; then return 1; fi
    printf '%s\n' "$content" >"$path"
    return 0
}

stop_all() {
    local pids=() pid f
    scancel --full --quiet --state=PENDING,RUNNING,SUSPENDED,CONFIGURING,COMPLETING 2>/dev/null || true
    scancel --quiet -u root 2>/dev/null || true
    for f in "$RUN"/slurmd-*.pid "$RUN"/slurmctld.pid; do
        [ -e "$f" ] || continue
        pid=$(pid_of "$f")
        if alive "$pid"; then kill -TERM "$pid" 2>/dev/null || true; pids+=("$pid"); fi
        rm -f "$f"
    done
    # All at once, then wait (bounded): stopping one by one takes minutes.
    for _ in $(seq 1 100); do
        local left=0
        for pid in "${pids[@]}"; do alive "$pid" && left=1; done
        ((left == 0)) && return
        sleep 0.1
    done
    for pid in "${pids[@]}"; do alive "$pid" && kill -KILL "$pid" 2>/dev/null || true; done
    # A slurmctld started by hand (no pid file) would answer in place of the new one.
    for _ in $(seq 1 50); do pgrep -x slurmctld >/dev/null || break; sleep 0.1; done
    rm -f "$RUN/muster-conf.sha256"
}

main() {
    install_packages
    fix_alternatives
    id slurm >/dev/null 2>&1 || die "user slurm is missing (slurm packages broken?)"
    start_munge

    mkdir -p "$ETC" "$ETC/fake-gpu" "$RUN" "$SPOOL_CTLD" "$SPOOL_D" "$LOGS"
    chown slurm:slurm "$SPOOL_CTLD" "$LOGS"
    local i
    for ((i = 0; i < GPUS; i++)); do ln -sfn /dev/null "$ETC/fake-gpu/nvidia$i"; done

    local changed=0
    write_if_changed "$ETC/slurm.conf" "$(gen_conf)" && changed=1
    write_if_changed "$ETC/gres.conf" "$(gen_gres)" && changed=1
    write_if_changed "$ETC/job_submit.lua" "$(gen_lua)" && changed=1
    # An earlier, different cluster may have left pid files of nodes we no longer declare.
    for f in "$RUN"/slurmd-*.pid; do
        [ -e "$f" ] || continue
        local name=${f##*/slurmd-}; name=${name%.pid}
        if [ "${name#n}" -gt "$NODES" ] 2>/dev/null; then changed=1; fi
    done

    # Restart when the running slurmctld was started with another configuration (recorded at
    # start, so a bring-up that failed half-way is redone on the next run).
    local want_sum running_sum
    want_sum=$(cat "$ETC/slurm.conf" "$ETC/gres.conf" "$ETC/job_submit.lua" | sha256sum | cut -d' ' -f1)
    running_sum=$(cat "$RUN/muster-conf.sha256" 2>/dev/null || true)
    [ "$want_sum" != "$running_sum" ] && changed=1
    local ctld_pid; ctld_pid=$(pid_of "$RUN/slurmctld.pid")
    if ((changed)) || ! alive "$ctld_pid"; then
        ((changed)) && log "configuration changed: restarting the cluster"
        stop_all
        # -c: forget old jobs; -i: ignore state-file errors.
        /usr/sbin/slurmctld -c -i
        for _ in $(seq 1 100); do scontrol ping >/dev/null 2>&1 && break; sleep 0.1; done
        scontrol ping >/dev/null 2>&1 || die "slurmctld did not come up (see $LOGS/slurmctld.log)"
        echo "$want_sum" >"$RUN/muster-conf.sha256"
    fi

    for ((i = 1; i <= NODES; i++)); do
        if ! alive "$(pid_of "$RUN/slurmd-n$i.pid")"; then
            mkdir -p "$SPOOL_D/n$i"
            /usr/sbin/slurmd -N "n$i"
        fi
    done

    # Wait (bounded) until every node is up; a node left down by a killed slurmd is resumed.
    local deadline=$((SECONDS + 60)) up
    while :; do
        up=$(sinfo -h -N -p batch -t idle,alloc,mix,comp -o %N 2>/dev/null | sort -u | wc -l)
        ((up >= NODES)) && break
        if ((SECONDS > deadline)); then die "only $up/$NODES nodes up after 60 s (see $LOGS)"; fi
        local down; down=$(sinfo -h -N -p batch -t down,drain -o %N 2>/dev/null | sort -u | paste -sd, -)
        [ -n "$down" ] && scontrol update NodeName="$down" State=RESUME >/dev/null 2>&1 || true
        sleep 0.2
    done
    log "up: $NODES nodes ($GPU_NODES with $GPUS GPUs), partitions batch + staging (DOWN)"
}

main "$@"
