"""The test cluster is hermetic: it lives in its own directory and leaves the machine's Slurm alone.

On an HPC head node the machine's own Slurm is production: the tests must never write its
configuration (/etc/slurm), signal its daemons or cancel its jobs. These tests prove it three ways:
the session's cluster uses only its own files, ports and name; a second private cluster standing in
for the host's keeps its daemons, its running job and its files while a third one is started,
cleaned and stopped beside it; and the machine's real Slurm (files under /etc/slurm, /etc/munge,
/run/slurm, /run/munge, its daemons, its jobs) is compared with a snapshot taken before the
session's cluster started (that test runs last; the session fixture checks once more at teardown).
A failed start shows the daemon's own last log lines.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.slurm.conftest import (
    HOST_CONF,
    REPO,
    ClusterStartError,
    HostSlurm,
    SlurmCluster,
    _skip_reason,
    cmdline_of,
    private_dir,
    start_cluster,
    stop_cluster,
    wait_until,
)

pytestmark = pytest.mark.slurm


def config(cluster: SlurmCluster) -> dict[str, str]:
    out = subprocess.run(
        ["scontrol", "show", "config"],
        env=cluster.env,
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout
    pairs = (line.split("=", 1) for line in out.splitlines() if " = " in line)
    return {key.strip(): value.strip() for key, value in pairs}


def host_setting(key: str) -> str | None:
    try:
        lines = HOST_CONF.read_text(errors="replace").splitlines()
    except OSError:
        return None
    for line in lines:
        name, _, value = line.split("#", 1)[0].strip().partition("=")
        if name.strip().lower() == key.lower():
            return value.strip()
    return None


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def test_the_cluster_lives_in_its_own_directory(slurm_instance: SlurmCluster) -> None:
    cluster = slurm_instance
    base = str(cluster.dir) + "/"
    assert os.environ["SLURM_CONF"] == str(cluster.conf)
    assert not str(cluster.dir).startswith(("/etc", "/run/slurm", "/var/spool", "/var/log"))
    conf = config(cluster)
    assert conf["SLURM_CONF"] == str(cluster.conf)
    for key in (
        "StateSaveLocation",
        "SlurmdSpoolDir",
        "SlurmctldPidFile",
        "SlurmdPidFile",
        "SlurmctldLogFile",
        "SlurmdLogFile",
        "JobCompLoc",
    ):
        assert conf[key].startswith(base), f"{key} = {conf[key]} is outside {cluster.dir}"
    assert f"socket={cluster.dir}/run/munge.sock" in conf["AuthInfo"]
    # Its own name and ports, unlike the machine's cluster (Slurm's defaults when not set).
    name = (cluster.dir / "run" / "cluster-name").read_text().strip()
    assert conf["ClusterName"] == name
    assert name != (host_setting("ClusterName") or "")
    assert conf["SlurmctldPort"] != (host_setting("SlurmctldPort") or "6817")
    assert conf["SlurmdPort"] != (host_setting("SlurmdPort") or "6818")
    # Every daemon it runs was started from its own files, and only those are in its PID files.
    pids = cluster.pids()
    assert {"slurmctld", "munged", *(f"slurmd-{n}" for n in cluster.nodes)} <= set(pids)
    for daemon, pid in pids.items():
        assert alive(pid), f"{daemon} ({pid}) is not running"
        assert f" {cluster.dir}/" in f" {cmdline_of(pid)} ", f"{daemon}: {cmdline_of(pid)}"


def test_a_failed_start_shows_the_daemons_own_log() -> None:
    """The collision the issue saw: a state directory of another cluster. The failure must carry
    slurmctld's own words, not just "slurm-up.sh failed"."""
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    directory = private_dir("muster-slurm-broken-")
    (directory / "state").mkdir()
    (directory / "state" / "clustername").write_text("someoneelse\n")
    try:
        with pytest.raises(ClusterStartError) as failure:
            start_cluster(directory, nodes=1, gpu_nodes=0, timeout=120)
    finally:
        stop_cluster(SlurmCluster(directory, []))
    message = str(failure.value)
    assert "CLUSTER NAME MISMATCH" in message, message
    assert f"last lines of {directory}/log/slurmctld.log" in message, message
    assert not directory.exists()


def test_the_scripts_refuse_the_machines_own_paths() -> None:
    if os.geteuid() != 0 or not shutil.which("bash"):
        pytest.skip("the scripts need root")
    base = {k: v for k, v in os.environ.items() if k not in ("SLURM_CONF", "SLURM_DIR")}
    cases = [
        ("slurm-up.sh", {"SLURM_DIR": "/etc/slurm"}),
        ("slurm-up.sh", {"SLURM_CONF": "/etc/slurm/slurm.conf"}),
        ("slurm-up.sh", {"SLURM_DIR": "/var/spool/slurmctld"}),
        ("slurm-up.sh", {}),
        ("slurm-down.sh", {"SLURM_DIR": "/etc/slurm"}),
        ("slurm-down.sh", {"SLURM_CONF": "/etc/slurm/slurm.conf"}),
        ("slurm-down.sh", {}),
    ]
    for script, env in cases:
        proc = subprocess.run(
            ["bash", str(REPO / "scripts" / script)],
            env={**base, "SLURM_SKIP_INSTALL": "1", **env},
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        assert proc.returncode != 0, f"{script} {env}: {proc.stderr}"
        assert "refusing" in proc.stderr or "set SLURM_DIR" in proc.stderr, proc.stderr


def test_another_cluster_keeps_its_daemons_jobs_and_files(slurm_instance: SlurmCluster) -> None:
    """A second private cluster stands in for the machine's own, with a running job; a third is
    started, used, cleaned the way the fixtures clean, and stopped beside it. The stand-in
    keeps every daemon, its job and its files."""
    standin = start_cluster(private_dir("muster-slurm-standin-"), nodes=2, gpu_nodes=0)
    third: SlurmCluster | None = None
    try:
        job = subprocess.run(
            ["sbatch", "--parsable", "-p", "batch", "-o", "/dev/null", "--chdir=/tmp"]
            + ["--wrap", "sleep 600"],
            env=standin.env,
            capture_output=True,
            text=True,
            check=True,
            timeout=30,
        ).stdout.strip()

        def standin_state() -> str:
            return subprocess.run(
                ["squeue", "-h", "-j", job, "-o", "%T"],
                env=standin.env,
                capture_output=True,
                text=True,
                timeout=30,
                check=False,
            ).stdout.strip()

        wait_until("the stand-in's job to run", lambda: standin_state() == "RUNNING", timeout=60)
        files = {p: p.read_bytes() for p in standin.dir.glob("*.conf")}
        pids = standin.pids()

        third = start_cluster(private_dir(), nodes=2, gpu_nodes=0)
        subprocess.run(
            ["sbatch", "-p", "batch", "-o", "/dev/null", "--chdir=/tmp", "--wrap", "sleep 600"],
            env=third.env,
            capture_output=True,
            check=True,
            timeout=30,
        )
        for user in ("root", "nobody"):  # what clean_slurm and the teardowns run
            subprocess.run(
                ["scancel", "-u", user], env=third.env, capture_output=True, timeout=30, check=False
            )
        start_cluster(third.dir, nodes=2, gpu_nodes=0)  # the idempotent re-run of clean_slurm
        # And the session cluster's own per-test cleanup, through the environment it set.
        subprocess.run(["scancel", "-u", "nobody"], capture_output=True, timeout=30, check=False)
        stop_cluster(third)
        assert not third.dir.exists()

        assert standin_state() == "RUNNING"
        assert {p: p.read_bytes() for p in standin.dir.glob("*.conf")} == files
        for daemon, pid in pids.items():
            assert alive(pid), f"the stand-in's {daemon} ({pid}) was stopped"
        assert standin.pids() == pids
    finally:
        if third is not None and third.dir.exists():
            stop_cluster(third)
        stop_cluster(standin)


def test_the_machines_own_slurm_is_untouched(
    slurm_instance: SlurmCluster, host_slurm: HostSlurm
) -> None:
    """Runs after every other test of the session (conftest orders it last)."""
    changes = host_slurm.changes()
    assert not changes, "the tests changed the machine's own Slurm:\n" + "\n".join(changes)
