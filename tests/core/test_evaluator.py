"""The evaluator's caches must give the answers a from-scratch evaluation gives."""

from __future__ import annotations

import random

import numpy as np
from core_helpers import session

from muster.quantity import parse_resources
from server.config import DEFAULT_CONFIG_YAML
from server.model import (
    ClusterSnapshot,
    JobSpec,
    NodeSpec,
    PodGroupPhase,
    QueueSpec,
    Taint,
    TaskSpec,
    Toleration,
)

CONFIG = DEFAULT_CONFIG_YAML + """
- plugins:
  - name: binpack
"""


def _cluster(seed: int) -> ClusterSnapshot:
    rng = random.Random(seed)
    nodes = [
        NodeSpec(f"n{i:02d}", parse_resources({"cpu": str(rng.choice([4, 8, 16])), "memory": "32Gi", "pods": "5"}),
                 labels={"zone": f"z{i % 3}"}, taints=[Taint("t", "v", "NoSchedule")] if i % 5 == 0 else [])
        for i in range(30)
    ]
    jobs = []
    for j in range(40):
        uid = f"ns/j{j}"
        req = parse_resources({"cpu": str(rng.choice([1, 2, 3])), "memory": "1Gi"})
        sel = {"zone": "z1"} if j % 7 == 0 else {}
        tol = [Toleration("t", "Exists")] if j % 3 == 0 else []
        tasks = [TaskSpec(f"{uid}-{k}", f"j{j}-{k}", "ns", uid, dict(req), node_selector=sel, tolerations=tol)
                 for k in range(rng.randint(1, 4))]
        jobs.append(JobSpec(uid, f"j{j}", "ns", "default", tasks, min_member=1, phase=PodGroupPhase.INQUEUE,
                            creation_index=j))
    return ClusterSnapshot(nodes, [QueueSpec("default")], jobs)


def test_cached_selection_matches_fresh_evaluation_after_every_allocation() -> None:
    for seed in range(3):
        ssn = session(_cluster(seed), CONFIG)
        ev = ssn.evaluator
        stmt = ssn.statement()
        placed = 0
        for task in sorted(ssn.tasks.values(), key=lambda t: t.uid):
            cached = ev.select(task)
            # A fresh evaluator (no caches) must agree, on masks, scores and choice.
            ev._shape.clear()
            ev._static.clear()
            fresh = ev.select(task)
            assert cached == fresh, (seed, task.uid)
            if cached is not None:
                stmt.allocate(task, ssn.nodes.names[cached[0]])
                placed += 1
        assert placed > 10
        # Never over-committed.
        assert np.all(ssn.nodes.idle >= -0.1)
        assert np.all(ssn.nodes.task_count <= ssn.nodes.max_tasks)
