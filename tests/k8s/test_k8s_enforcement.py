"""Binding and eviction edge cases, restarts of the adapter and of the Muster server."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from muster.v1 import muster_pb2 as pb

from .conftest import Env, eventually, open_env
from .fake_apiserver import make_node, make_pod, make_volcano_podgroup
from .mini_muster import MiniMuster, MiniMusterHandle


def _bind(task_id: str, node: str, decision_id: int = 999) -> pb.Decision:
    return pb.Decision(
        id=decision_id, cycle_id=1, bind=pb.BindDecision(task_id=task_id, job_id="x", node=node)
    )


async def _one_pending_pod(env: Env) -> tuple:
    env.kube.put_object(make_node("n0", cpu="1"))
    env.kube.put_object(make_node("n1", cpu="1"))
    env.kube.put_object(make_pod("busy", cpu="1", scheduler="default-scheduler", node="n0"))
    env.kube.put_object(make_pod("busy2", cpu="1", scheduler="default-scheduler", node="n1"))
    env.kube.put_object(make_pod("p", cpu="1"))
    backend = await env.start_adapter()
    await eventually(lambda: "default/p" in backend.pod_task)
    return backend, backend.pod_task["default/p"]


async def test_binding_409_when_another_scheduler_bound_the_pod_first(env: Env) -> None:
    backend, task_id = await _one_pending_pod(env)
    pod = env.pod("p")
    pod["spec"]["nodeName"] = "n0"  # someone else binds it; the adapter's cache has not seen it yet
    env.kube.put_object(pod)
    outcome = await backend.apply_bind(_bind(task_id, "n1"))
    assert not outcome.applied
    assert "409" in outcome.reason
    assert "already assigned" in outcome.reason
    assert env.pod("p")["spec"]["nodeName"] == "n0"


async def test_binding_404_when_the_pod_is_gone(env: Env) -> None:
    backend, task_id = await _one_pending_pod(env)
    env.kube.delete_object("v1", "Pod", "p", "default")  # not yet seen by the informer
    outcome = await backend.apply_bind(_bind(task_id, "n1"))
    assert not outcome.applied
    assert "404" in outcome.reason


async def test_bind_to_not_ready_node_is_rejected_without_calling_the_api(env: Env) -> None:
    backend, task_id = await _one_pending_pod(env)
    env.kube.put_object(make_node("n1", cpu="1", ready=False))
    await eventually(
        lambda: backend.nodes.cache["n1"]["status"]["conditions"][0]["status"] != "True"
    )
    outcome = await backend.apply_bind(_bind(task_id, "n1"))
    assert not outcome.applied
    assert "NotReady" in outcome.reason
    assert env.bind_posts("p") == 0


async def test_eviction_429_is_retried_with_backoff_then_succeeds(env: Env) -> None:
    env.kube.put_object(make_node("n0", cpu="4"))
    env.kube.put_object(make_volcano_podgroup("pg", min_member=2))
    for i in range(2):
        env.kube.put_object(make_pod(f"w{i}", cpu="1", group="pg"))
    await env.start_adapter()
    await eventually(lambda: all(env.pod(f"w{i}")["spec"].get("nodeName") for i in range(2)))
    refusals = {"n": 0}

    def budget(pod: dict) -> bool:
        refusals["n"] += 1
        return refusals["n"] <= 2  # the budget says no twice, then yes

    env.kube.set_eviction_hook(budget)
    await env.muster.servicer.CancelJob(pb.CancelJobRequest(id="k8s:default:pg"), None)
    await eventually(
        lambda: (
            env.kube.get_object("v1", "Pod", "w0", "default") is None
            and env.kube.get_object("v1", "Pod", "w1", "default") is None
        )
    )
    evictions = [p for m, p in env.kube.requests if m == "POST" and p.endswith("/eviction")]
    assert len(evictions) == 4  # two refused with 429, then one per pod
    acks = env.muster.servicer.acked
    await eventually(
        lambda: sum(1 for a in acks.values() if a.applied) == 4
    )  # 2 binds + 2 evictions


async def test_eviction_refused_by_budget_every_time_is_rejected(env: Env) -> None:
    env.kube.put_object(make_node("n0", cpu="4"))
    env.kube.put_object(make_pod("solo", cpu="1"))
    await env.start_adapter()
    await eventually(lambda: env.pod("solo")["spec"].get("nodeName") == "n0")
    env.kube.set_eviction_hook(lambda pod: True)
    await env.muster.servicer.CancelJob(pb.CancelJobRequest(id="k8s:default:pod:solo"), None)
    acks = env.muster.servicer.acked
    await eventually(lambda: any(not a.applied for a in acks.values()))
    reason = next(a.reason for a in acks.values() if not a.applied)
    assert "429" in reason
    assert "disruption budget" in reason
    assert env.kube.get_object("v1", "Pod", "solo", "default") is not None


async def test_adapter_restart_resyncs_without_double_binding(env: Env) -> None:
    env.kube.put_object(make_node("n0", cpu="8"))
    env.kube.put_object(make_volcano_podgroup("pg", min_member=3))
    for i in range(3):
        env.kube.put_object(make_pod(f"w{i}", cpu="1", group="pg", task_spec="worker"))
    first = await env.start_adapter()
    await eventually(lambda: all(env.pod(f"w{i}")["spec"].get("nodeName") for i in range(3)))
    await eventually(lambda: len(env.muster.servicer.acked) == 3)
    await env.stop_adapter(first)
    assert env.bind_posts() == 3

    # The acks were lost with the old adapter: the server still thinks the binds are in flight.
    servicer = env.muster.servicer
    servicer.acked.clear()
    for t in servicer.jobs["k8s:default:pg"].tasks:
        t.status = pb.TASK_STATUS_BINDING
    second = await env.start_adapter()
    await eventually(lambda: len(servicer.acked) == 3)
    assert all(a.applied for a in servicer.acked.values())  # recognised as already done
    assert env.bind_posts() == 3  # and not bound again
    assert second.jobs["k8s:default:pg"].tasks == first.jobs["k8s:default:pg"].tasks
    assert [t.status for t in servicer.jobs["k8s:default:pg"].tasks] == [pb.TASK_STATUS_BOUND] * 3
    assert len(servicer.jobs) == 1


async def test_adapter_restart_after_pods_changed_adopts_the_servers_mapping(env: Env) -> None:
    env.kube.put_object(make_node("n0", cpu="8"))
    env.kube.put_object(make_volcano_podgroup("pg", min_member=2))
    for i in range(3):
        env.kube.put_object(make_pod(f"w{i}", cpu="1", group="pg"))
    first = await env.start_adapter()
    await eventually(lambda: all(env.pod(f"w{i}")["spec"].get("nodeName") for i in range(3)))
    mapping = dict(first.pod_task)
    await env.stop_adapter(first)
    env.kube.delete_object("v1", "Pod", "w0", "default")  # the spec the new adapter derives differs
    second = await env.start_adapter()
    await eventually(lambda: "default/w1" in second.pod_task)
    assert second.pod_task["default/w1"] == mapping["default/w1"]
    assert second.pod_task["default/w2"] == mapping["default/w2"]


async def test_muster_server_restart_adapter_reconnects(env: Env) -> None:
    env.kube.put_object(make_node("n0", cpu="8"))
    env.kube.put_object(make_pod("before", cpu="1"))
    backend = await env.start_adapter()
    await eventually(lambda: env.pod("before")["spec"].get("nodeName") == "n0")
    await env.muster.stop()
    env.kube.put_object(make_pod("during", cpu="1"))  # created while the server is down
    await eventually(lambda: not backend.runtime.connected)
    await env.muster.start()  # same port, same state
    await eventually(lambda: backend.runtime.sessions >= 2)
    await eventually(lambda: env.pod("during")["spec"].get("nodeName") == "n0")
    assert env.bind_posts("before") == 1


async def test_volcano_queue_becomes_a_muster_queue(env: Env) -> None:
    env.kube.put_object(make_node("n0", cpu="8"))
    env.kube.put_object(
        {
            "apiVersion": "scheduling.volcano.sh/v1beta1",
            "kind": "Queue",
            "metadata": {"name": "research"},
            "spec": {"weight": 3, "capability": {"cpu": "4"}, "reclaimable": False},
        }
    )
    env.kube.put_object(make_volcano_podgroup("pg", min_member=1, queue="research"))
    env.kube.put_object(make_pod("w", cpu="1", group="pg"))
    await env.start_adapter()
    await eventually(lambda: env.pod("w")["spec"].get("nodeName") == "n0")
    queue = env.muster.servicer.queues["research"]
    assert queue.weight == 3
    assert queue.capability.quantities["cpu"] == "4"
    assert not queue.reclaimable
    assert env.muster.servicer.jobs["k8s:default:pg"].spec.queue == "research"


async def _expired_bind_then_rebind_elsewhere(env: Env) -> None:
    """Pod p is bound to n0; the server then loses track of it (as when its bind deadline passes)
    and wants it on n1. The adapter refuses (the pod is on n0) and tells the server where it is."""
    env.kube.put_object(make_node("n0", cpu="1"))
    env.kube.put_object(make_node("n1", cpu="1"))
    env.kube.put_object(make_pod("p", cpu="1"))
    backend = await env.start_adapter()
    await eventually(lambda: env.pod("p")["spec"].get("nodeName") == "n0")
    servicer = env.muster.servicer
    task_id = backend.pod_task["default/p"]
    # The bind's ack and the adapter's BOUND report are two RPCs, and the report may land after
    # the ack. Both must be in before the expiry is simulated: a report landing after it places
    # the task on n0 again (rightly: that is where the pod is) and no rebind is ever decided.
    await eventually(
        lambda: (
            len(servicer.acked) == 1
            and any(
                d.task_status.task_id == task_id and d.task_status.status == pb.TASK_STATUS_BOUND
                for d in servicer.deltas
            )
        )
    )
    # The server lost track (its bind deadline passed) and now wants the pod on n1.
    task = servicer.jobs["k8s:default:pod:p"].tasks[0]
    task.status, task.node = pb.TASK_STATUS_PENDING, ""
    servicer.nodes["n0"].unschedulable = True
    servicer.poke()
    await eventually(lambda: any(not a.applied for a in servicer.acked.values()))
    # Settled: the task is where the pod is, and no decision is left in flight.
    await eventually(
        lambda: (
            task.status == pb.TASK_STATUS_BOUND
            and task.node == "n0"
            and len(servicer.acked) == len(servicer.decisions)
        )
    )
    assert env.pod("p")["spec"]["nodeName"] == "n0"
    assert env.bind_posts("p") == 1


async def test_expired_bind_then_rebind_elsewhere_reports_where_the_pod_really_is(env: Env) -> None:
    await _expired_bind_then_rebind_elsewhere(env)


async def _until(predicate: Callable[[], bool], limit: float) -> None:
    """Wait until ``predicate`` holds or ``limit`` seconds passed (whichever is first)."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(limit):
            while not predicate():
                await asyncio.sleep(0.005)


def _reports_status(request: pb.SendDeltasRequest) -> bool:
    return any(d.WhichOneof("change") == "task_status" for d in request.deltas)


class _ReportLandsAfterTheExpiry(MiniMuster):
    """Forces this ordering: the adapter's BOUND report for the first bind reaches the server only
    after the test has simulated the expiry (the task is Pending again), and before any cycle."""

    def __init__(self) -> None:
        super().__init__()
        self.holding = 0

    async def SendDeltas(self, request, context):
        if _reports_status(request):
            self.holding += 1
            try:
                await _until(
                    lambda: all(
                        t.status == pb.TASK_STATUS_PENDING
                        for j in self.jobs.values()
                        for t in j.tasks
                    ),
                    0.5,
                )
            finally:
                self.holding -= 1
        return await super().SendDeltas(request, context)

    def cycle(self) -> None:
        if self.holding:
            self.poke()  # a report is on its way: it lands first
            return
        super().cycle()


class _CycleRunsBeforeTheReport(MiniMuster):
    """Forces this ordering: after every ack, a cycle runs before the adapter's next status report
    lands (a rejected bind's ack, then a cycle that binds the task again, then the report of where
    the pod really is)."""

    def __init__(self) -> None:
        super().__init__()
        self.cycles_at_ack = 0

    async def AckDecisions(self, request, context):
        self.cycles_at_ack = self.cycles
        return await super().AckDecisions(request, context)

    async def SendDeltas(self, request, context):
        if _reports_status(request):
            await _until(lambda: self.cycles > self.cycles_at_ack, 1.0)
        return await super().SendDeltas(request, context)


async def test_expired_bind_then_rebind_when_the_bound_report_lands_after_the_expiry() -> None:
    async with open_env(MiniMusterHandle(_ReportLandsAfterTheExpiry())) as env:
        await _expired_bind_then_rebind_elsewhere(env)


async def test_expired_bind_then_rebind_when_a_cycle_runs_between_the_reject_and_the_report() -> (
    None
):
    async with open_env(MiniMusterHandle(_CycleRunsBeforeTheReport())) as env:
        await _expired_bind_then_rebind_elsewhere(env)


async def test_ascend_chips_are_read_from_the_node_and_written_on_the_pod_before_binding(
    env: Env,
) -> None:
    from adapters.k8s import translate as tr

    node = make_node("npu", cpu="8")
    node["status"]["allocatable"]["huawei.com/Ascend910"] = "7"
    node["metadata"]["annotations"] = {
        "huawei.com/Ascend910": ",".join(f"Ascend910-{i}" for i in range(7)),
        "huawei.com/Ascend910-Unhealthy": "Ascend910-7",
    }
    devices = tr.node_to_pb(node).devices
    assert [(d.id, d.group, d.healthy) for d in devices] == [
        *((f"Ascend910-{i}", str(i // 4), True) for i in range(7)),
        ("Ascend910-7", "1", False),
    ]
    env.kube.put_object(node)
    env.kube.put_object(make_pod("p", cpu="1"))
    backend = await env.start_adapter()
    await eventually(lambda: "default/p" in backend.pod_task and "npu" in backend.nodes.cache)
    decision = _bind(backend.pod_task["default/p"], "npu")
    decision.bind.devices.extend(["Ascend910-4", "Ascend910-5"])
    decision.bind.request.quantities.update({"cpu": "1", "huawei.com/Ascend910": "2"})
    outcome = await backend.apply_bind(decision)
    assert outcome.applied, outcome.reason
    pod = env.pod("p")
    assert pod["metadata"]["annotations"]["huawei.com/Ascend910"] == "Ascend910-4,Ascend910-5"
    assert pod["spec"]["nodeName"] == "npu"
