"""The clients' and adapters' YAML files go through muster/yamldoc.py: an alias bomb in a job file
or an agent inventory is refused quickly with a clear error; small anchors still work."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from adapters.agent.inventory import InventoryError, load_inventory
from clients.jobfile import JobFileError, load_job_file


def alias_bomb(levels: int = 9, width: int = 9) -> str:
    """``x-0: &l0 [lol x 9]``, ``x-1: &l1 [*l0 x 9]`` ...: a few hundred bytes, 9**9 strings."""
    lines = ["x-0: &l0 [" + ", ".join(["lol"] * width) + "]"]
    lines += [f"x-{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * width) + "]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


def test_a_job_file_alias_bomb_is_refused_quickly(tmp_path: Path) -> None:
    path = tmp_path / "jobs.yaml"
    path.write_text(alias_bomb() + "id: a\ntasks: [{role: w, request: {cpu: 1}, x-more: *l8}]\n")
    started = time.perf_counter()
    with pytest.raises(JobFileError) as err:
        load_job_file(path)
    assert time.perf_counter() - started < 1.0
    assert err.value.problems == [err.value.problems[0]]
    assert "aliases expand to more than" in err.value.problems[0]


def test_a_job_file_alias_bomb_over_several_documents_is_refused(tmp_path: Path) -> None:
    one = (
        "x-0: &a ["
        + ", ".join(["x"] * 100)
        + "]\nx-1: ["
        + ", ".join(["*a"] * 100)
        + "]\nid: j{}\n"
    )
    path = tmp_path / "jobs.yaml"
    path.write_text(
        "---\n".join(one.format(i) for i in range(11))
    )  # 10,100 nodes each through aliases
    with pytest.raises(JobFileError, match="aliases expand"):
        load_job_file(path)


def test_merge_keys_in_job_files_still_work(tmp_path: Path) -> None:
    path = tmp_path / "jobs.yaml"
    path.write_text(
        "- &a {id: a, queue: ml, tasks: [{role: w, replicas: 2, request: {cpu: 1}}]}\n"
        "- {<<: *a, id: b, queue: web}\n"
    )
    jobs = load_job_file(path)
    assert [(j.id, j.queue, len(j.task_groups)) for j in jobs] == [("a", "ml", 1), ("b", "web", 1)]


def test_an_inventory_alias_bomb_is_refused_quickly(tmp_path: Path) -> None:
    path = tmp_path / "inventory.yaml"
    path.write_text(alias_bomb().replace("x-", "k") + "nodes: [{name: a, cpu: 8, labels: *l8}]\n")
    started = time.perf_counter()
    with pytest.raises(InventoryError, match="aliases expand to more than"):
        load_inventory(path)
    assert time.perf_counter() - started < 1.0
