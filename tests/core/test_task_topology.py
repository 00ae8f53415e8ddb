"""task-topology plugin: behaviour of Volcano's plugins/task-topology (topology.go, manager.go,
bucket.go, topology_test.go)."""

from __future__ import annotations

import numpy as np
import pytest
from core_helpers import cycle, job, node, queue, res, session, snapshot, task

from server.model import JobSpec, NodeSpec
from server.plugins.volcano.task_topology import read_topology
from server.session.info import JobInfo, ResourceSpace

CONFIG = """
actions: "allocate"
tiers:
- plugins:
  - name: gang
  - name: predicates
  - name: task-topology
"""


def make_job(
    roles: dict[str, int], annotations: dict[str, str], *, placed: dict[str, str] | None = None
) -> JobSpec:
    """Job default/job1 with ``roles[role]`` 1-cpu tasks job1-<role>-<k> per role; ``placed``: task
    uid -> the node it runs on."""
    tasks = []
    for role, n in roles.items():
        for k in range(n):
            name = f"job1-{role}-{k}"
            tasks.append(
                task(
                    name,
                    "job1",
                    res("1"),
                    (placed or {}).get(f"default/{name}"),
                    ns="default",
                    role=role,
                    creation_index=len(tasks),
                )
            )
    return job(
        "job1", ns="default", queue="q", tasks=tasks, min_member=None, annotations=annotations
    )


def nodes(n: int) -> list[NodeSpec]:
    return [node(f"n{i}", "8", "64G", pods=110) for i in range(1, n + 1)]


def run(gang: JobSpec, node_list: list[NodeSpec]) -> dict[str, str]:
    return cycle(snapshot(node_list, [gang], [queue("q")]), CONFIG).binds


def roles_per_node(binds: dict[str, str]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for uid, where in binds.items():
        out.setdefault(where, []).append(uid.split("-")[1])
    return {k: sorted(v) for k, v in sorted(out.items())}


def job_info(roles: dict[str, int], annotations: dict[str, str]) -> JobInfo:
    return JobInfo(make_job(roles, annotations), ResourceSpace(["cpu"]))


def test_read_topology_parses_groups() -> None:
    """topology_test.go "correct annotation"."""
    topo = read_topology(
        job_info(
            {"ps": 2, "worker": 2, "chief": 1, "evaluator": 1},
            {
                "volcano.sh/task-topology-affinity": "ps,worker;ps,chief",
                "volcano.sh/task-topology-anti-affinity": "ps;worker,chief",
                "volcano.sh/task-topology-task-order": "ps,worker,chief,evaluator",
            },
        )
    )
    assert topo is not None
    assert topo.affinity == [["ps", "worker"], ["ps", "chief"]]
    assert topo.anti_affinity == [["ps"], ["worker", "chief"]]
    assert topo.task_order == ["ps", "worker", "chief", "evaluator"]


def test_read_topology_without_annotations_is_none() -> None:
    """topology_test.go "nil annotation"."""
    assert read_topology(job_info({"ps": 1}, {})) is None


@pytest.mark.parametrize(
    ("annotations", "message"),
    [
        (
            {"volcano.sh/task-topology-affinity": "$%GF$^trtqwrg^"},
            "task $%GF$^trtqwrg^ do not exist in job <default/job1>",
        ),
        (
            {"volcano.sh/task-topology-task-order": "ps,worker,chief"},
            "task chief do not exist in job <default/job1>",
        ),
        (
            {"volcano.sh/task-topology-affinity": "ps,ps"},
            "task ps is duplicate in job <default/job1>",
        ),
    ],
)
def test_read_topology_rejects_unknown_or_duplicate_roles(
    annotations: dict[str, str], message: str
) -> None:
    """topology_test.go "invalid annotation" / "invalid task name": the error names the role."""
    with pytest.raises(ValueError, match=message.replace("$", r"\$").replace("^", r"\^")):
        read_topology(job_info({"ps": 2, "worker": 2}, annotations))


def test_affinity_co_locates_roles() -> None:
    """Inter-affinity ps,worker: the bucket holds ps and both workers; node order steers them all
    to one node (n2 sorts after n1 but nothing distinguishes them before the first placement)."""
    binds = run(
        make_job({"ps": 1, "worker": 2}, {"volcano.sh/task-topology-affinity": "ps,worker"}),
        nodes(3),
    )
    assert len(binds) == 3
    assert len(set(binds.values())) == 1


def test_self_anti_affinity_spreads_a_role() -> None:
    """Self anti-affinity on worker: every worker gets its own bucket and lands on its own node."""
    binds = run(
        make_job({"worker": 3}, {"volcano.sh/task-topology-anti-affinity": "worker"}), nodes(3)
    )
    assert len(binds) == 3
    assert len(set(binds.values())) == 3


def test_affinity_and_anti_affinity_together() -> None:
    """ps with worker, but ps apart from ps: two buckets, each one ps with one worker."""
    binds = run(
        make_job(
            {"ps": 2, "worker": 2},
            {
                "volcano.sh/task-topology-affinity": "ps,worker",
                "volcano.sh/task-topology-anti-affinity": "ps",
            },
        ),
        nodes(4),
    )
    placed = roles_per_node(binds)
    assert sorted(placed.values()) == [["ps", "worker"], ["ps", "worker"]]


def test_without_plugin_tasks_spread_differently() -> None:
    """Control: the same job under plain predicates + nodeorder (least requested) spreads, so the
    co-location above is the plugin's doing."""
    gang = make_job({"ps": 1, "worker": 2}, {"volcano.sh/task-topology-affinity": "ps,worker"})
    binds = cycle(
        snapshot(nodes(3), [gang], [queue("q")]), CONFIG.replace("task-topology", "nodeorder")
    ).binds
    assert len(set(binds.values())) == 3


def test_placed_task_anchors_its_bucket() -> None:
    """Tasks already on a node form that node's bucket; affine pending tasks join it and the node
    score (bucket tasks on the node) draws them there."""
    gang = make_job(
        {"ps": 1, "worker": 2},
        {"volcano.sh/task-topology-affinity": "ps,worker"},
        placed={"default/job1-ps-0": "n3"},
    )
    gang.min_member = 1
    binds = run(gang, nodes(3))
    assert binds == {"default/job1-worker-0": "n3", "default/job1-worker-1": "n3"}


def test_task_order_puts_bucketed_tasks_and_ranked_roles_first() -> None:
    """TaskOrderFn: tasks in a bucket before tasks outside any; same bucket: the role earlier in
    volcano.sh/task-topology-task-order first."""
    gang = make_job(
        {"ps": 1, "worker": 1, "evaluator": 1},
        {
            "volcano.sh/task-topology-affinity": "ps,worker",
            "volcano.sh/task-topology-task-order": "worker,ps",
        },
    )
    ssn = session(
        snapshot(nodes(1), [gang], [queue("q")]),
        "extension_points_not_listed: disabled\ntiers:\n- plugins:\n  - name: task-topology\n    enableTaskOrder: true\n",
    )
    ps, worker, ev = (ssn.tasks[f"default/job1-{r}-0"] for r in ("ps", "worker", "evaluator"))
    assert ssn.task_order_fn(worker, ps) is True
    assert ssn.task_order_fn(ps, worker) is False
    assert ssn.task_order_fn(ps, ev) is True
    assert ssn.task_order_fn(ev, ps) is False


def test_node_score_scales_by_bucket_size_and_weight() -> None:
    """NodeOrderFn: (bucket tasks on node + unplaced bucket tasks) * weight * 100 / max bucket size;
    0 on a node the task does not fit (idle + releasing)."""
    gang = make_job(
        {"ps": 1, "worker": 1},
        {"volcano.sh/task-topology-affinity": "ps,worker"},
        placed={"default/job1-ps-0": "n1"},
    )
    ssn = session(
        snapshot([*nodes(2), node("n3", "500m", "1G")], [gang], [queue("q")]),
        "extension_points_not_listed: disabled\ntiers:\n- plugins:\n"
        "  - name: task-topology\n    enableNodeOrder: true\n    arguments: {task-topology.weight: 2}\n",
    )
    worker = ssn.tasks["default/job1-worker-0"]
    scores = ssn.evaluator.scores(worker, np.array([0, 1, 2]))
    # bucket: ps on n1 (bound) + worker (unplaced); max bucket size 2.
    assert list(scores) == [(1 + 1) * 2 * 100 / 2, (0 + 1) * 2 * 100 / 2, 0.0]
