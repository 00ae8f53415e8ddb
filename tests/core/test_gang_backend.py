"""gang-backend: a gang never spans backends unless the configuration allows it."""

from __future__ import annotations

from core_helpers import cycle, job, node, snapshot

from server.config import DEFAULT_CONFIG_YAML
from server.model import NodeSpec, TaskStatus

SPANNING = DEFAULT_CONFIG_YAML + "session: {gangAcrossBackends: true}\n"


def nodes(backend: str, count: int, cpu: str = "4") -> list[NodeSpec]:
    out = []
    for i in range(count):
        n = node(f"{backend or 'n'}-{i}", cpu, "64Gi")
        n.backend = backend
        out.append(n)
    return out


def backends_of(binds: dict[str, str]) -> set[str]:
    return {name.split("-")[0] for name in binds.values()}


def test_a_gang_that_fits_only_in_the_larger_backend_goes_there_whole() -> None:
    # "a" sorts first and would take two of the four tasks if nothing kept the gang together.
    snap = snapshot([*nodes("a", 2), *nodes("b", 4)], [job("g", 4, "4")])
    result = cycle(snap, DEFAULT_CONFIG_YAML)
    assert len(result.binds) == 4
    assert backends_of(result.binds) == {"b"}


def test_a_gang_that_fits_in_either_backend_stays_in_one() -> None:
    snap = snapshot([*nodes("a", 3), *nodes("b", 3)], [job("g", 3, "2"), job("h", 3, "2", index=1)])
    result = cycle(snap, DEFAULT_CONFIG_YAML)
    assert len(result.binds) == 6
    for name in ("g", "h"):
        placed = {t: n for t, n in result.binds.items() if t.split("/")[-1].startswith(f"{name}-")}
        assert len(backends_of(placed)) == 1, placed


def test_the_rest_of_a_running_gang_follows_its_backend_or_waits() -> None:
    running_on_a = job(
        "g",
        3,
        "4",
        status=[TaskStatus.RUNNING, TaskStatus.PENDING, TaskStatus.PENDING],
        nodes=["a-0", None, None],
        min_member=1,
    )
    result = cycle(snapshot([*nodes("a", 2), *nodes("b", 4)], [running_on_a]), DEFAULT_CONFIG_YAML)
    # a-1 is the only free node of backend a; b has room for both but is another backend.
    assert list(result.binds.values()) == ["a-1"]


def test_a_gang_bigger_than_every_backend_waits_unless_spanning_is_allowed() -> None:
    snap = snapshot([*nodes("a", 2), *nodes("b", 3)], [job("g", 5, "4")])
    assert cycle(snap, DEFAULT_CONFIG_YAML).binds == {}
    spanning = cycle(snapshot([*nodes("a", 2), *nodes("b", 3)], [job("g", 5, "4")]), SPANNING)
    assert backends_of(spanning.binds) == {"a", "b"}
    assert len(spanning.binds) == 5


def test_one_backend_is_left_alone() -> None:
    result = cycle(snapshot(nodes("", 5), [job("g", 5, "4")]), DEFAULT_CONFIG_YAML)
    assert len(result.binds) == 5


def test_single_task_jobs_go_anywhere() -> None:
    snap = snapshot(
        [*nodes("a", 1), *nodes("b", 1)], [job(f"s{i}", 1, "4", index=i) for i in range(2)]
    )
    result = cycle(snap, DEFAULT_CONFIG_YAML)
    assert sorted(result.binds.values()) == ["a-0", "b-0"]
