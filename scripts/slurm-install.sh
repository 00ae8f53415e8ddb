#!/usr/bin/env bash
# Install Debian's Slurm (slurmctld slurmd slurm-client) and munge when a command is missing;
# a no-op (nothing written, nothing started) when they are all there.
#
# The packages' own services are neither started nor enabled: while apt runs, a policy-rc.d that
# answers 101 ("action forbidden") keeps invoke-rc.d from starting them (only when the machine has
# none of its own; it is removed afterwards), and the services of the packages this run installed
# are then disabled (systemctl, else update-rc.d). Muster's tests run a private cluster of their
# own (scripts/slurm-up.sh) and need no system daemon; a unit-started slurmd would also fail
# without /etc/slurm/slurm.conf. Packages the machine had before are left as they are.
#
#   --best-effort   exit 0 with a message when it cannot install (not root, no apt-get): for
#                   `make test`, where the Slurm tests then skip with the reason.
set -euo pipefail

BEST_EFFORT=0
[ "${1:-}" = --best-effort ] && BEST_EFFORT=1

log() { echo "slurm-install: $*" >&2; }
give_up() {
    log "$*"
    if ((BEST_EFFORT)); then exit 0; fi
    exit 1
}

PACKAGES=(slurmctld slurmd slurm-client munge)
SERVICES=(slurmctld slurmd munge)

have_all() {
    local c
    for c in slurmctld slurmd sbatch scontrol munged; do
        command -v "$c" >/dev/null 2>&1 || [ -x "/usr/sbin/$c" ] || return 1
    done
}

have_all && exit 0
[ "$(id -u)" -eq 0 ] || give_up "Slurm is not installed and installing it needs root (the Slurm tests will be skipped)"
command -v apt-get >/dev/null || give_up "Slurm is not installed and apt-get is not available (the Slurm tests will be skipped)"

installed() { [ "$(dpkg-query -W -f='${Status}' "$1" 2>/dev/null || true)" = "install ok installed" ]; }
new=()
for p in "${SERVICES[@]}"; do installed "$p" || new+=("$p"); done

POLICY=/usr/sbin/policy-rc.d
ours=0
if [ ! -e "$POLICY" ]; then
    printf '#!/bin/sh\n# muster scripts/slurm-install.sh: no service starts during this install\nexit 101\n' >"$POLICY"
    chmod 0755 "$POLICY"
    ours=1
fi
cleanup() { if ((ours)); then rm -f "$POLICY"; fi; }
trap cleanup EXIT

log "installing ${PACKAGES[*]} (apt; their services are not started)"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/dev/null || give_up "apt-get update failed"
# --no-install-recommends keeps slurm-wlm-emulator (a front-end build) out.
apt-get install -y -qq --no-install-recommends "${PACKAGES[@]}" >/dev/null || give_up "apt-get install failed"

# Services of the packages installed just now: not at boot either.
for s in "${new[@]}"; do
    if command -v systemctl >/dev/null && [ -d /run/systemd/system ]; then
        systemctl disable --quiet "$s" 2>/dev/null || true
    elif command -v update-rc.d >/dev/null && [ -e "/etc/init.d/$s" ]; then
        update-rc.d "$s" disable >/dev/null 2>&1 || true
    fi
done
have_all || give_up "Slurm is still missing after apt-get install"
log "installed; services not started (${new[*]:-none new} disabled)"
