"""BackendRuntime against an in-test server: sync, ack, dedup, ordering, reconnect, batching."""

from __future__ import annotations

import socket

import anyio
import pytest
from muster_fake_server import (
    FakeScheduler,
    FakeServerHandle,
    SinglesOnlyScheduler,
    bind,
    eventually,
    evict,
)

from adapters.runtime import BackendRuntime, DecisionLedger, FileDecisionLedger, Outcome, Rejected
from muster.v1 import muster_pb2 as pb


class RecordingBackend:
    def __init__(self) -> None:
        self.applied: list[int] = []
        self.batches: list[list[int]] = []
        self.runtime: BackendRuntime | None = None

    async def list_nodes(self):
        return [pb.Node(name="n1", allocatable=pb.ResourceList(quantities={"cpu": "4"}))]

    async def list_tasks(self):
        return [
            pb.BackendTask(task_id=f"t{i}", node="n1", status=pb.TASK_STATUS_RUNNING)
            for i in self.applied
        ]

    async def apply_bind(self, decision):
        if decision.bind.task_id == "bad":
            raise Rejected("node n1 has no room")
        self.applied.append(decision.id)
        assert self.runtime is not None
        # A status change raised while applying must reach the server after the ack.
        self.runtime.report_task_status(decision.bind.task_id, pb.TASK_STATUS_RUNNING, node="n1")

    async def apply_evict(self, decision):
        self.applied.append(decision.id)


async def start(backend, handle, **kw) -> BackendRuntime:
    runtime = BackendRuntime(
        backend, server=handle.address, name="rack", backoff_initial=0.05, backoff_max=0.2, **kw
    )
    backend.runtime = runtime
    return runtime


@pytest.fixture
async def handle():
    h = FakeServerHandle(FakeScheduler())
    await h.start()
    yield h
    await h.stop()


async def test_sync_apply_ack_and_reject(handle):
    backend = RecordingBackend()
    runtime = await start(backend, handle)
    async with anyio.create_task_group() as tg:
        tg.start_soon(runtime.run)
        await runtime.wait_ready()
        snap = handle.servicer.rec.snapshots[0]
        assert snap.backend == "rack"
        assert [n.name for n in snap.nodes] == ["n1"]
        await handle.servicer.push(bind(1, "a"))
        await handle.servicer.push(bind(2, "bad"))
        await eventually(lambda: len(handle.servicer.rec.acks) == 2)
        acks = {a.decision_id: a for a in handle.servicer.rec.acks}
        assert acks[1].applied
        assert not acks[2].applied
        assert "no room" in acks[2].reason
        await eventually(lambda: "delta:a:6" in handle.servicer.rec.order)
        order = handle.servicer.rec.order
        assert order.index("ack:1") < order.index("delta:a:6")
        runtime.stop()


async def test_duplicate_decision_is_reacked_not_reapplied(handle):
    backend = RecordingBackend()
    runtime = await start(backend, handle)
    async with anyio.create_task_group() as tg:
        tg.start_soon(runtime.run)
        await runtime.wait_ready()
        await handle.servicer.push(bind(7, "a"))
        await eventually(lambda: len(handle.servicer.rec.acks) == 1)
        # The server "forgets" the ack and resends the same decision (e.g. a lost ack).
        handle.servicer.acked.clear()
        await handle.servicer.push(bind(7, "a"))
        await eventually(lambda: len(handle.servicer.rec.acks) == 2)
        assert backend.applied == [7]
        assert all(a.decision_id == 7 and a.applied for a in handle.servicer.rec.acks)
        runtime.stop()


async def test_reconnect_resyncs_and_resumes_after_last_applied():
    servicer = FakeScheduler()
    handle = FakeServerHandle(servicer)
    await handle.start()
    port = handle.port
    backend = RecordingBackend()
    runtime = await start(backend, handle)
    async with anyio.create_task_group() as tg:
        tg.start_soon(runtime.run)
        await runtime.wait_ready()
        await servicer.push(bind(1, "a"))
        await eventually(lambda: len(servicer.rec.acks) == 1)
        await handle.stop()
        await eventually(lambda: not runtime.connected)
        # Status changes while disconnected are queued, not lost.
        runtime.report_task_status("a", pb.TASK_STATUS_SUCCEEDED, node="n1")
        await anyio.sleep(0.3)
        await handle.start(port)
        await eventually(lambda: len(servicer.rec.snapshots) == 2)
        assert [t.task_id for t in servicer.rec.snapshots[1].tasks] == ["t1"]
        await eventually(lambda: len(servicer.rec.stream_requests) == 2)
        assert servicer.rec.stream_requests[1].after_decision_id == 1
        await eventually(lambda: "delta:a:8" in servicer.rec.order)
        await servicer.push(bind(2, "b"))
        await eventually(lambda: len(servicer.rec.acks) == 2)
        assert backend.applied == [1, 2]
        assert runtime.sessions == 2
        runtime.stop()
    await handle.stop()


@pytest.mark.parametrize(
    ("servicer_type", "rpc"),
    [(FakeScheduler, "StreamDecisionBatches"), (SinglesOnlyScheduler, "StreamDecisions")],
)
async def test_decisions_read_in_batches_or_one_a_message_from_an_older_server(servicer_type, rpc):
    handle = FakeServerHandle(servicer_type())
    await handle.start()
    backend = RecordingBackend()
    runtime = await start(backend, handle, max_batch=2)
    async with anyio.create_task_group() as tg:
        tg.start_soon(runtime.run)
        await runtime.wait_ready()
        for k in range(1, 6):  # pushed together: batches of at most max_batch on the batch feed
            handle.servicer.decisions.append(bind(k, f"t-{k}"))
        await handle.servicer.push(bind(6, "t-6"))
        await eventually(lambda: len(handle.servicer.rec.acks) == 6)
        assert backend.applied == [1, 2, 3, 4, 5, 6]  # every decision once, in order
        assert handle.servicer.rec.stream_rpcs[-1] == rpc
        assert handle.servicer.rec.stream_requests[-1].max_batch == 2
        runtime.stop()
    await handle.stop()


async def test_a_decision_past_grpcs_default_receive_limit_is_read(handle):
    # A task group with 5 MiB of annotations: each of its binds carries them.
    big = bind(1, "big")
    big.bind.annotations["blob"] = "x" * (5 * 1024 * 1024)
    backend = RecordingBackend()
    runtime = await start(backend, handle)
    async with anyio.create_task_group() as tg:
        tg.start_soon(runtime.run)
        await runtime.wait_ready()
        await handle.servicer.push(big)
        await eventually(lambda: len(handle.servicer.rec.acks) == 1)
        assert backend.applied == [1]
        assert handle.servicer.rec.acks[0].applied
        runtime.stop()


async def test_new_server_identity_clears_ledger():
    ledger = DecisionLedger()
    ledger.bind_server("s1")
    ledger.record(5, Outcome(True))
    assert not ledger.bind_server("s1")
    assert ledger.get(5) is not None
    assert ledger.bind_server("s2")
    assert ledger.get(5) is None
    assert ledger.high_water == 0


def test_file_ledger_survives_restart(tmp_path):
    path = tmp_path / "ledger.json"
    ledger = FileDecisionLedger(path)
    ledger.bind_server("s1")
    ledger.record(3, Outcome(False, "no room"))
    ledger.flush()
    again = FileDecisionLedger(path)
    assert again.server_id == "s1"
    assert again.high_water == 3
    assert again.get(3) == Outcome(False, "no room")


async def test_batches_group_one_cycle_for_apply_batch(handle):
    class BatchBackend(RecordingBackend):
        async def apply_batch(self, decisions):
            self.batches.append([d.id for d in decisions])
            return [Outcome(True)] * len(decisions)

    backend = BatchBackend()
    runtime = await start(backend, handle, batch_linger=0.2)
    async with anyio.create_task_group() as tg:
        tg.start_soon(runtime.run)
        await runtime.wait_ready()
        for i in range(1, 5):
            await handle.servicer.push(bind(i, f"g-{i}", cycle=9))
        await handle.servicer.push(evict(5, "x", cycle=10))
        await eventually(lambda: len(handle.servicer.rec.acks) == 5)
        assert backend.batches == [[1, 2, 3, 4], [5]]
        runtime.stop()


async def test_refused_delta_is_dropped_others_delivered(handle):
    backend = RecordingBackend()
    runtime = await start(backend, handle)
    async with anyio.create_task_group() as tg:
        tg.start_soon(runtime.run)
        await runtime.wait_ready()
        runtime.remove_node("refuse-me")
        runtime.report_task_status("z", pb.TASK_STATUS_FAILED, node="n1", exit_code=3)
        await eventually(lambda: "delta:z:9" in handle.servicer.rec.order)
        await eventually(lambda: runtime.pending_outbox == 0)
        assert runtime.connected
        assert runtime.sessions == 1
        runtime.stop()


async def test_gives_up_after_max_attempts():
    # A port bound but never listening: connections to it are refused for the whole test.
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{closed.getsockname()[1]}"
        runtime = BackendRuntime(
            RecordingBackend(),
            server=address,
            name="x",
            backoff_initial=0.01,
            backoff_max=0.02,
            max_attempts=2,
        )
        with anyio.fail_after(20):
            await runtime.run()
    assert runtime.sessions == 0


def test_file_ledger_keeps_begun_ids_in_doubt_across_a_restart(tmp_path):
    """begin() is durable before the backend sees the ids: a restart finds the ones without an
    outcome in doubt, and a new server identity forgets them."""
    path = tmp_path / "ledger.json"
    ledger = FileDecisionLedger(path)
    ledger.bind_server("s1")
    ledger.begin([4, 5])  # ... the process dies before recording (no flush at all)
    again = FileDecisionLedger(path)
    assert again.server_id == "s1"
    assert again.in_doubt(4)
    assert again.in_doubt(5)
    assert again.high_water == 0
    again.begin([6])
    again.record(4, Outcome(True))
    again.flush()
    third = FileDecisionLedger(path)
    assert not third.in_doubt(4)
    assert third.get(4) == Outcome(True)
    assert third.in_doubt(6)
    assert not third.in_doubt(5)
    assert third.bind_server("s2")
    assert not third.in_doubt(6)


class RecallingBackend(RecordingBackend):
    def __init__(self, answer: Outcome | None) -> None:
        super().__init__()
        self.answer = answer
        self.recalled: list[int] = []

    async def recall_outcomes(self, decisions):
        self.recalled += [d.id for d in decisions]
        return [self.answer] * len(decisions)


@pytest.mark.parametrize(
    ("backend", "applied", "acked"),
    [
        (RecallingBackend(Outcome(True, "started pid 7")), [], Outcome(True, "started pid 7")),
        (RecallingBackend(None), [1], Outcome(True, "")),  # the backend never applied it
        (RecordingBackend(), [], None),  # cannot tell: rejected, never applied twice
    ],
    ids=["recalled", "never-applied", "no-recall"],
)
async def test_a_decision_in_doubt_is_recalled_never_applied_twice(
    handle, tmp_path, backend, applied, acked
):
    path = tmp_path / "ledger.json"
    crashed = FileDecisionLedger(path)
    crashed.bind_server(handle.servicer.server_id)
    crashed.begin([1])  # the adapter died applying decision 1
    runtime = await start(backend, handle, ledger=FileDecisionLedger(path))
    async with anyio.create_task_group() as tg:
        tg.start_soon(runtime.run)
        await runtime.wait_ready()
        await handle.servicer.push(bind(1, "a"))
        await eventually(lambda: len(handle.servicer.rec.acks) == 1)
        ack = handle.servicer.rec.acks[0]
        assert backend.applied == applied
        if acked is None:
            assert not ack.applied
            assert "not applied again" in ack.reason
        else:
            assert (ack.applied, ack.reason) == (acked.applied, acked.reason)
            assert backend.recalled == [1]
        runtime.stop()
    assert (
        FileDecisionLedger(path).get(1) is not None
    )  # the outcome is recorded: no longer in doubt


async def test_a_restored_ledger_asks_for_unacked_decisions_it_has_outcomes_for(handle, tmp_path):
    """An outcome recorded just before a crash whose ack never left: the restarted runtime asks
    for every unacknowledged decision (not only those after its highest id) and re-acks it."""
    path = tmp_path / "ledger.json"
    crashed = FileDecisionLedger(path)
    crashed.bind_server(handle.servicer.server_id)
    crashed.record(3, Outcome(False, "no room"))
    crashed.flush()
    handle.servicer.decisions.append(bind(3, "a"))
    backend = RecordingBackend()
    runtime = await start(backend, handle, ledger=FileDecisionLedger(path))
    async with anyio.create_task_group() as tg:
        tg.start_soon(runtime.run)
        await runtime.wait_ready()
        await handle.servicer.push(bind(4, "b"))
        await eventually(lambda: len(handle.servicer.rec.acks) == 2)
        assert handle.servicer.rec.stream_requests[0].after_decision_id == 0
        acks = {a.decision_id: (a.applied, a.reason) for a in handle.servicer.rec.acks}
        assert acks == {3: (False, "no room"), 4: (True, "")}
        assert backend.applied == [4]
        runtime.stop()
