"""muster.transport's shared pieces: one way to parse an address list, one way to pick the next
server, and a channel over a list that a plain generated stub can use (how the Kubernetes and
Slurm adapters' own calls follow the leader)."""

from __future__ import annotations

import argparse

import anyio
import grpc
import pytest

from muster import transport
from muster.transport import AddressBook, FailoverChannel, parse_addresses, server_arg
from muster.v1 import muster_pb2 as pb
from muster.v1 import muster_pb2_grpc as pb_grpc

from .fakes import Replica, Store, closed_port_address


def test_parse_addresses_trims_drops_empties_and_repeats():
    assert parse_addresses(" a:1 ,b:2,, a:1 ") == ["a:1", "b:2"]
    assert parse_addresses(["a:1", "b:2,c:3"]) == ["a:1", "b:2", "c:3"]
    with pytest.raises(ValueError, match=r"^--agent-server: no server address"):
        parse_addresses(" , ", "--agent-server")
    with pytest.raises(ValueError, match=r"^--server: no server address in \[\]"):
        parse_addresses([])


def test_server_arg_normalizes_and_argparse_names_the_option(capsys):
    parser = argparse.ArgumentParser()
    parser.add_argument("--server", type=server_arg)
    assert parser.parse_args(["--server", "a:1, b:2"]).server == "a:1,b:2"
    with pytest.raises(SystemExit):
        parser.parse_args(["--server", ","])
    assert "argument --server: no server address" in capsys.readouterr().err


def test_the_address_book_follows_hints_then_the_list():
    book = AddressBook("a:1,b:2,c:3")
    assert book.start(leader_only=True) == "a:1"
    error = grpc.aio.AioRpcError(
        grpc.StatusCode.UNAVAILABLE,
        grpc.aio.Metadata(),
        grpc.aio.Metadata((transport.LEADER_METADATA, "z:9")),
    )
    assert transport.leader_hint(error) == "z:9"
    assert book.failed("a:1", error) == "z:9"
    assert book.leader == "z:9"
    assert book.addresses == ["a:1", "b:2", "c:3", "z:9"]  # a leader outside the list joins it
    book.answered("b:2")  # a read served by a replica: reads stay there, writes still lead
    assert book.start(leader_only=False) == "b:2"
    assert book.start(leader_only=True) == "z:9"
    down = grpc.aio.AioRpcError(grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(), None)
    assert transport.leader_hint(down) is None
    assert book.failed("z:9", down) == "a:1"
    assert book.leader is None
    refused = grpc.aio.AioRpcError(
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.aio.Metadata(),
        grpc.aio.Metadata((transport.LEADER_METADATA, "z:9")),
    )
    assert transport.leader_hint(refused) is None  # only UNAVAILABLE carries a hint


async def test_a_plain_stub_over_an_address_list_follows_the_leader():
    store = Store()
    follower = await Replica(store, "follower").start()
    leader = await Replica(store, "leader").start()
    store.leader = leader.address
    sock, dead = closed_port_address()
    try:
        channel = transport.channel(f"{dead},{follower.address}", failover_timeout=3)
        assert isinstance(channel, FailoverChannel)
        async with channel:
            stub = pb_grpc.SchedulerStub(channel)
            job = pb.JobSpec(id="a", task_groups=[pb.TaskGroup(role="w", replicas=1)])
            reply = await stub.SubmitJob(pb.SubmitJobRequest(job=job))
            assert reply.created
            assert channel.current == leader.address
            # A stream opens where the channel is; its failure moves the channel on.
            channel.book.answered(follower.address)
            call = stub.WatchJobs(pb.WatchJobsRequest(send_initial=False))
            # The stream ends with the lost lease's UNAVAILABLE before the follower stops: a stop
            # that overtakes the handler's abort cancels the call instead (CANCELLED: a live
            # server's answer, which rightly keeps the channel where it is). Seen once under a
            # loaded full suite.
            with anyio.fail_after(5):
                while not follower.watching():
                    await anyio.sleep(0.01)
                follower.end_streams()
                while follower.watching():
                    await anyio.sleep(0.01)
            await follower.stop()
            with pytest.raises(grpc.aio.AioRpcError):
                async for _ in call:
                    pass
            assert channel.current != follower.address
            queues = await stub.ListQueues(pb.ListQueuesRequest())
            assert [q.queue.name for q in queues.queues] == ["leader"]
    finally:
        sock.close()
        await follower.stop()
        await leader.stop()


async def test_one_address_is_still_a_plain_channel():
    plain = transport.channel("127.0.0.1:1")
    assert not isinstance(plain, FailoverChannel)
    await plain.close()
    failover = transport.channel("127.0.0.1:1", failover_timeout=0)
    assert isinstance(failover, FailoverChannel)
    await failover.close()


def test_agent_and_slurm_adapter_take_an_address_list(monkeypatch, capsys):
    from adapters.agent.main import build_parser as agent_parser
    from adapters.slurm.adapter import build_parser as slurm_parser

    required = ["--name", "rack", "--inventory", "inv.yaml"]
    args = agent_parser().parse_args(["--server", " a:1, b:2,", *required])
    assert args.server == "a:1,b:2"
    monkeypatch.setenv("MUSTER_SERVER", "c:3,d:4")
    assert agent_parser().parse_args(required).server == "c:3,d:4"
    assert slurm_parser().parse_args(["--server", "a:1 ,b:2"]).server == "a:1,b:2"
    for parser, argv in ((agent_parser(), required), (slurm_parser(), [])):
        with pytest.raises(SystemExit):
            parser.parse_args(["--server", " ,", *argv])
        assert "argument --server: no server address" in capsys.readouterr().err
