"""The `muster` CLI with a replicated deployment: `muster servers`, address lists in --server and
MUSTER_SERVER, and a write sent to a follower landing on the leader."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from concurrent import futures

import grpc
import pytest

from clients import cli
from muster.transport import LEADER_METADATA
from muster.v1 import muster_pb2 as pb
from muster.v1 import muster_pb2_grpc as pb_grpc

from .fakes import closed_port_address


def server_info(address: str, role: str, age: float, lag: float = 0.0) -> pb.ServerInfo:
    info = pb.ServerInfo(id=f"id-{address}", address=address, role=role, term=7, lag_seconds=lag)
    info.last_renewal.FromNanoseconds(int((time.time() - age) * 1e9))
    return info


class Replicated(pb_grpc.SchedulerServicer):
    def __init__(self, leader: str = "") -> None:
        self.leader = leader  # "" for the leader itself
        self.cancels: list[str] = []

    def ListServers(self, request, context):
        return pb.ListServersResponse(
            servers=[
                server_info("10.0.0.1:50051", "leader", age=2),
                server_info("10.0.0.2:50051", "follower", age=4, lag=1.5),
            ],
            leader="10.0.0.1:50051",
            term=7,
        )

    def CancelJob(self, request, context):
        self.cancels.append(request.id)
        if self.leader:
            context.set_trailing_metadata(((LEADER_METADATA, self.leader),))
            context.abort(grpc.StatusCode.UNAVAILABLE, "not the leader")
        return pb.CancelJobResponse(
            job=pb.Job(
                spec=pb.JobSpec(id=request.id), status=pb.JobStatus(phase=pb.JOB_PHASE_CANCELLED)
            )
        )


class Alone(pb_grpc.SchedulerServicer):
    """A server from before replication: no ListServers (UNIMPLEMENTED)."""

    def ListServers(self, request, context):
        # What grpc answers for a method the server does not have, without its error log.
        context.abort(grpc.StatusCode.UNIMPLEMENTED, "Method not found!")


def serve(servicer: pb_grpc.SchedulerServicer) -> tuple[grpc.Server, str]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    pb_grpc.add_SchedulerServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return server, f"127.0.0.1:{port}"


@pytest.fixture
def replicated() -> Iterator[str]:
    server, address = serve(Replicated())
    yield address
    server.stop(grace=None)


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_servers_json_lists_every_server_in_the_api_mapping(replicated, capsys):
    code, out, _ = run(capsys, "--server", replicated, "servers", "-o", "json")
    assert code == 0
    servers = json.loads(out)
    assert [(s["address"], s["role"], s["term"]) for s in servers] == [
        ("10.0.0.1:50051", "leader", "7"),  # uint64 as a string: protobuf's JSON mapping
        ("10.0.0.2:50051", "follower", "7"),
    ]
    assert servers[1]["lag_seconds"] == 1.5
    assert servers[0]["id"] == "id-10.0.0.1:50051"


def test_servers_table_has_role_term_renewal_age_and_lag(replicated, capsys):
    code, out, _ = run(capsys, "servers", "--server", replicated)
    assert code == 0
    lines = out.splitlines()
    assert "leader: 10.0.0.1:50051" in lines[0]
    assert "term: 7" in lines[0]
    rows = [cells(line) for line in lines[1:] if cells(line)]
    assert rows[0] == ["ADDRESS", "ROLE", "TERM", "LAST RENEWAL", "LAG"]
    assert rows[1][:3] == ["10.0.0.1:50051", "leader", "7"]
    assert rows[1][4] == "-"
    assert rows[2][:3] == ["10.0.0.2:50051", "follower", "7"]
    assert rows[2][4] == "1.5s"
    assert rows[1][3] in ("2s ago", "3s ago")
    assert rows[2][3] in ("4s ago", "5s ago")


def cells(line: str) -> list[str]:
    """A rich table line's cells (columns are two or more spaces or a rule apart)."""
    if set(line.strip()) <= set("━╇─┼ "):
        return []
    return [c.strip() for c in re.split(r"\s*[┃│]\s*|\s{2,}", line.strip()) if c.strip()]


def test_servers_from_a_server_without_replication_is_one_clear_line(capsys):
    server, address = serve(Alone())
    try:
        code, out, err = run(capsys, "--server", address, "servers")
    finally:
        server.stop(grace=None)
    assert code == 1
    assert out == ""
    assert len(err.strip().splitlines()) == 1
    assert "does not list servers" in err


def test_a_dead_address_in_the_list_is_passed_over(replicated, capsys):
    sock, dead = closed_port_address()
    with sock:
        code, out, _ = run(capsys, "--server", f"{dead},{replicated}", "servers", "-o", "json")
    assert code == 0
    assert len(json.loads(out)) == 2


def test_a_write_sent_to_a_follower_lands_on_the_leader(capsys):
    leader = Replicated()
    leader_server, leader_address = serve(leader)
    follower = Replicated(leader=leader_address)
    follower_server, follower_address = serve(follower)
    try:
        code, out, err = run(capsys, "--server", follower_address, "cancel", "a")
    finally:
        follower_server.stop(grace=None)
        leader_server.stop(grace=None)
    assert code == 0, err
    assert out.strip() == "a: Cancelled"
    assert follower.cancels == ["a"]
    assert leader.cancels == ["a"]


def test_an_empty_address_list_is_refused_naming_its_source(capsys, monkeypatch):
    with pytest.raises(SystemExit) as info:
        cli.main(["--server", " , ", "jobs"])
    assert info.value.code == 2
    assert "--server" in capsys.readouterr().err
    monkeypatch.setenv("MUSTER_SERVER", ",")
    code, _, err = run(capsys, "jobs")
    assert code == 2
    assert "MUSTER_SERVER" in err
    assert "no server address" in err


def test_servers_is_a_command_completion_knows():
    parser = cli.build_parser()
    assert parser._subparsers is not None
    commands = parser._subparsers._group_actions[0]
    assert "servers" in (commands.choices or {})


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    """cli.main configures the process's logging, as the command does; later tests get it back."""
    import structlog

    yield
    structlog.reset_defaults()
