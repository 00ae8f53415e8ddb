"""Where a cycle's CPU work runs: a worker process (the default) or a thread.

The scheduling core is pure Python and numpy. Run in a thread of the server process it shares the
GIL with the gRPC event loop, and every RPC waits behind it (bench/api_latency.py measured
seconds of stall). In a worker process only the snapshot's serialisation (in a helper thread) and
the result's are paid in the server process.

The worker is one long-lived child, ``python -m server.service.core_runner``, speaking length-prefixed
pickles over its stdin / stdout: ``(config or None, CaptureDelta, cycle id)`` in, ``("ok",
CycleResult)`` or ``("error", traceback)`` out. The worker keeps the cluster between cycles
(``snapshot.ResidentState``) and is sent only what changed since the previous cycle
(``snapshot.DeltaSender``), and the configuration only when it changed: the whole snapshot is never
pickled again after the first cycle. A worker that dies, or fails a cycle, is sent everything next
time (started again if needed); the scheduling core itself keeps nothing between cycles.

Once imported, the worker writes one frame, ``READY``, before it reads anything: a worker that
cannot be spawned, or dies or hangs before that (an import error, a broken interpreter), is
``CoreWorkerStartError`` ("scheduling worker process failed to start: ..."), not a cycle error.
"""

from __future__ import annotations

import os
import pickle
import struct
import sys
import traceback
from collections.abc import Callable
from dataclasses import replace
from typing import Any, BinaryIO, Literal

import anyio
from anyio.abc import Process

from server.config import SchedulerConfig
from server.model import CycleResult
from server.scheduler import SchedulerCore
from server.service.gctune import tune_gc
from server.service.snapshot import Capture, CaptureDelta, DeltaSender, ResidentState

CycleWorker = Literal["process", "thread"]
_HEADER = struct.Struct("!Q")
READY = b"muster-core-worker ready"


class CoreWorkerError(RuntimeError):
    """The worker process failed a cycle (its traceback is the message) or died."""


class CoreWorkerStartError(CoreWorkerError):
    """The worker process could not be spawned, or exited or hung before it was ready."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"scheduling worker process failed to start: {reason}")


def _dumps(obj: Any) -> bytes:
    return pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)


class CoreRunner:
    def __init__(self, worker: CycleWorker = "process") -> None:
        if worker not in ("process", "thread"):
            raise ValueError(f"cycle worker must be process or thread, not {worker!r}")
        self.worker = worker
        self._process: Process | None = None
        self._lock = anyio.Lock()
        self._sender = DeltaSender()
        self._sent_config: SchedulerConfig | None = None
        self.last_delta_size = 0  # nodes + jobs sent for the last cycle (what tests check)
        # The last cycle's result when it decided nothing: an unchanged cluster gets it again.
        self._quiet: CycleResult | None = None
        self.reused = 0  # cycles answered without the worker (nothing changed)

    async def run(
        self, core: SchedulerCore, captured: Capture, prepared: Callable[[], None] | None = None
    ) -> CycleResult:
        """One cycle of ``core`` on ``captured``; ``prepared`` is called once the input is ready
        (materialised, or encoded for the worker)."""
        if self.worker == "thread":
            snapshot = await anyio.to_thread.run_sync(captured.materialize)
            if prepared is not None:
                prepared()
            return await anyio.to_thread.run_sync(
                core.run_cycle, snapshot, captured.cycle_id, abandon_on_cancel=True
            )
        async with self._lock:
            if self._process is None or self._process.returncode is not None:
                self._forget()
            try:
                delta, config = await anyio.to_thread.run_sync(self._delta, core.config, captured)
                if (
                    delta.empty()
                    and config is None
                    and self._quiet is not None
                    and not core.config.reads_clock
                ):
                    # The worker would see what it saw last time and decide nothing again (a cycle
                    # is a function of the snapshot and the configuration).
                    if prepared is not None:
                        prepared()
                    self.reused += 1
                    return replace(self._quiet, cycle_id=captured.cycle_id)
                payload = await anyio.to_thread.run_sync(_dumps, (config, delta, captured.cycle_id))
                if prepared is not None:
                    prepared()
                reply = await self._exchange(payload)
            except BaseException:
                # Cancelled (shutdown) or broken pipe: the worker's state is unknown; start afresh.
                await self._kill()
                raise
            status, value = await anyio.to_thread.run_sync(pickle.loads, reply)
            if status != "ok":
                self._forget()  # what the worker holds is in doubt: everything again next cycle
                raise CoreWorkerError(str(value))
        result: CycleResult = value
        quiet = not (result.binds or result.evictions or result.pipelined or result.quarantined)
        self._quiet = replace(result, action_seconds={}, plugin_seconds={}) if quiet else None
        return result

    def _delta(
        self, config: SchedulerConfig, captured: Capture
    ) -> tuple[CaptureDelta, SchedulerConfig | None]:
        """What the worker has not seen: the cluster's changes, and the configuration if new."""
        delta = self._sender.delta(captured)
        self.last_delta_size = delta.size()
        sent = config if config is not self._sent_config else None
        self._sent_config = config
        return delta, sent

    def _forget(self) -> None:
        self._sender.reset()
        self._sent_config = None
        self._quiet = None

    async def start(self) -> None:
        """Start the worker process now (it imports the core, ~0.5 s of CPU) rather than at the
        first cycle, which would otherwise wait for it. Nothing for the thread worker."""
        if self.worker == "process":
            async with self._lock:
                await self._started()

    # The worker's command line, and how long it may take to import the core and say READY.
    command: tuple[str, ...] = (sys.executable, "-m", "server.service.core_runner")
    start_timeout = 60.0

    async def _started(self) -> Process:
        if self._process is None or self._process.returncode is not None:
            self._process = None
            self._process = await self._spawn()
        return self._process

    async def _spawn(self) -> Process:
        """A new worker that has said READY, or ``CoreWorkerStartError`` naming what failed."""
        try:
            proc = await anyio.open_process(
                list(self.command), stderr=None
            )  # its errors: our stderr
        except OSError as exc:
            raise CoreWorkerStartError(f"{self.command[0]}: {exc}") from exc
        try:
            with anyio.fail_after(self.start_timeout):
                header = await _receive_exactly(proc, _HEADER.size)
                (size,) = _HEADER.unpack(header)
                greeting = await _receive_exactly(proc, size) if size <= len(READY) else b""
            if greeting != READY:
                raise CoreWorkerStartError(f"it answered {greeting[:40]!r}, not its ready line")
        except BaseException as exc:
            with anyio.CancelScope(shield=True):
                if proc.returncode is None:
                    with anyio.move_on_after(1):
                        await proc.wait()  # it may be on its way out: get its exit code
                if proc.returncode is None:
                    proc.kill()
                    await proc.wait()
                await proc.aclose()
            if isinstance(exc, TimeoutError):
                raise CoreWorkerStartError(f"not ready after {self.start_timeout:g} s") from None
            if isinstance(exc, CoreWorkerError) and not isinstance(exc, CoreWorkerStartError):
                raise CoreWorkerStartError(
                    f"it exited with code {proc.returncode} before it was ready (its error, if any, "
                    "is on the server's stderr)"
                ) from None
            raise
        return proc

    async def _exchange(self, payload: bytes) -> bytes:
        proc = await self._started()
        assert proc.stdin is not None
        assert proc.stdout is not None
        await proc.stdin.send(_HEADER.pack(len(payload)) + payload)
        header = await _receive_exactly(proc, _HEADER.size)
        (size,) = _HEADER.unpack(header)
        return await _receive_exactly(proc, size)

    async def _kill(self) -> None:
        self._forget()
        proc, self._process = self._process, None
        if proc is None:
            return
        with anyio.CancelScope(shield=True):
            if proc.returncode is None:
                proc.kill()
            await proc.wait()
            await proc.aclose()

    async def aclose(self) -> None:
        """Stop the worker: end its input, then kill it if it does not exit promptly."""
        proc, self._process = self._process, None
        self._forget()  # a later start() is a new worker: it gets everything, config first
        if proc is None:
            return
        with anyio.CancelScope(shield=True):
            if proc.stdin is not None:
                await proc.stdin.aclose()
            with anyio.move_on_after(2):
                await proc.wait()
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
            await proc.aclose()


async def _receive_exactly(proc: Process, size: int) -> bytes:
    assert proc.stdout is not None
    chunks: list[bytes] = []
    left = size
    while left:
        try:
            chunk = await proc.stdout.receive(min(left, 1 << 20))
        except anyio.EndOfStream:
            raise CoreWorkerError(f"core worker exited (code {proc.returncode})") from None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _read_exactly(stream: BinaryIO, size: int) -> bytes | None:
    data = stream.read(size)
    if len(data) < size:
        return None
    return data


def serve(stdin: BinaryIO, stdout: BinaryIO) -> None:
    """The worker loop: one cycle per request until stdin closes."""
    state = ResidentState()
    config: SchedulerConfig | None = None
    while True:
        header = _read_exactly(stdin, _HEADER.size)
        if header is None:
            return
        (size,) = _HEADER.unpack(header)
        payload = _read_exactly(stdin, size)
        if payload is None:
            return
        try:
            sent, delta, cycle_id = pickle.loads(payload)
            assert isinstance(delta, CaptureDelta)
            if sent is not None:
                config = sent
            if config is None:
                raise CoreWorkerError("no configuration received")
            state.apply(delta)
            reply = _dumps(("ok", SchedulerCore(config).run_cycle(state.materialize(), cycle_id)))
        except Exception:  # noqa: BLE001 - reported to the server, which resends next cycle
            reply = _dumps(("error", traceback.format_exc()))
        stdout.write(_HEADER.pack(len(reply)) + reply)
        stdout.flush()


def main() -> None:
    tune_gc()  # a cycle allocates ~10 objects per task: full collections would dominate
    # The protocol owns the original stdout; anything the core prints or logs goes to stderr.
    protocol_out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    protocol_out.write(_HEADER.pack(len(READY)) + READY)  # imported: the server may send cycles
    protocol_out.flush()
    serve(sys.stdin.buffer, protocol_out)


if __name__ == "__main__":
    main()
