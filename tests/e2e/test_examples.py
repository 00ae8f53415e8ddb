"""Every example runs (issue 28): each job file of examples/ is submitted with the `muster` CLI to a
real muster-server and real muster-agents on loopback -- started with the configuration and the
inventories the example's header names -- and each of its jobs reaches its intended end
(Completed); each scenario of examples/scenarios gives, through `muster simulate`, what its
``x-expect`` block documents.

The job files are submitted as shipped except for their run times: every ``sleep N`` and
``duration: N`` is divided by 30 (at least 1 s), so a minute of the example is 2 s here. The
setups run side by side; every wait is bounded.
"""

from __future__ import annotations

import importlib.util
import json
import math
import re
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import grpc
import pytest
import yaml
from muster_e2e import CLI, ROOT, Cluster, cli, until

from clients.client import MusterClient
from clients.jobfile import load_job_file
from muster.v1 import muster_pb2 as pb

EXAMPLES = ROOT / "examples"
ENDED = {pb.JOB_PHASE_COMPLETED, pb.JOB_PHASE_FAILED, pb.JOB_PHASE_CANCELLED}
SCALE = 30  # example seconds per test second
DONE_WITHIN = 60.0  # per batch of job files: a failure bound, not a speed verdict

Check = Callable[[dict[str, pb.Job]], None]


@dataclass
class Step:
    """``muster config set CONFIG`` (shipped file), or ``muster submit FILES`` (run times scaled)
    and a wait until every job of them has ended, Completed, then ``check``."""

    files: list[str] = field(default_factory=list)
    config_set: str | None = None
    check: Check | None = None
    refused: str | None = None  # submitting ``files`` first is refused with this in stderr


@dataclass
class Setup:
    name: str
    config: str | None  # muster-server --config examples/CONFIG (None: the built-in one)
    agents: dict[str, str]  # muster-agent --name NAME --inventory examples/INVENTORY
    steps: list[Step]


def scaled(text: str) -> str:
    """The job file with its run times divided by SCALE (1 s at least)."""

    def shorter(match: re.Match[str]) -> str:
        return f"{match[1]}{max(1, math.ceil(int(match[2]) / SCALE))}"

    return re.sub(r"(\bsleep |\bduration: )(\d+)", shorter, text)


def check_tyjobs(jobs: dict[str, pb.Job]) -> None:
    """The pod policies' visible effects (examples/tyjobs.yaml's comments), and each TYJob's end:
    its Leader succeeded (stage Succeeded), its workers were stopped (cleanPodPolicy All)."""
    nodes = {jid: [t.node for t in job.tasks] for jid, job in jobs.items()}
    for jid, job in jobs.items():
        assert job.status.stage == "Succeeded", (jid, job.status.stage)
        assert not any(t.status == pb.TASK_STATUS_RUNNING for t in job.tasks), jid
    assert len(set(nodes["ppo-jobaffinity"])) == 1, nodes  # all on one node
    assert len(set(nodes["ppo-jobantiaffinity"])) == 4, nodes  # four pods, four nodes
    leader = next(t for t in jobs["ppo-leaderfirst"].tasks if t.role == "leader")
    assert leader.node.startswith("ty-gpu-"), nodes


def check_kai_podgroup(jobs: dict[str, pb.Job]) -> None:
    """All five tasks ran, in one rack (4 at first, the fifth when room appeared)."""
    tasks = jobs["kai-pytorch"].tasks
    assert [t.status for t in tasks] == [pb.TASK_STATUS_SUCCEEDED] * 5, tasks
    assert len({t.node.split("-")[0] for t in tasks}) == 1, [t.node for t in tasks]


def check_help_example(jobs: dict[str, pb.Job]) -> None:
    """The gangs went whole into one rack each (a gang stays inside one backend)."""
    for jid in ("resnet-ddp", "kai-pytorch"):
        racks = {t.node.split("-")[0] for t in jobs[jid].tasks}
        assert len(racks) == 1, (jid, [t.node for t in jobs[jid].tasks])
    assert {t.node.split("-")[0] for t in jobs["llama-lora"].tasks} == {"b"}


def check_reservation(jobs: dict[str, pb.Job]) -> None:
    """big-gang ran whole, on the four nodes."""
    tasks = jobs["big-gang"].tasks
    assert sorted(t.node for t in tasks) == ["r-0", "r-1", "r-2", "r-3"], tasks


SETUPS = [
    # What `make demo` starts (scripts/demo.py): examples/config-volcano.yaml (the built-in
    # configuration plus high-priority), racks a and b.
    Setup(
        "demo",
        "config-volcano.yaml",
        {"rack-a": "inventory-a.yaml", "rack-b": "inventory-b.yaml"},
        [
            Step(["jobs-demo.yaml"]),
            # The first example of `muster submit --help`: the three files at once.
            Step(
                ["job-gpu.yaml", "job-volcano-gang.yaml", "job-kai-podgroup.yaml"],
                check=check_help_example,
            ),
            Step(["job-gpu.yaml"]),
            Step(["job-kai-podgroup.yaml"], check=check_kai_podgroup),
        ],
    ),
    # A server on the built-in configuration (no priority class): the same three files are
    # refused whole, naming the file and the job, until `muster config set` declares high-priority
    # (docs/jobs.md, Examples).
    Setup(
        "built-in",
        None,
        {"rack-a": "inventory-a.yaml", "rack-b": "inventory-b.yaml"},
        [
            Step(
                ["job-gpu.yaml", "job-volcano-gang.yaml", "job-kai-podgroup.yaml"],
                refused="job-volcano-gang.yaml: jobs[0].job.priority_class: 'high-priority' is "
                "not a configured priority class (configured: none; ",
            ),
            Step(config_set="config-volcano.yaml"),
            Step(
                ["job-gpu.yaml", "job-volcano-gang.yaml", "job-kai-podgroup.yaml"],
                check=check_help_example,
            ),
        ],
    ),
    Setup(
        "tyarranger",
        "config-tyarranger.yaml",
        {"ty": "inventory-tyarranger.yaml"},
        [Step(["tyjobs.yaml"], check=check_tyjobs), Step(["job-leader-workerset.yaml"])],
    ),
    Setup(
        "ascend",
        "config-ascend.yaml",
        {"ascend": "inventory-ascend.yaml"},
        [Step(["jobs-ascend.yaml"])],
    ),
    Setup(
        "gpu-sharing",
        "config-kai.yaml",
        {"gpus": "inventory-gpu-sharing.yaml"},
        [Step(["jobs-gpu-sharing.yaml"])],
    ),
    # Backfill around a reservation. Scaled, long-train's work (sleep 60) ends well before its
    # limit (12 s), so every job completes; the reservation itself, with the file as shipped, is
    # tests/e2e/test_e2e_reservation.py's.
    Setup(
        "reservation",
        "config-reservation.yaml",
        {"rack-r": "inventory-reservation.yaml"},
        [Step(["jobs-reservation.yaml"], check=check_reservation)],
    ),
]


def node_count(inventory: str) -> int:
    doc = yaml.safe_load((EXAMPLES / inventory).read_text())
    return sum(int(n.get("count", 1)) for n in doc["nodes"])


async def run_setup(setup: Setup, workdir: Path, failures: dict[str, str]) -> None:
    workdir.mkdir()
    cluster = Cluster(workdir)
    config = (EXAMPLES / setup.config).read_text() if setup.config else None
    try:
        cluster.start_server(config)
        for name, inventory in setup.agents.items():
            cluster.start_agent(name, (EXAMPLES / inventory).read_text())
        want = sum(node_count(inv) for inv in setup.agents.values())
        async with MusterClient(cluster.address, timeout=10) as client:
            await client.wait_until_serving(timeout=30)

            async def registered() -> bool:
                return len(await client.list_nodes()) == want

            await until(registered, f"{want} nodes of {setup.name}")
            for step in setup.steps:
                await run_step(client, cluster, step, workdir)
    except Exception as exc:  # noqa: BLE001 - reported with the setup's logs, by the test
        failures[setup.name] = f"{type(exc).__name__}: {exc}\n{cluster.logs()}"
    finally:
        await cluster.stop_all()


async def run_step(client: MusterClient, cluster: Cluster, step: Step, workdir: Path) -> None:
    if step.config_set:
        done = await cli(cluster.address, "config", "set", str(EXAMPLES / step.config_set))
        assert done.returncode == 0, done.stderr
    if not step.files:
        return
    copies = []
    for name in step.files:
        copy = workdir / "jobs" / name
        copy.parent.mkdir(exist_ok=True)
        copy.write_text(scaled((EXAMPLES / name).read_text()))
        copies.append(copy)
    if step.refused:
        done = await cli(cluster.address, "submit", *map(str, copies))
        assert done.returncode == 1, done.stderr
        assert step.refused in done.stderr, done.stderr
        assert done.stderr.strip().endswith("(job 'resnet-ddp')"), done.stderr
        with pytest.raises(grpc.aio.AioRpcError) as refused:  # nothing of the batch went in
            await client.get_job(load_job_file(copies[0])[0].id)
        assert refused.value.code() == grpc.StatusCode.NOT_FOUND
        return
    done = await cli(cluster.address, "submit", *map(str, copies))
    assert done.returncode == 0, f"muster submit {' '.join(step.files)}: {done.stderr}"
    ids = [spec.id for copy in copies for spec in load_job_file(copy)]

    async def ended() -> dict[str, pb.Job] | None:
        jobs = {i: await client.get_job(i) for i in ids}
        return jobs if all(j.status.phase in ENDED for j in jobs.values()) else None

    jobs = await until(ended, f"every job of {' '.join(step.files)} ended", DONE_WITHIN, 0.25)
    phases = {i: pb.JobPhase.Name(j.status.phase) for i, j in jobs.items()}
    assert set(phases.values()) == {"JOB_PHASE_COMPLETED"}, phases
    if step.check:
        step.check(jobs)


async def test_every_example_job_file_runs_to_its_end(tmp_path: Path) -> None:
    failures: dict[str, str] = {}
    with anyio.fail_after(240):
        async with anyio.create_task_group() as tg:
            for setup in SETUPS:
                tg.start_soon(run_setup, setup, tmp_path / setup.name, failures)
    assert not failures, "\n\n".join(f"===== {k}: {v}" for k, v in failures.items())


# What each job file's header must name, besides the demo's racks: the server configuration and
# the inventories it needs.
NEEDS = {
    "job-volcano-gang.yaml": ["config-volcano.yaml"],
    "tyjobs.yaml": ["config-tyarranger.yaml", "inventory-tyarranger.yaml"],
    "job-leader-workerset.yaml": ["config-tyarranger.yaml", "inventory-tyarranger.yaml"],
    "jobs-ascend.yaml": ["config-ascend.yaml", "inventory-ascend.yaml"],
    "jobs-gpu-sharing.yaml": ["config-kai.yaml", "inventory-gpu-sharing.yaml"],
    "jobs-reservation.yaml": ["config-reservation.yaml", "inventory-reservation.yaml"],
}


def test_every_example_file_is_run_here_and_names_what_it_needs() -> None:
    used: set[str] = set()
    for setup in SETUPS:
        used.update(filter(None, [setup.config, *setup.agents.values()]))
        for step in setup.steps:
            used.update(filter(None, [step.config_set, *step.files]))
    shipped = {p.name for p in EXAMPLES.glob("*.yaml")}
    assert shipped - used == set(), f"examples not run by this test: {sorted(shipped - used)}"
    for name in sorted(shipped):
        text = (EXAMPLES / name).read_text()
        header = "\n".join(line for line in text.splitlines() if line.startswith("#"))
        for other in NEEDS.get(name, []):
            assert f"examples/{other}" in header, (
                f"{name}: its header does not name examples/{other}"
            )
        if name.startswith("job") and name not in NEEDS:
            assert "make demo" in header, f"{name}: its header does not say it runs on the demo"


SCENARIOS = sorted((EXAMPLES / "scenarios").glob("*.yaml"))


def _scenario_checker() -> Callable[[dict[str, Any], dict[str, Any]], list[str]]:
    """tests/core/test_scenarios.py's comparison of an x-expect block with simulate's output."""
    path = ROOT / "tests" / "core" / "test_scenarios.py"
    spec = importlib.util.spec_from_file_location("example_scenario_checks", path)
    assert spec
    assert spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.check  # type: ignore[no-any-return]


async def test_every_example_scenario_gives_its_documented_result_through_the_cli() -> None:
    check = _scenario_checker()
    results: dict[Path, subprocess.CompletedProcess[str]] = {}

    async def simulate(path: Path) -> None:
        results[path] = await anyio.to_thread.run_sync(
            lambda: subprocess.run(
                [sys.executable, "-c", CLI, "simulate", "--local", str(path), "-o", "json"],
                cwd=ROOT,
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
        )

    async with anyio.create_task_group() as tg:
        for path in SCENARIOS:
            tg.start_soon(simulate, path)
    assert len(SCENARIOS) >= 5
    for path in SCENARIOS:
        done = results[path]
        assert done.returncode == 0, f"{path.name}: {done.stderr}"
        expect = (yaml.safe_load(path.read_text()) or {}).get("x-expect")
        assert expect, f"{path.name}: no x-expect block documents its result"
        problems = check(expect, json.loads(done.stdout))
        assert not problems, f"{path.name}:\n" + "\n".join(problems)
