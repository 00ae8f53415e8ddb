"""task-topology plugin: behaviour of Volcano's plugins/task-topology (topology.go, manager.go,
bucket.go, topology_test.go)."""

from __future__ import annotations

import pytest

from server.config import load_config
from server.model import (
    ClusterSnapshot,
    JobSpec,
    NodeSpec,
    PodGroupPhase,
    QueueSpec,
    TaskSpec,
    TaskStatus,
)
from server.plugins.task_topology import read_topology
from server.scheduler import SchedulerCore
from server.session.info import JobInfo, ResourceSpace
from server.session.session import Session

CONFIG = """
actions: "allocate"
tiers:
- plugins:
  - name: gang
  - name: predicates
  - name: task-topology
"""


def make_job(roles: dict[str, int], annotations: dict[str, str], *, cpu: float = 1000,
             placed: dict[str, str] | None = None) -> JobSpec:
    tasks = []
    i = 0
    for role, n in roles.items():
        for k in range(n):
            uid = f"default/job1-{role}-{k}"
            node = (placed or {}).get(uid)
            tasks.append(TaskSpec(uid=uid, name=f"job1-{role}-{k}", namespace="default", job="default/job1",
                                  role=role, request={"cpu": cpu}, creation_index=i,
                                  status=TaskStatus.RUNNING if node else TaskStatus.PENDING, node=node))
            i += 1
    return JobSpec(uid="default/job1", name="job1", namespace="default", queue="q", tasks=tasks,
                   phase=PodGroupPhase.INQUEUE, annotations=annotations)


def nodes(n: int, cpu: float = 8000) -> list[NodeSpec]:
    return [NodeSpec(f"n{i}", {"cpu": cpu, "memory": 64e9, "pods": 110}) for i in range(1, n + 1)]


def run(job: JobSpec, node_list: list[NodeSpec]) -> dict[str, str]:
    snap = ClusterSnapshot(nodes=node_list, queues=[QueueSpec("q")], jobs=[job])
    return SchedulerCore(load_config(CONFIG)).run_cycle(snap, 1).binds


def roles_per_node(binds: dict[str, str]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for uid, node in binds.items():
        out.setdefault(node, []).append(uid.split("-")[1])
    return {k: sorted(v) for k, v in sorted(out.items())}


def job_info(roles: dict[str, int], annotations: dict[str, str]) -> JobInfo:
    return JobInfo(make_job(roles, annotations), ResourceSpace(["cpu"]))


def test_read_topology_parses_groups() -> None:
    """topology_test.go "correct annotation"."""
    topo = read_topology(job_info(
        {"ps": 2, "worker": 2, "chief": 1, "evaluator": 1},
        {"volcano.sh/task-topology-affinity": "ps,worker;ps,chief",
         "volcano.sh/task-topology-anti-affinity": "ps;worker,chief",
         "volcano.sh/task-topology-task-order": "ps,worker,chief,evaluator"}))
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
        ({"volcano.sh/task-topology-affinity": "$%GF$^trtqwrg^"}, "task $%GF$^trtqwrg^ do not exist in job <default/job1>"),
        ({"volcano.sh/task-topology-task-order": "ps,worker,chief"}, "task chief do not exist in job <default/job1>"),
        ({"volcano.sh/task-topology-affinity": "ps,ps"}, "task ps is duplicate in job <default/job1>"),
    ],
)
def test_read_topology_rejects_unknown_or_duplicate_roles(annotations: dict[str, str], message: str) -> None:
    """topology_test.go "invalid annotation" / "invalid task name": the error names the role."""
    with pytest.raises(ValueError, match=message.replace("$", r"\$").replace("^", r"\^")):
        read_topology(job_info({"ps": 2, "worker": 2}, annotations))


def test_affinity_co_locates_roles() -> None:
    """Inter-affinity ps,worker: the bucket holds ps and both workers; node order steers them all
    to one node (n2 sorts after n1 but nothing distinguishes them before the first placement)."""
    binds = run(make_job({"ps": 1, "worker": 2}, {"volcano.sh/task-topology-affinity": "ps,worker"}), nodes(3))
    assert len(binds) == 3
    assert len(set(binds.values())) == 1


def test_self_anti_affinity_spreads_a_role() -> None:
    """Self anti-affinity on worker: every worker gets its own bucket and lands on its own node."""
    binds = run(make_job({"worker": 3}, {"volcano.sh/task-topology-anti-affinity": "worker"}), nodes(3))
    assert len(binds) == 3
    assert len(set(binds.values())) == 3


def test_affinity_and_anti_affinity_together() -> None:
    """ps with worker, but ps apart from ps: two buckets, each one ps with one worker."""
    binds = run(make_job({"ps": 2, "worker": 2}, {
        "volcano.sh/task-topology-affinity": "ps,worker",
        "volcano.sh/task-topology-anti-affinity": "ps"}), nodes(4))
    placed = roles_per_node(binds)
    assert sorted(placed.values()) == [["ps", "worker"], ["ps", "worker"]]


def test_without_plugin_tasks_spread_differently() -> None:
    """Control: the same job under plain predicates + nodeorder (least requested) spreads, so the
    co-location above is the plugin's doing."""
    job = make_job({"ps": 1, "worker": 2}, {"volcano.sh/task-topology-affinity": "ps,worker"})
    snap = ClusterSnapshot(nodes=nodes(3), queues=[QueueSpec("q")], jobs=[job])
    cfg = load_config(CONFIG.replace("task-topology", "nodeorder"))
    assert len(set(SchedulerCore(cfg).run_cycle(snap, 1).binds.values())) == 3


def test_placed_task_anchors_its_bucket() -> None:
    """Tasks already on a node form that node's bucket; affine pending tasks join it and the node
    score (bucket tasks on the node) draws them there."""
    job = make_job({"ps": 1, "worker": 2}, {"volcano.sh/task-topology-affinity": "ps,worker"},
                   placed={"default/job1-ps-0": "n3"})
    job.min_member = 1
    binds = run(job, nodes(3))
    assert binds == {"default/job1-worker-0": "n3", "default/job1-worker-1": "n3"}


def test_task_order_puts_bucketed_tasks_and_ranked_roles_first() -> None:
    """TaskOrderFn: tasks in a bucket before tasks outside any; same bucket: the role earlier in
    volcano.sh/task-topology-task-order first."""
    job = make_job({"ps": 1, "worker": 1, "evaluator": 1}, {
        "volcano.sh/task-topology-affinity": "ps,worker",
        "volcano.sh/task-topology-task-order": "worker,ps"})
    snap = ClusterSnapshot(nodes=nodes(1), queues=[QueueSpec("q")], jobs=[job])
    ssn = Session(snap, load_config("extension_points_not_listed: disabled\ntiers:\n- plugins:\n"
                                    "  - name: task-topology\n    enableTaskOrder: true\n"))
    ps, worker, ev = (ssn.tasks[f"default/job1-{r}-0"] for r in ("ps", "worker", "evaluator"))
    assert ssn.task_order_fn(worker, ps) is True
    assert ssn.task_order_fn(ps, worker) is False
    assert ssn.task_order_fn(ps, ev) is True
    assert ssn.task_order_fn(ev, ps) is False


def test_node_score_scales_by_bucket_size_and_weight() -> None:
    """NodeOrderFn: (bucket tasks on node + unplaced bucket tasks) * weight * 100 / max bucket size;
    0 on a node the task does not fit (idle + releasing)."""
    job = make_job({"ps": 1, "worker": 1}, {"volcano.sh/task-topology-affinity": "ps,worker"},
                   placed={"default/job1-ps-0": "n1"})
    snap = ClusterSnapshot(nodes=[*nodes(2), NodeSpec("n3", {"cpu": 500, "memory": 1e9})], queues=[QueueSpec("q")],
                           jobs=[job])
    ssn = Session(snap, load_config("extension_points_not_listed: disabled\ntiers:\n- plugins:\n"
                                    "  - name: task-topology\n    enableNodeOrder: true\n"
                                    "    arguments: {task-topology.weight: 2}\n"))
    worker = ssn.tasks["default/job1-worker-0"]
    import numpy as np

    scores = ssn.evaluator.scores(worker, np.array([0, 1, 2]))
    # bucket: ps on n1 (bound) + worker (unplaced); max bucket size 2.
    assert list(scores) == [(1 + 1) * 2 * 100 / 2, (0 + 1) * 2 * 100 / 2, 0.0]
