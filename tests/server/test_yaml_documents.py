"""YAML documents through the real server: configurations (UpdateConfig and ``--config`` hot
reload) and Simulate scenarios. A wrong type anywhere is INVALID_ARGUMENT naming the field, never
INTERNAL; an alias bomb is refused in milliseconds; a bad ``--config`` file written while the
server runs is logged and ignored, the server keeps its configuration and takes a good file after.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import anyio
import grpc
import pytest
import structlog
from conftest import server_options
from server_test_helpers import WAIT, next_cycle, rpc_error

from muster.v1 import muster_pb2 as pb
from muster.v1 import muster_pb2_grpc as pb_grpc
from server.service.app import ServerHandle, start_server

INVALID = grpc.StatusCode.INVALID_ARGUMENT


def alias_bomb(levels: int = 9, width: int = 9, prefix: str = "x-") -> tuple[str, str]:
    """The anchors of a "billion laughs" (width**levels strings, a few hundred bytes) as
    ``x-`` keys (ignored by the parsers), and the alias of the last one."""
    lines = [f"{prefix}0: &l0 [" + ", ".join(["lol"] * width) + "]"]
    lines += [
        f"{prefix}{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * width) + "]" for i in range(1, levels)
    ]
    return "\n".join(lines) + "\n", f"*l{levels - 1}"


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("profile: []", "config.profile: [] is not volcano or kai"),
        ("profile: {a: 1}", "config.profile: {'a': 1} is not volcano or kai"),
        (
            "configurations: [{name: preempt, arguments: -1}]",
            "config.configurations[0].arguments: must be a mapping",
        ),
        (
            "configurations: [{name: preempt, arguments: [x]}]",
            "config.configurations[0].arguments: must be a mapping",
        ),
    ],
)
async def test_update_config_with_a_wrong_type_is_invalid_naming_the_field(
    stub: pb_grpc.SchedulerStub, text: str, field: str
) -> None:
    before = await stub.GetConfig(pb.GetConfigRequest())
    err = await rpc_error(stub.UpdateConfig(pb.UpdateConfigRequest(yaml=text)))
    assert err.code() == INVALID
    assert field in (err.details() or "")
    assert await stub.GetConfig(pb.GetConfigRequest()) == before


@pytest.mark.parametrize(
    ("scenario", "field"),
    [
        (
            "nodes: [{name: n1}]\njobs: [{name: j, tasks: [{name: t, node: []}]}]",
            "jobs[0].tasks[0].node: must be a string",
        ),
        ("config: {profile: []}", "config.profile: [] is not volcano or kai"),
    ],
)
async def test_simulate_with_a_wrong_type_is_invalid_naming_the_field(
    stub: pb_grpc.SchedulerStub, scenario: str, field: str
) -> None:
    err = await rpc_error(stub.Simulate(pb.SimulateRequest(scenario=scenario)))
    assert err.code() == INVALID
    assert field in (err.details() or "")


async def test_simulate_cycles_are_bounded(stub: pb_grpc.SchedulerStub) -> None:
    err = await rpc_error(
        stub.Simulate(pb.SimulateRequest(scenario="nodes: [{name: n1}]", cycles=1001))
    )
    assert err.code() == INVALID
    assert "cycles: 1001 is not between 0 and 1000" in (err.details() or "")
    err = await rpc_error(
        stub.Simulate(pb.SimulateRequest(scenario="config: {cycles: 5000}\nnodes: [{name: n1}]"))
    )
    assert err.code() == INVALID
    assert "config.cycles: must be between 1 and 1000" in (err.details() or "")


async def test_a_large_update_config_does_not_hold_the_event_loop(
    stub: pb_grpc.SchedulerStub,
) -> None:
    """Parsing runs in a worker thread: the server's loop (this test's loop too: the server runs in
    process) keeps turning while a text that takes seconds to parse is checked."""
    text = "actions: enqueue\nx-padding: [" + ", ".join(["1"] * 150_000) + "]\n"
    update = asyncio.ensure_future(stub.UpdateConfig(pb.UpdateConfigRequest(yaml=text)))
    longest = 0.0
    turns = 0
    while not update.done() and turns < 400:
        started = time.perf_counter()
        await anyio.sleep(0.01)
        longest = max(longest, time.perf_counter() - started)
        turns += 1
    assert (await update).generation > 0
    assert turns > 10, "the update should take a while to parse"
    assert longest < 1.0, f"the loop stood still for {longest:.2f} s"


async def test_simulate_refuses_an_alias_bomb_quickly(stub: pb_grpc.SchedulerStub) -> None:
    anchors, alias = alias_bomb(prefix="x-")
    scenario = anchors + f"nodes: [{{name: n1, labels: {{a: b}}, x-more: {alias}}}]\n"
    assert len(scenario) < 600
    started = time.perf_counter()
    err = await rpc_error(stub.Simulate(pb.SimulateRequest(scenario=scenario)))
    assert time.perf_counter() - started < 1.0
    assert err.code() == INVALID
    assert "aliases expand to more than" in (err.details() or "")
    assert (await stub.GetConfig(pb.GetConfigRequest())).yaml  # still serving


async def test_update_config_refuses_an_alias_bomb_quickly_with_a_short_audit_line(
    stub: pb_grpc.SchedulerStub,
) -> None:
    anchors, alias = alias_bomb(prefix="x-")
    text = anchors + f"extension_points_not_listed: {alias}\n"
    assert len(text) < 600
    before = await stub.GetConfig(pb.GetConfigRequest())
    with structlog.testing.capture_logs() as logs:
        started = time.perf_counter()
        err = await rpc_error(stub.UpdateConfig(pb.UpdateConfigRequest(yaml=text)))
        elapsed = time.perf_counter() - started
    assert elapsed < 1.0
    assert err.code() == INVALID
    assert "aliases expand to more than" in (err.details() or "")
    audit = [
        entry
        for entry in logs
        if entry.get("event") == "audit" and entry.get("rpc") == "UpdateConfig"
    ]
    assert audit
    assert all(len(str(entry)) < 2000 for entry in audit)
    assert await stub.GetConfig(pb.GetConfigRequest()) == before


async def test_a_long_value_is_cut_in_the_error(stub: pb_grpc.SchedulerStub) -> None:
    """A value shared by aliases (under the bounds) is not spelled out in full in the answer."""
    text = (
        "x-a: &a ["
        + ", ".join(["y" * 100] * 500)
        + "]\nextension_points_not_listed: [*a, *a, *a, *a]\n"
    )
    err = await rpc_error(stub.UpdateConfig(pb.UpdateConfigRequest(yaml=text)))
    assert err.code() == INVALID
    assert "config.extension_points_not_listed:" in (err.details() or "")
    assert len(err.details() or "") < 500


GOOD = 'actions: "enqueue, allocate, backfill"\ntiers:\n- plugins:\n  - name: gang\n'
BETTER = 'actions: "enqueue, allocate"\ntiers:\n- plugins:\n  - name: gang\n'
BAD_FILES: list[str | bytes] = [
    "profile: []",
    "profile: {a: 1}",
    "configurations: [{name: preempt, arguments: -1}]",
    "configurations: [{name: preempt, arguments: [x]}]",
    "actions: [unclosed",
    alias_bomb()[0] + f"extension_points_not_listed: {alias_bomb()[1]}\n",
    b"\xff\xfe\x00 not text",
]


async def test_a_bad_config_file_while_running_keeps_the_old_config(tmp_path: Path) -> None:
    path = tmp_path / "scheduler.yaml"
    path.write_text(GOOD)
    handle: ServerHandle = await start_server(
        server_options(tmp_path, config_path=str(path), expire_interval=0.02)
    )
    try:
        async with grpc.aio.insecure_channel(handle.address) as channel:
            stub = pb_grpc.SchedulerStub(channel)
            before = await stub.GetConfig(pb.GetConfigRequest())
            assert before.yaml == GOOD
            with structlog.testing.capture_logs() as logs:
                for i, bad in enumerate(BAD_FILES, start=1):
                    if isinstance(bad, bytes):
                        path.write_bytes(bad)
                    else:
                        path.write_text(bad)
                    os.utime(path, (i, i))  # a new mtime, whatever the clock resolution
                    with anyio.fail_after(WAIT):
                        while sum(e.get("event") == "config.reload_failed" for e in logs) < i:
                            await anyio.sleep(0.02)
                    assert await stub.GetConfig(pb.GetConfigRequest()) == before
            failed = [e for e in logs if e.get("event") == "config.reload_failed"]
            assert [e["path"] for e in failed] == [str(path)] * len(BAD_FILES)
            assert "config.profile: [] is not volcano or kai" in failed[0]["error"]
            assert "aliases expand" in failed[5]["error"]
            assert "UnicodeDecodeError" in failed[6]["error"]
            assert handle.loop.core.config.actions == ["enqueue", "allocate", "backfill"]
            await next_cycle(handle)  # the loop still runs cycles
            path.write_text(BETTER)
            os.utime(path, (100, 100))
            with anyio.fail_after(WAIT):
                while (await stub.GetConfig(pb.GetConfigRequest())).yaml != BETTER:
                    await anyio.sleep(0.02)
            assert (await stub.GetConfig(pb.GetConfigRequest())).generation == before.generation + 1
            await next_cycle(handle)
            assert handle.loop.core.config.actions == ["enqueue", "allocate"]
    finally:
        await handle.stop()
