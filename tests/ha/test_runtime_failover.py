"""BackendRuntime against fake replicas: it serves the leader (following the ``muster-leader``
hint, moving past a dead address), runs the whole session again on a new leader, never applies a
decision id twice across the switch, and refuses decisions of a replaced leader's term."""

from __future__ import annotations

from collections.abc import AsyncIterator

import anyio
import pytest
from structlog.testing import capture_logs

from adapters.runtime import BackendRuntime, DecisionLedger, FileDecisionLedger, Outcome
from muster.v1 import muster_pb2 as pb

from .fakes import Replica, Store, bind, closed_port_address, eventually


class RecordingBackend:
    def __init__(self) -> None:
        self.applied: list[int] = []

    async def list_nodes(self) -> list[pb.Node]:
        return [pb.Node(name="n1", allocatable=pb.ResourceList(quantities={"cpu": "4"}))]

    async def list_tasks(self) -> list[pb.BackendTask]:
        return []

    async def apply_bind(self, decision: pb.Decision) -> None:
        self.applied.append(decision.id)

    async def apply_evict(self, decision: pb.Decision) -> None:
        self.applied.append(decision.id)


def runtime_for(
    backend: RecordingBackend, server: str | list[str], ledger: DecisionLedger | None = None
) -> BackendRuntime:
    return BackendRuntime(
        backend,
        server=server,
        name="rack",
        ledger=ledger,
        backoff_initial=0.05,
        backoff_max=0.2,
        batch_linger=0.01,
    )


@pytest.fixture
async def replicas() -> AsyncIterator[tuple[Store, Replica, Replica]]:
    store = Store()
    a = await Replica(store, "a").start()
    b = await Replica(store, "b").start()
    try:
        yield store, a, b
    finally:
        await a.stop()
        await b.stop()


def acks_of(*replicas: Replica) -> dict[int, pb.DecisionAck]:
    return {ack.decision_id: ack for r in replicas for ack in r.acks}


async def test_the_hint_leads_to_the_leader_and_a_new_leader_gets_the_whole_session(replicas):
    store, a, b = replicas
    store.leader = b.address
    backend = RecordingBackend()
    runtime = runtime_for(backend, [a.address])  # b, the leader, is not in the list
    async with anyio.create_task_group() as tg:
        tg.start_soon(runtime.run)
        with anyio.fail_after(10):
            await runtime.wait_ready()
        assert a.calls == ["RegisterBackend"]
        assert not a.registers
        assert len(b.registers) == 1
        assert len(b.snapshots) == 1
        assert runtime.address == b.address
        store.push(bind(1, "t1", term=1))
        await eventually(lambda: 1 in acks_of(b))
        assert backend.applied == [1]

        # b loses its lease to a: its streams end UNAVAILABLE naming a, and a's feed resends
        # decision 1 (its ack never reached the store) with decision 2.
        store.leader = a.address
        a.resend_all = True
        store.acked.clear()
        store.push(bind(2, "t2", term=2))
        b.end_streams()
        await eventually(lambda: 2 in acks_of(a))
        await eventually(lambda: 1 in acks_of(a))
        assert len(a.registers) == 1
        assert len(a.snapshots) == 1
        assert a.stream_requests[0].after_decision_id == 1  # resumes after the last acked id
        assert backend.applied == [1, 2]  # decision 1 re-acked, never applied twice
        assert acks_of(a)[1].applied
        assert acks_of(a)[2].applied
        assert runtime.address == a.address
        assert runtime.sessions == 2
        runtime.stop()


async def test_a_dead_address_is_passed_over(replicas):
    store, a, _ = replicas
    store.leader = a.address
    sock, dead = closed_port_address()
    with sock:
        runtime = runtime_for(RecordingBackend(), f"{dead}, {a.address}")
        assert runtime.server == f"{dead},{a.address}"
        async with anyio.create_task_group() as tg:
            tg.start_soon(runtime.run)
            with anyio.fail_after(10):
                await runtime.wait_ready()
            assert len(a.registers) == 1
            assert runtime.address == a.address
            runtime.stop()


async def test_a_decision_of_an_older_term_is_refused_a_newer_one_applied(replicas, tmp_path):
    store, a, _ = replicas
    store.leader = a.address
    path = tmp_path / "ledger.json"
    backend = RecordingBackend()
    runtime = runtime_for(backend, a.address, ledger=FileDecisionLedger(path))
    with capture_logs() as logs:
        async with anyio.create_task_group() as tg:
            tg.start_soon(runtime.run)
            with anyio.fail_after(10):
                await runtime.wait_ready()
            store.push(bind(1, "t1", term=0))  # unreplicated so far: term 0 is fine
            await eventually(lambda: 1 in acks_of(a))
            store.push(bind(2, "t2", term=5))
            await eventually(lambda: 2 in acks_of(a))
            store.push(bind(3, "t3", term=4))  # from the leader term 5 replaced
            store.push(bind(4, "t4", term=0))  # and an unreplicated server's, now stale too
            store.push(bind(5, "t5", term=6))
            await eventually(lambda: {3, 4, 5} <= set(acks_of(a)))
            runtime.stop()
    assert backend.applied == [1, 2, 5]
    acks = acks_of(a)
    assert acks[1].applied
    assert acks[2].applied
    assert acks[5].applied
    assert not acks[3].applied
    assert "term 4" in acks[3].reason
    assert "term 5" in acks[3].reason
    assert not acks[4].applied
    assert "term 0" in acks[4].reason
    stale = [e for e in logs if e["event"] == "decision.stale_term"]
    assert [(e["id"], e["term"], e["highest_term"]) for e in stale] == [(3, 4, 5), (4, 0, 5)]
    assert runtime.highest_term == 6

    # The highest term is durable: a restarted adapter still refuses term 5.
    restored = FileDecisionLedger(path)
    assert restored.term == 6
    assert restored.get(3) == Outcome(False, acks[3].reason)
    store.push(bind(6, "t6", term=5))
    again = runtime_for(backend, a.address, ledger=restored)
    async with anyio.create_task_group() as tg:
        tg.start_soon(again.run)
        await eventually(lambda: 6 in acks_of(a))
        again.stop()
    assert not acks_of(a)[6].applied
    assert backend.applied == [1, 2, 5]


def test_the_term_is_kept_until_the_server_identity_changes(tmp_path):
    ledger = FileDecisionLedger(tmp_path / "l.json")
    ledger.bind_server("s1")
    assert ledger.observe_term(3)
    assert not ledger.observe_term(2)
    assert ledger.term == 3
    ledger.begin([7])  # the term of a burst begun is durable before its first side effect
    assert FileDecisionLedger(tmp_path / "l.json").term == 3
    ledger.flush()
    (tmp_path / "l.json.applying").unlink()  # the ledger file alone keeps it too
    assert FileDecisionLedger(tmp_path / "l.json").term == 3
    assert ledger.bind_server("s2")
    assert ledger.term == 0


async def test_a_paused_leader_is_left_for_the_one_that_replaced_it(replicas):
    """A stopped server keeps its connections open and answers nothing: the runtime's liveness
    check (ListServers, bounded) notices, and the session moves to the new leader."""
    store, a, b = replicas
    store.leader = a.address
    backend = RecordingBackend()
    runtime = runtime_for(backend, [a.address, b.address])
    runtime.liveness_interval = 0.1
    runtime.liveness_timeout = 0.3
    async with anyio.create_task_group() as tg:
        tg.start_soon(runtime.run)
        with anyio.fail_after(10):
            await runtime.wait_ready()
        assert runtime.address == a.address
        a.paused = True  # a stops; b takes the lease
        store.leader, store.term = b.address, 2
        store.push(bind(1, "t1", term=2))
        with anyio.fail_after(5):
            await eventually(lambda: 1 in acks_of(b))
        assert backend.applied == [1]
        assert len(b.registers) == 1  # the whole session again, on b
        a.paused = False
        runtime.stop()


async def test_a_server_naming_another_leader_is_left(replicas):
    """A deposed leader that still serves (its streams open) says who leads now: the runtime
    moves there without waiting for its stream to end."""
    store, a, b = replicas
    store.leader = a.address
    backend = RecordingBackend()
    runtime = runtime_for(backend, [a.address, b.address])
    runtime.liveness_interval = 0.1
    async with anyio.create_task_group() as tg:
        tg.start_soon(runtime.run)
        with anyio.fail_after(10):
            await runtime.wait_ready()
        a.believes_it_leads = True  # it serves on; only ListServers (the store) names b
        store.leader = b.address
        with anyio.fail_after(5):
            await eventually(lambda: len(b.registers) == 1)
        assert runtime.address == b.address
        runtime.stop()
